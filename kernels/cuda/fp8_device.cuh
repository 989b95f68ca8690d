// FP8 e4m3 block quantisation on the device, the rule of spec section 3
// (the cache's 64-dim tiles) and section 5 (the FP8 output's 128-dim
// blocks): e = the smallest integer with 2^e >= max(amax, 1e-4) / 448, from
// the IEEE bits; values * 2^-e clamped to +-448 and rounded to nearest even;
// scale byte clamp(e + 127, 0, 255). Included by .cu files only.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_FP8_DEVICE_CUH_
#define MLA_OFFLOAD_KERNELS_CUDA_FP8_DEVICE_CUH_

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mla {
namespace cuda {
namespace {

// The block's scale exponent e for its largest magnitude amax.
__device__ __forceinline__ int BlockScaleExponent(float amax) {
  const float quotient = fmaxf(amax, 1e-4f) / 448.0f;
  const uint32_t bits = __float_as_uint(quotient);
  return static_cast<int>((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0 ? 1 : 0);
}

// 2^-e, exact (e lies in -22 .. 120 for a finite amax >= 1e-4).
__device__ __forceinline__ float InverseBlockScale(int e) {
  return __uint_as_float(static_cast<uint32_t>(127 - e) << 23);
}

__device__ __forceinline__ uint8_t BlockScaleByte(int e) {
  return static_cast<uint8_t>(min(max(e + 127, 0), 255));
}

// Two values times inv_scale as e4m3, `lo` in the low byte.
__device__ __forceinline__ uint32_t E4m3Pair(float lo, float hi, float inv_scale) {
  lo = fminf(fmaxf(lo * inv_scale, -448.0f), 448.0f);
  hi = fminf(fmaxf(hi * inv_scale, -448.0f), 448.0f);
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

}  // namespace
}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_FP8_DEVICE_CUH_
