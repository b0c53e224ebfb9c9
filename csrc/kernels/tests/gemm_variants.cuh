// Experimental SM90 GEMM variants for scripts/gemm_variant_ab.sh: tile / cluster / schedule /
// epilogue-tile combinations that the library does not build, timed against cuBLAS and against
// the library's own configurations at chosen problem shapes, before any of them becomes a
// configuration of gemm_sm90.cuh. Torch-free; bfloat16 operands and output, fp32 accumulation,
// D = A @ B (no bias, beta = 0), A row-major and B column-major ("tn", the forward), both
// row-major ("nn", the dgrad), or A column-major and B row-major ("nt", the weight gradient).
//
// One translation unit per variant (the script writes a two-line .cu that defines
// CUTLASS_NN_VARIANT and includes this header with CUTLASS_NN_VARIANT_UNIT set), so the variants
// compile in parallel; gemm_variant_timing.cu (which includes this header without
// CUTLASS_NN_VARIANT_UNIT) holds main and the cuBLAS reference. Each unit registers itself in
// variant_registry() from a static initializer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace cutlass_nn {
namespace variants {

// One GEMM problem: D[m, n] = A[m, k] @ B[k, n]; A row-major and B column-major (tn) unless
// b_row_major (nn: B row-major; nt: B row-major and a_col_major, A column-major).
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  bool b_row_major = false;
  bool a_col_major = false;
};

// One of the rotating operand sets a problem is timed on (so that operands come from memory,
// not from the L2 of the previous launch).
struct OperandSet {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
};

// A problem prepared for one variant: kernel parameters per operand set, built beforehand, so
// that a timed launch is only the launch.
class Prepared {
 public:
  virtual ~Prepared() = default;
  virtual bool launch(int set, cudaStream_t stream) = 0;
};

// raster: 0 CUTLASS's heuristic, 1 along M, 2 along N; swizzle: the scheduler's max swizzle.
using PrepareFn = std::function<std::unique_ptr<Prepared>(
    const Problem&, const std::vector<OperandSet>&, int raster, int swizzle, int sms,
    cudaStream_t stream, std::string* why)>;

struct Variant {
  std::string name;
  PrepareFn prepare;
};

inline std::vector<Variant>& variant_registry() {
  static std::vector<Variant> registry;
  return registry;
}

}  // namespace variants
}  // namespace cutlass_nn

#if defined(CUTLASS_NN_VARIANT_UNIT)
#include "../gemm_sm90.cuh"

namespace cutlass_nn {
namespace variants {

using kernels::Sm90TileConfig;

// A tile configuration in gemm_sm90.cuh's form (what Sm90Gemm reads from it).
template <int TileM, int TileN, int TileK, int ClusterM, int ClusterN, bool PingPong>
struct VariantConfig {
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Int<TileK>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::Int<ClusterN>, cute::_1>;
  using KernelSchedule =
      std::conditional_t<PingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = std::conditional_t<PingPong, cutlass::epilogue::TmaWarpSpecialized,
                                              cutlass::epilogue::TmaWarpSpecializedCooperative>;
  using TileScheduler = cutlass::gemm::PersistentScheduler;
};
// The same with an explicit epilogue tile (CUTLASS's automatic one otherwise).
template <int TileM, int TileN, int TileK, int ClusterM, int ClusterN, bool PingPong, int EpiM,
          int EpiN>
struct VariantConfigWithEpilogueTile
    : VariantConfig<TileM, TileN, TileK, ClusterM, ClusterN, PingPong> {
  using EpilogueTile = cute::Shape<cute::Int<EpiM>, cute::Int<EpiN>>;
};

// A configuration whose epilogue has no C operand (ElementC = void, a plain linear combination
// with beta = 0): no C stages in shared memory, and CUTLASS then delays each TMA store's wait to
// the next subtile's (DelayTmaStore). The library's kernels all take a C operand (bias, beta = 1
// accumulation), which turns the delay off even where beta = 0.
template <class Base>
struct WithoutC : Base {
  static constexpr bool kVoidC = true;
};

// A configuration on CUTLASS's stream-K tile scheduler (the library's StreamKScheduler tag,
// stream_k_scheduler.cuh), decomposition forced to stream-K: the tiles of the last two waves
// (all of them below two waves) are split along K over every SM, their partial sums reduced
// through the workspace (zeroed before every launch, as the library does). CUTLASS 4.2's
// heuristic decomposition would keep both head GEMMs data-parallel (it takes stream-K only
// where the last wave is less than half full: 128 of 132 and 76 of 132 tiles are not).
template <class Base>
struct WithStreamK : Base {
  using TileScheduler = kernels::StreamKScheduler;
};

// A configuration with CUTLASS's epilogue without shared memory (NoSmemWarpSpecialized): the
// accumulators are written from registers straight to global memory, no TMA store and no C/D
// staging, so the shared memory the epilogue held goes to mainloop stages. For the large GEMMs
// at the power limit, where config 0 runs level with cuBLAS and a few more stages or a lighter
// epilogue may be what is left.
template <class Base>
struct WithNoSmemEpilogue : Base {
  using EpilogueSchedule = cutlass::epilogue::NoSmemWarpSpecialized;
};

// Sm90Gemm's mainloop with the epilogue of WithoutC: D = alpha * acc, bf16.
template <class LayoutA, class LayoutB, class Cfg>
struct Sm90GemmWithoutC {
  using ElementAB = cutlass::bfloat16_t;
  using TileShape = typename Cfg::TileShape;
  using ClusterShape = typename Cfg::ClusterShape;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      typename kernels::EpilogueTileOf<Cfg>::type, float, float, void,
      cutlass::layout::RowMajor, 8, ElementAB, cutlass::layout::RowMajor, 8,
      typename Cfg::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementAB, float, void, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, LayoutA, 8,
      ElementAB, LayoutB, 8, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Cfg::KernelSchedule>::CollectiveOp;
  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop,
                                           CollectiveEpilogue, typename Cfg::TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  static typename Gemm::Arguments make_arguments(const kernels::GemmParams& p) {
    using cute::_1;
    typename GemmKernel::StrideA stride_a;
    if constexpr (std::is_same<LayoutA, cutlass::layout::RowMajor>::value) {
      stride_a = cute::make_stride(p.lda, _1{}, int64_t(0));
    } else {
      stride_a = cute::make_stride(_1{}, p.lda, int64_t(0));
    }
    typename GemmKernel::StrideB stride_b;
    if constexpr (std::is_same<LayoutB, cutlass::layout::ColumnMajor>::value) {
      stride_b = cute::make_stride(p.ldb, _1{}, int64_t(0));
    } else {
      stride_b = cute::make_stride(_1{}, p.ldb, int64_t(0));
    }
    typename GemmKernel::StrideC stride_c{};
    typename GemmKernel::StrideD stride_d = cute::make_stride(p.ldd, _1{}, int64_t(0));
    cutlass::KernelHardwareInfo hw_info;
    cudaGetDevice(&hw_info.device_id);
    hw_info.sm_count = p.multiprocessors;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1},
        {static_cast<const ElementAB*>(p.a), stride_a, static_cast<const ElementAB*>(p.b),
         stride_b},
        {{}, nullptr, stride_c, static_cast<ElementAB*>(p.d), stride_d},
        hw_info};
    args.epilogue.thread.alpha = p.alpha;
    args.epilogue.thread.beta = 0.0f;
    if (p.swizzle > 0) args.scheduler.max_swizzle_size = p.swizzle;
    return args;
  }
};

template <class Cfg, class = void>
struct VoidCOf : std::false_type {};
template <class Cfg>
struct VoidCOf<Cfg, std::void_t<decltype(Cfg::kVoidC)>> : std::bool_constant<Cfg::kVoidC> {};

template <class Cfg, class LayoutA, class LayoutB>
using VariantOp = std::conditional_t<
    VoidCOf<Cfg>::value, Sm90GemmWithoutC<LayoutA, LayoutB, Cfg>,
    kernels::Sm90Gemm<cutlass::bfloat16_t, cutlass::bfloat16_t, LayoutA, LayoutB, Cfg,
                      kernels::EpilogueKind::kLinComb, kernels::Activation::kIdentity>>;

template <class Cfg, class LayoutA, class LayoutB>
class PreparedSm90 final : public Prepared {
  using Op = VariantOp<Cfg, LayoutA, LayoutB>;
  static constexpr bool kStreamK =
      std::is_same<typename Cfg::TileScheduler, kernels::StreamKScheduler>::value;
  using Gemm = typename Op::Gemm;

 public:
  ~PreparedSm90() override {
    if (workspace_ != nullptr) cudaFree(workspace_);
  }

  bool init(const Problem& pr, const std::vector<OperandSet>& sets, int raster, int swizzle,
            int sms, cudaStream_t stream, std::string* why) {
    std::vector<typename Gemm::Arguments> args;
    size_t workspace = 0;
    for (const OperandSet& s : sets) {
      kernels::GemmParams p;
      p.m = pr.m;
      p.n = pr.n;
      p.k = pr.k;
      p.a = s.a;
      p.lda = pr.a_col_major ? pr.m : pr.k;
      p.layout_a = pr.a_col_major ? kernels::Layout::kColumnMajor : kernels::Layout::kRowMajor;
      p.b = s.b;
      p.ldb = pr.b_row_major ? pr.n : pr.k;
      p.layout_b = pr.b_row_major ? kernels::Layout::kRowMajor : kernels::Layout::kColumnMajor;
      p.c = s.d;  // beta = 0: C is not read, but its TMA descriptor needs valid memory
      p.ldc = pr.n;
      p.d = s.d;
      p.ldd = pr.n;
      p.dtype_ab = p.dtype_cd = kernels::DType::kBFloat16;
      p.sm = 90;
      p.multiprocessors = sms;
      p.swizzle = swizzle;
      typename Gemm::Arguments a = Op::make_arguments(p);
      if constexpr (kStreamK) {
        a.scheduler.decomposition_mode =
            cutlass::gemm::kernel::detail::DecompositionMode::StreamK;
      }
      using Raster = decltype(a.scheduler.raster_order);
      a.scheduler.raster_order =
          raster == 1 ? Raster::AlongM : raster == 2 ? Raster::AlongN : Raster::Heuristic;
      if (Gemm::can_implement(a) != cutlass::Status::kSuccess) {
        *why = "can_implement() rejected the problem";
        return false;
      }
      workspace = std::max(workspace, Gemm::get_workspace_size(a));
      args.push_back(a);
    }
    if (workspace > 0 && cudaMalloc(&workspace_, workspace) != cudaSuccess) {
      *why = "workspace allocation failed";
      return false;
    }
    // The first run goes through initialize() and run(), which set the kernel's attributes
    // (dynamic shared memory, cluster size); the timed launches then use launch_sm90 as the
    // library does.
    Gemm gemm;
    if (gemm.initialize(args[0], workspace_, stream) != cutlass::Status::kSuccess ||
        gemm.run(stream) != cutlass::Status::kSuccess) {
      *why = "initialize() / run() failed";
      return false;
    }
    for (auto& a : args) {
      using Kernel = typename Gemm::GemmKernel;
      if (Kernel::initialize_workspace(a, workspace_, stream, nullptr) !=
          cutlass::Status::kSuccess) {
        *why = "initialize_workspace() failed";
        return false;
      }
      params_.push_back(Kernel::to_underlying_arguments(a, workspace_));
    }
    args_ = std::move(args);
    return true;
  }

  bool launch(int set, cudaStream_t stream) override {
    // The stream-K reduction's flags count arrivals: they are zeroed before every launch (a
    // memset on the stream, timed with the kernel, as in the library's launches).
    if constexpr (kStreamK) {
      if (Gemm::GemmKernel::initialize_workspace(args_[set], workspace_, stream, nullptr) !=
          cutlass::Status::kSuccess) {
        return false;
      }
    }
    return kernels::detail::launch_sm90<Gemm>(params_[set], stream, /*pdl=*/false) ==
           cutlass::Status::kSuccess;
  }

 private:
  std::vector<typename Gemm::Arguments> args_;
  std::vector<typename Gemm::Params> params_;
  void* workspace_ = nullptr;
};

template <class Cfg>
bool register_variant(const char* name) {
  variant_registry().push_back(Variant{
      name, [](const Problem& pr, const std::vector<OperandSet>& sets, int raster, int swizzle,
               int sms, cudaStream_t stream, std::string* why) -> std::unique_ptr<Prepared> {
        using cutlass::layout::ColumnMajor;
        using cutlass::layout::RowMajor;
        std::unique_ptr<Prepared> out;
        auto prepare = [&](auto prepared) {
          if (prepared->init(pr, sets, raster, swizzle, sms, stream, why)) {
            out = std::move(prepared);
          }
        };
        if (pr.a_col_major) {
          prepare(std::make_unique<PreparedSm90<Cfg, ColumnMajor, RowMajor>>());
        } else if (pr.b_row_major) {
          prepare(std::make_unique<PreparedSm90<Cfg, RowMajor, RowMajor>>());
        } else {
          prepare(std::make_unique<PreparedSm90<Cfg, RowMajor, ColumnMajor>>());
        }
        return out;
      }});
  return true;
}

}  // namespace variants
}  // namespace cutlass_nn

// The variants (CUTLASS_NN_VARIANT selects one per unit; scripts/gemm_variant_ab.sh builds
// all of them unless told otherwise). c0 / c3 / c14: the library's configurations 0, 3 and 14
// as built (the reference points); 3-10 change one thing of theirs each.
namespace cutlass_nn {
namespace variants {
namespace {
using AllConfigs = std::tuple<
    kernels::Sm90TileConfig<0>,                                          // 0
    kernels::Sm90TileConfig<3>,                                          // 1
    kernels::Sm90TileConfig<14>,                                         // 2
    VariantConfig<256, 128, 64, 2, 1, false>,                            // 3
    VariantConfig<256, 128, 64, 1, 1, false>,                            // 4
    VariantConfigWithEpilogueTile<256, 128, 64, 1, 2, false, 128, 64>,  // 5
    VariantConfig<128, 256, 64, 1, 2, false>,                            // 6
    VariantConfig<128, 128, 64, 2, 1, true>,                             // 7
    VariantConfig<128, 128, 64, 1, 1, true>,                             // 8
    VariantConfig<128, 128, 64, 1, 2, false>,                            // 9
    VariantConfigWithEpilogueTile<128, 128, 64, 1, 2, true, 64, 64>,    // 10
    // 11, 12: cuBLAS's tile for the 4096 x 2816 x 1024 forward on an H100 (nvjet 176x128 64x5
    // 1x2, its M being our N): 16 x 32 = 512 tiles, 3.9 waves of 132, where 128-wide tiles make
    // 5.3. The epilogue tile must divide 176. A 176-wide WGMMA is one of CUTE's extended shapes
    // (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, which scripts/gemm_variant_ab.sh defines); without
    // it CUTLASS's builder falls back to 64x16 WGMMAs, which re-read the A tile 11 times per
    // k-block and ran at half of cuBLAS's speed (benchmarks/NOTES.md, thirty-third session).
    VariantConfigWithEpilogueTile<128, 176, 64, 2, 1, true, 64, 16>,    // 11
    VariantConfigWithEpilogueTile<128, 176, 64, 2, 1, false, 128, 16>,  // 12
    // 13-15: the same tile without a cluster, with the cluster along N, and twice as tall
    // (256x176 cooperative: 16 x 16 = 256 tiles, 1.9 waves of 132).
    VariantConfigWithEpilogueTile<128, 176, 64, 1, 1, true, 64, 16>,    // 13
    VariantConfigWithEpilogueTile<128, 176, 64, 1, 2, true, 64, 16>,    // 14
    VariantConfigWithEpilogueTile<256, 176, 64, 2, 1, false, 128, 16>,  // 15
    // 16, 17: 128-deep k-blocks on the 128x128 ping-pong tile (config 15 / config 3): half the
    // pipeline's barrier round trips per tile on a K = 1024 mainloop (8 k-blocks instead of 16),
    // 64 KiB per stage (3 stages).
    VariantConfig<128, 128, 128, 1, 1, true>,                            // 16
    VariantConfig<128, 128, 128, 1, 2, true>,                            // 17
    // 18-20: configs 3, 15 and 0 without a C operand (WithoutC: delayed TMA-store waits, no C
    // stages in shared memory).
    WithoutC<kernels::Sm90TileConfig<3>>,                                // 18
    WithoutC<kernels::Sm90TileConfig<15>>,                               // 19
    WithoutC<kernels::Sm90TileConfig<0>>,                                // 20
    // 21-23: the 176-wide ping-pong tile with 64x176 epilogue subtiles (2 per tile where 64x16
    // ones make 11 per 64 rows; CUTLASS takes only widths that are multiples of 16, so 16 and 176
    // are the two that divide 176), without C, with C, and without C or a cluster. The epilogue
    // fragment (88 floats beside the 176 accumulators) spills: 422 bytes, -Xptxas -v.
    WithoutC<VariantConfigWithEpilogueTile<128, 176, 64, 2, 1, true, 64, 176>>,  // 21
    VariantConfigWithEpilogueTile<128, 176, 64, 2, 1, true, 64, 176>,            // 22
    WithoutC<VariantConfigWithEpilogueTile<128, 176, 64, 1, 1, true, 64, 176>>,  // 23
    // 24-27: the large tiles on the stream-K scheduler, for the language-model head's dgrad
    // (4096 x 1024 x 32000: 128 tiles of 128x256 on 132 SMs, each over 500 k-blocks) and weight
    // gradient (32000 x 1024 x 4096: 1000 tiles, 7.6 waves), where cuBLAS runs 5% ahead: the
    // last partial wave's K spread over every SM. Config 0 with and without its cluster, config
    // 14, and config 0 without C.
    WithStreamK<kernels::Sm90TileConfig<0>>,                             // 24
    WithStreamK<VariantConfig<128, 256, 64, 1, 1, false>>,               // 25
    WithStreamK<kernels::Sm90TileConfig<14>>,                            // 26
    WithoutC<WithStreamK<kernels::Sm90TileConfig<0>>>,                   // 27
    // 28-32: small tiles with deep pipelines for the 512-token problems of 8-15 us where cuBLAS
    // runs 1-3 us ahead (issue 13's shape set): the library's 64x128 ping-pong tile (config 13)
    // and its 64x64x128 one (config 11) for reference, a 64x64x64 ping-pong tile (16 KiB stages,
    // as many as fit: about twice config 11's), and configs 13 and the 64x64x64 tile without C.
    kernels::Sm90TileConfig<13>,                                         // 28
    kernels::Sm90TileConfig<11>,                                         // 29
    VariantConfig<64, 64, 64, 1, 1, true>,                               // 30
    WithoutC<VariantConfig<64, 64, 64, 1, 1, true>>,                     // 31
    WithoutC<kernels::Sm90TileConfig<13>>,                               // 32
    // 33, 34: configs 0 and 3 without C, with the epilogue without shared memory.
    WithoutC<WithNoSmemEpilogue<kernels::Sm90TileConfig<0>>>,            // 33
    WithoutC<WithNoSmemEpilogue<kernels::Sm90TileConfig<3>>>>;           // 34
constexpr const char* kLabels[] = {
    "c0 128x256 2x1 coop",        "c3 128x128 1x2 pingpong",      "c14 256x128 1x2 coop",
    "256x128 2x1 coop",           "256x128 1x1 coop",             "256x128 1x2 coop epi128x64",
    "128x256 1x2 coop",           "128x128 2x1 pingpong",         "128x128 1x1 pingpong",
    "128x128 1x2 coop",           "128x128 1x2 pingpong epi64x64",
    "128x176 2x1 pingpong epi64x16", "128x176 2x1 coop epi128x16",
    "128x176 1x1 pingpong epi64x16", "128x176 1x2 pingpong epi64x16",
    "256x176 2x1 coop epi128x16",
    "128x128x128 1x1 pingpong",    "128x128x128 1x2 pingpong",
    "c3 without C",                "c15 without C",                "c0 without C",
    "128x176 2x1 pingpong epi64x176 without C", "128x176 2x1 pingpong epi64x176",
    "128x176 1x1 pingpong epi64x176 without C",
    "c0 stream-K",                 "128x256 1x1 coop stream-K",    "c14 stream-K",
    "c0 stream-K without C",
    "c13 64x128 pingpong",         "c11 64x64x128 pingpong",       "64x64x64 1x1 pingpong",
    "64x64x64 1x1 pingpong without C", "c13 without C",
    "c0 without C, no-smem epilogue", "c3 without C, no-smem epilogue"};
static_assert(std::size(kLabels) == std::tuple_size_v<AllConfigs>, "one label per variant");
static_assert(CUTLASS_NN_VARIANT >= 0 && CUTLASS_NN_VARIANT < std::tuple_size_v<AllConfigs>,
              "gemm_variants.cuh: CUTLASS_NN_VARIANT names no variant");
const bool kUnitRegistered =
    register_variant<std::tuple_element_t<CUTLASS_NN_VARIANT, AllConfigs>>(
        kLabels[CUTLASS_NN_VARIANT]);
}  // namespace
}  // namespace variants
}  // namespace cutlass_nn
#endif  // CUTLASS_NN_VARIANT_UNIT
