// The prologue's query row (spec section 4: per-head RMSNorm, RoPE, bf16),
// one warp a 512-dim row, lane l dims 16l .. 16l + 15: prologue.cu's query
// rows and the decode kernels' fused start (FusedQuery, kernels.h) run the
// same instructions, so both give the same bits. Included by .cu files only.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_QUERY_DEVICE_CUH_
#define MLA_OFFLOAD_KERNELS_CUDA_QUERY_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

__device__ __forceinline__ void UnpackRow16(uint4 a, uint4 b, float (&x)[16]) {
  const uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = Bf16Bits(words[i] & 0xffffu);
    x[2 * i + 1] = Bf16Bits(words[i] >> 16);
  }
}

__device__ __forceinline__ void LoadRow16(const uint16_t* row, int lane, float (&x)[16]) {
  const uint4* src = reinterpret_cast<const uint4*>(row + lane * 16);
  UnpackRow16(src[0], src[1], x);
}

// A lane's 16 values as bf16, in two 16-byte pieces.
__device__ __forceinline__ void PackRow16(const float (&x)[16], uint4& a, uint4& b) {
  uint32_t w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) w[i] = PackBf16(x[2 * i], x[2 * i + 1]);
  a = make_uint4(w[0], w[1], w[2], w[3]);
  b = make_uint4(w[4], w[5], w[6], w[7]);
}

// Rotates this lane's 8 pairs (lanes 28..31 only) by table row `cos_sin`.
__device__ __forceinline__ void RopeLane(const float* cos_sin, int lane, float (&x)[16]) {
  if (lane < 28) return;
  const int pair0 = (lane - 28) * 8;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float a = x[2 * i];
    const float b = x[2 * i + 1];
    const float c = __ldg(cos_sin + pair0 + i);
    const float s = __ldg(cos_sin + kRopePairs + pair0 + i);
    x[2 * i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    x[2 * i + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

// RMSNorm of a query row (the warp's 512 values, 16 a lane), then RoPE.
__device__ __forceinline__ void NormRopeRow(const float* cos_sin, float eps, int lane,
                                            float (&x)[16]) {
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) squares = __fmaf_rn(x[i], x[i], squares);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  }
  const float inv_rms = 1.0f / sqrtf(squares / kHeadDim + eps);
#pragma unroll
  for (int i = 0; i < 16; ++i) x[i] *= inv_rms;
  RopeLane(cos_sin, lane, x);
}

// This lane's 32 bytes of query row h of token t (q [N, H, 512]); zero for
// a padding head (h >= num_heads), which reads nothing.
__device__ __forceinline__ void LoadQueryRow(const uint16_t* q, int64_t t, int h, int num_heads,
                                             int lane, uint4 (&raw)[2]) {
  raw[0] = raw[1] = make_uint4(0, 0, 0, 0);
  if (h >= num_heads) return;
  const uint4* src = reinterpret_cast<const uint4*>(q + (t * num_heads + h) * kHeadDim + lane * 16);
  raw[0] = __ldg(src);
  raw[1] = __ldg(src + 1);
}

// The loaded row as the prologue's q_out: normalised, rotated and rounded,
// or zero for a padding head (the whole warp agrees on `real`).
__device__ __forceinline__ void FinishQueryRow(const uint4 (&raw)[2], bool real,
                                               const float* cos_sin, float eps, int lane,
                                               uint4 (&out)[2]) {
  if (!real) {
    out[0] = out[1] = make_uint4(0, 0, 0, 0);
    return;
  }
  float x[16];
  UnpackRow16(raw[0], raw[1], x);
  NormRopeRow(cos_sin, eps, lane, x);
  PackRow16(x, out[0], out[1]);
}

}  // namespace
}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_QUERY_DEVICE_CUH_
