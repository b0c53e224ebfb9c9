// Shared by the heavy family headers (gemm_sm90.cuh, gemm_sm80.cuh, gemm_fallback.cuh):
// the generic launch<Tag>() body, which forwards to KernelImpl<Tag> (partially specialized per
// family), plus dtype/layout type maps and the CUTLASS call sequence used by both CUTLASS families.
#pragma once

#include <cuda_runtime.h>

#include "cutlass/bfloat16.h"
#include "cutlass/cutlass.h"
#include "cutlass/half.h"
#include "cutlass/layout/matrix.h"
#include "gemm_registry.h"

namespace cutlass_nn {
namespace kernels {

template <class Tag>
struct KernelImpl;  // specialized per family

template <class Tag>
GemmStatus launch(const GemmParams& params, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream, const char** detail, size_t* workspace_query) {
  return KernelImpl<Tag>::launch(params, workspace, workspace_bytes, stream, detail,
                                 workspace_query);
}

namespace detail {

template <DType T>
struct CutlassElement;
template <>
struct CutlassElement<DType::kFloat16> {
  using type = cutlass::half_t;
};
template <>
struct CutlassElement<DType::kBFloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct CutlassElement<DType::kFloat32> {
  using type = float;
};
template <>
struct CutlassElement<DType::kFloat64> {
  using type = double;
};
template <DType T>
using element_t = typename CutlassElement<T>::type;

template <Layout L>
using layout_t = typename std::conditional<L == Layout::kRowMajor, cutlass::layout::RowMajor,
                                           cutlass::layout::ColumnMajor>::type;

inline GemmStatus fail(GemmStatus status, const char** detail, const char* what) {
  if (detail != nullptr) *detail = what;
  return status;
}

// The CUTLASS call order shared by the 2.x (GemmUniversal) and 3.x (GemmUniversalAdapter)
// device operators: can_implement -> workspace (provided by the caller) -> initialize -> run ->
// cudaGetLastError.
template <class Gemm>
GemmStatus run_cutlass(typename Gemm::Arguments const& args, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream, const char** detail,
                       size_t* workspace_query) {
  if (workspace_query != nullptr) {
    *workspace_query = Gemm::get_workspace_size(args);
    return GemmStatus::kSuccess;
  }
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) {
    return fail(GemmStatus::kCannotImplement, detail,
                "CUTLASS can_implement() rejected the problem (sizes, strides or alignment)");
  }
  size_t needed = Gemm::get_workspace_size(args);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return fail(GemmStatus::kWorkspaceTooSmall, detail,
                "workspace smaller than gemm_workspace_size()");
  }
  Gemm gemm;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) {
    return fail(GemmStatus::kInitializeFailed, detail, "CUTLASS initialize() failed");
  }
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    return fail(GemmStatus::kRunFailed, detail, "CUTLASS run() failed");
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return fail(GemmStatus::kLaunchFailed, detail,
                "cudaGetLastError() after the CUTLASS kernel launch was not cudaSuccess");
  }
  return GemmStatus::kSuccess;
}

}  // namespace detail
}  // namespace kernels
}  // namespace cutlass_nn
