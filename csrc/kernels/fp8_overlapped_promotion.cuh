// A promoted FP8 mainloop whose promotions overlap the tensor cores' next k-tile.
//
// Hopper's FP8 WGMMA accumulates in fewer bits than fp32, so the promoted kernels sum each
// 128-deep block of K on the tensor cores into a partial-sum buffer and add that buffer into the
// fp32 accumulator ("promotion"). CUTLASS's promoted mainloop
// (MainloopSm90TmaGmmaWarpSpecializedFP8 with GmmaFP8Accumulation) waits for every WGMMA in
// flight before each promotion (warpgroup_wait<0>), so the warpgroup issues no tensor-core work
// while it drains the pipeline and adds: a bubble per k-tile. The FP8 GEMMs on that mainloop ran
// at 0.78-0.82 of cuBLASLt's promoted FP8 GEMMs (benchmarks/NOTES.md v0.19), against 0.98 for the
// unpromoted kernel.
//
// This mainloop keeps two partial-sum buffers. K-tile t's WGMMAs write one of them while the
// other, which holds k-tile t-1's sum, is added into the accumulator: the adds run while the
// tensor cores work on the next k-tile, and only the last k-tile's promotion waits. The arithmetic
// is CUTLASS's with promotion every k-tile (Fp8GemmParams's contract): each 128-deep block summed
// on the tensor cores from zero, then added in fp32 into an accumulator that starts at zero, in
// k order. It costs a third accumulator-sized register buffer, so it fits tiles whose consumer
// warpgroup holds 64x128 (3 x 64 registers per thread), not the 64x192 of configuration 4.
//
// The kernel (GemmUniversal, cooperative or ping-pong) default-constructs its CollectiveMainloop
// and calls mma() / mma_tail(); everything but mma() is the built CUTLASS collective's (Base).
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"

namespace cutlass_nn {
namespace kernels {

template <class Base>
struct Fp8OverlappedPromotionMma : Base {
  using typename Base::MainloopPipeline;
  using typename Base::Params;
  using typename Base::PipelineState;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::TensorStorage;
  using typename Base::TiledMma;

  // mma_tail() releases the last K_PIPE_MMAS stages; this mma() releases all the others.
  static_assert(Base::K_PIPE_MMAS == 1, "mma() leaves exactly one stage to mma_tail()");
  static_assert(cute::is_same_v<typename Base::DispatchPolicy,
                                cutlass::gemm::MainloopSm90TmaGmmaWarpSpecializedFP8<
                                    Base::DispatchPolicy::Stages,
                                    typename Base::DispatchPolicy::ClusterShape,
                                    typename Base::DispatchPolicy::Schedule>>,
                "Base must be CUTLASS's promoted FP8 mainloop");

  // WGMMAs per k-tile: mma() promotes once per k-tile, which is CUTLASS's arithmetic only with
  // the promotion interval equal to this (its default, 4 = 128 / 32).
  static constexpr int kMmasPerKTile =
      cute::size<2>(typename Base::TileShape{}) / TiledMma().template tile_size_mnk<2>();

  // Base's checks, and a promotion interval of one k-tile (a caller asking for another one would
  // otherwise get this mainloop's every-k-tile promotion silently).
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape,
                            typename Base::Arguments const& args) {
    return Base::can_implement(problem_shape, args) &&
           args.mma_promotion_interval == static_cast<uint32_t>(kMmasPerKTile);
  }

  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          TensorStorage& shared_tensors, Params const& mainloop_params) {
    using namespace cute;
    (void)mainloop_params;  // promotion every k-tile (can_implement() requires that interval)
    static_assert(is_rmem<FrgTensorC>::value, "the accumulator must be in registers");

    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});
    constexpr int kMmaWarpGroups = size(TiledMma{}) / cutlass::NumThreadsPerWarpGroup;
    auto warp_group_thread_layout =
        make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,PIPE)

    Tensor partial0 = make_fragment_like(accum);
    Tensor partial1 = make_fragment_like(accum);
    clear(accum);
    warpgroup_fence_operand(accum);

    PipelineState smem_pipe_release = smem_pipe_read;

    // Issues one k-tile's WGMMAs into `partial`, starting from zero (no clear needed).
    auto issue = [&](auto& partial) {
      auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int read_stage = smem_pipe_read.index();
      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage), tCrB(_, _, k_block, read_stage),
                   partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
      }
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
      ++smem_pipe_read;
    };
    // Adds a finished partial sum into the accumulator (fp32).
    auto promote = [&](auto& partial) {
      warpgroup_fence_operand(partial);
      warpgroup_fence_operand(accum);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
      warpgroup_fence_operand(accum);
    };
    // The previous k-tile's WGMMAs are done (at most the one just issued is in flight): its
    // shared-memory stage goes back to the producer (first, so that the next load starts before
    // the adds) and its partial sum into the accumulator.
    auto retire = [&](auto& previous) {
      warpgroup_wait<1>();
      pipeline.consumer_release(smem_pipe_release);
      ++smem_pipe_release;
      promote(previous);
    };

    if (k_tile_count <= 0) return;
    issue(partial0);
    --k_tile_count;
    // Two k-tiles per iteration, so that each buffer is named statically (registers cannot be
    // indexed at run time).
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count >= 2; k_tile_count -= 2) {
      issue(partial1);
      retire(partial0);
      issue(partial0);
      retire(partial1);
    }
    if (k_tile_count == 1) {
      issue(partial1);
      retire(partial0);
      warpgroup_wait<0>();
      promote(partial1);
    } else {
      warpgroup_wait<0>();
      promote(partial0);
    }
    // The last k-tile's stage is released by mma_tail().
  }
};

}  // namespace kernels
}  // namespace cutlass_nn
