// Dtype helpers shared by the torch-free elementwise kernels (elementwise.cu, activation.cu,
// rms_norm.cu, cross_entropy.cu, gated_act.cu):
//
//  * AccType<T> / Acc<T>: the accumulation / compute type of a storage type,
//  * to_acc / from_acc:   conversion to it and (round-to-nearest-even) back,
//  * Pack16<T>:           kN elements of T in one 16-byte vector (one 128-bit load / store),
//  * load_vec / store_vec: kV consecutive elements to / from accumulation-type registers.
//
// Both files vectorize the same way and must round the same way (activation.cu's backward sums
// the rounded grad_z values like elementwise.cu's column sums do), so they share one copy rather
// than two that could drift apart. Device code: include from .cu files only (nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cutlass_nn {
namespace kernels {

// Accumulation / compute type: float for the 16-bit types and float32, double for float64.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using Acc = typename AccType<T>::type;

template <typename T> __device__ __forceinline__ typename AccType<T>::type to_acc(T v) {
  return static_cast<typename AccType<T>::type>(v);
}
template <> __device__ __forceinline__ float to_acc<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_acc<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// Round-to-nearest-even conversion from the accumulation type to the storage type.
template <typename T, typename A> __device__ __forceinline__ T from_acc(A v) {
  return static_cast<T>(v);
}
template <> __device__ __forceinline__ __half from_acc<__half, float>(float v) {
  return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float v) {
  return __float2bfloat16_rn(v);
}

// N elements of T packed in 16 bytes. The alignas makes the compiler emit one 128-bit
// LDG/STG per pack (checked in the SASS: LDG.E.128 / STG.E.128).
template <typename T> struct alignas(16) Pack16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

// kV consecutive elements of `p` as accumulation-type values: one 16-byte load when kV is the
// pack width of U, element loads otherwise (the scalar path, and a float weight beside 16-bit
// activations).
template <typename U, int kV, typename A>
__device__ __forceinline__ void load_vec(const U* __restrict__ p, A (&v)[kV]) {
  if constexpr (kV > 1 && kV == Pack16<U>::kN) {
    const Pack16<U> pk = *reinterpret_cast<const Pack16<U>*>(p);
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = static_cast<A>(to_acc(pk.v[k]));
  } else {
#pragma unroll
    for (int k = 0; k < kV; ++k) v[k] = static_cast<A>(to_acc(p[k]));
  }
}

// The inverse: each value rounded once to T, one 16-byte store when kV is the pack width of T.
template <typename T, int kV, typename A>
__device__ __forceinline__ void store_vec(T* __restrict__ p, const A (&v)[kV]) {
  if constexpr (kV > 1 && kV == Pack16<T>::kN) {
    Pack16<T> pk;
#pragma unroll
    for (int k = 0; k < kV; ++k) pk.v[k] = from_acc<T>(v[k]);
    *reinterpret_cast<Pack16<T>*>(p) = pk;
  } else {
#pragma unroll
    for (int k = 0; k < kV; ++k) p[k] = from_acc<T>(v[k]);
  }
}

}  // namespace kernels
}  // namespace cutlass_nn
