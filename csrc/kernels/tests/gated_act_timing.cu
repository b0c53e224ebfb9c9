// Torch-free timing of the gated-activation kernels (gated_act.h) at one problem size, for A/B
// comparisons of kernel versions: link it with one version of gated_act.cu per binary
// (scripts/gated_kernel_ab.sh builds and runs several side by side).
//
//   gated_act_timing <rows> <n> [reps]
//
// bfloat16, SiLU. Prints one line: the median CUDA-event microseconds of `reps` launches of the
// forward and of the backward (with the recomputed forward output, as the gated MLP calls it),
// each after 10 warm-up launches (one launch per pair of events: launch gaps included; the
// backward out of place), and the achieved bandwidth of each as a fraction of that of a
// device-to-device copy moving the backward's bytes (timed the same way).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../gated_act.h"
#include "timing_common.cuh"

namespace {

template <typename F> float median_us(F&& launch, int reps) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 10; ++i) launch();
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(start));
    launch();
    CHECK_CUDA(cudaEventRecord(stop));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0f);
  }
  std::sort(times.begin(), times.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <rows> <n> [reps]\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]);
  const int64_t n = std::atoll(argv[2]);
  const int reps = argc > 3 ? std::atoi(argv[3]) : 200;
  if (rows < 1 || n < 1 || reps < 1) {
    std::fprintf(stderr, "rows, n and reps must be positive\n");
    return 2;
  }
  using cutlass_nn::kernels::Activation;
  using cutlass_nn::kernels::DType;
  const size_t elem = sizeof(__nv_bfloat16);
  __nv_bfloat16 *gate_up, *out, *grad_out, *grad_gate_up, *out2, *copy_src, *copy_dst;
  CHECK_CUDA(cudaMalloc(&gate_up, rows * 2 * n * elem));
  CHECK_CUDA(cudaMalloc(&out, rows * n * elem));
  CHECK_CUDA(cudaMalloc(&grad_out, rows * n * elem));
  CHECK_CUDA(cudaMalloc(&grad_gate_up, rows * 2 * n * elem));
  CHECK_CUDA(cudaMalloc(&out2, rows * n * elem));
  cutlass_nn::timing::fill_bf16(gate_up, rows * 2 * n, 1u, 8.0f);
  cutlass_nn::timing::fill_bf16(grad_out, rows * n, 2u, 8.0f);

  const float fwd = median_us([&] {
    CHECK_CUDA(cutlass_nn::kernels::launch_gated_act_forward(DType::kBFloat16, Activation::kSilu,
                                                             gate_up, out, rows, n, 0, nullptr));
  }, reps);
  const float bwd = median_us([&] {
    CHECK_CUDA(cutlass_nn::kernels::launch_gated_act_backward(
        DType::kBFloat16, Activation::kSilu, grad_out, gate_up, grad_gate_up, out2, rows, n, 0,
        nullptr));
  }, reps);
  // bytes moved: forward reads [rows, 2n], writes [rows, n]; backward reads [rows, n] +
  // [rows, 2n], writes [rows, 2n] + [rows, n]
  const double fwd_bytes = 3.0 * rows * n * elem, bwd_bytes = 6.0 * rows * n * elem;
  const size_t half = static_cast<size_t>(bwd_bytes / 2);
  CHECK_CUDA(cudaMalloc(&copy_src, half));
  CHECK_CUDA(cudaMalloc(&copy_dst, half));
  const float copy = median_us([&] {
    CHECK_CUDA(cudaMemcpyAsync(copy_dst, copy_src, half, cudaMemcpyDeviceToDevice, nullptr));
  }, reps);
  const double copy_gbs = 2.0 * half / (copy * 1e3);
  const double fwd_gbs = fwd_bytes / (fwd * 1e3), bwd_gbs = bwd_bytes / (bwd * 1e3);
  std::printf("rows %lld n %lld: forward %.1f us (%.0f GB/s, %.3f of copy), backward %.1f us "
              "(%.0f GB/s, %.3f of copy), copy %.0f GB/s\n",
              static_cast<long long>(rows), static_cast<long long>(n), fwd, fwd_gbs,
              fwd_gbs / copy_gbs, bwd, bwd_gbs, bwd_gbs / copy_gbs, copy_gbs);
  return 0;
}
