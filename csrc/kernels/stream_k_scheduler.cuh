// The SM90 stream-K tile scheduler under the project's own tag, with an is_last_tile() that
// compiles.
//
// The cooperative SM90 kernel, compiled with CUTLASS_ENABLE_GDC_FOR_SM90 (for the PDL launches,
// launch_settings.h), asks its tile scheduler is_last_tile() to signal its dependent grid at the
// start of the last tile. CUTLASS 4.2's stream-K scheduler implements it as a const member
// function that passes the member unit_iter_start_ to get_current_work_for_linear_idx(), which
// takes it by non-const reference: the kernel then fails to compile. Our scheduler is CUTLASS's,
// with is_last_tile() answered on a copy of the scheduler (the question must not move the
// scheduler's own state): the copy advances to the next work unit and reports whether there is
// one. The tile configurations name StreamKScheduler below instead of CUTLASS's tag; the
// selector specialization maps it to this class for SM90.
#pragma once

#include <cstdint>

#include "cutlass/gemm/kernel/tile_scheduler.hpp"

namespace cutlass_nn {
namespace kernels {

// A configuration's TileScheduler tag: CUTLASS's SM90 stream-K scheduler with the is_last_tile()
// below (same work decomposition, same arguments: splits, decomposition_mode, max_swizzle_size).
struct StreamKScheduler {};

template <class TileShape, class ClusterShape>
class StreamKTileScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape,
                                                                               ClusterShape> {
  using Base =
      cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape>;

 public:
  using Base::Base;
  using WorkTileInfo = typename Base::WorkTileInfo;

  // Whether work_tile_info is the last unit of work this CTA gets (as CUTLASS defines it: no
  // further output tile in this unit, and no unit advance_count steps ahead).
  CUTLASS_DEVICE
  bool is_last_tile(WorkTileInfo work_tile_info, uint32_t advance_count = 1) const {
    if (this->continue_current_work(work_tile_info)) {  // on a copy: it advances its argument
      return false;
    }
    Base next = *this;
    next.advance_to_next_work(advance_count);
    return !next.get_current_work().is_valid();
  }
};

}  // namespace kernels
}  // namespace cutlass_nn

namespace cutlass::gemm::kernel::detail {

template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<cutlass_nn::kernels::StreamKScheduler, arch::Sm90, TileShape,
                             ClusterShape, SchedulerPipelineStageCount> {
  using Scheduler = cutlass_nn::kernels::StreamKTileScheduler<TileShape, ClusterShape>;
};

}  // namespace cutlass::gemm::kernel::detail
