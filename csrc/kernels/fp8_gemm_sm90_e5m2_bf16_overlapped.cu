// FP8 GEMM kernels of fp8_gemm_sm90.cuh, a few per translation unit so that they compile in
// parallel (the table in fp8_gemm_dispatch.cu lists them): the configurations on the mainloop
// with overlapped promotion (fp8_overlapped_promotion.cuh).
#if defined(CUTLASS_NN_HAS_SM90)
#include "fp8_gemm_sm90.cuh"

namespace cutlass_nn {
namespace kernels {

template GemmStatus fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 5>(
    const Fp8GemmParams&, void*, size_t, cudaStream_t, const char**, size_t*);
template GemmStatus fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 6>(
    const Fp8GemmParams&, void*, size_t, cudaStream_t, const char**, size_t*);
template GemmStatus fp8_gemm_launch<Fp8Format::kE5M2, DType::kBFloat16, 7>(
    const Fp8GemmParams&, void*, size_t, cudaStream_t, const char**, size_t*);

}  // namespace kernels
}  // namespace cutlass_nn

#endif  // CUTLASS_NN_HAS_SM90
