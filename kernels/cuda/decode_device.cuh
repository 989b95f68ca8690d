// Device helpers shared by the decode kernels (decode.cu, decode_wgmma.cu,
// decode_narrow.cu): the e4m3 -> bf16 conversions, key-list lengths, sinks,
// the final scaling of an output pair, the FP8 output's places and the split
// partials (the bf16 rounding and FP8 quantisation themselves are
// bf16_device.cuh's and fp8_device.cuh's). Included by .cu files only.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_DECODE_DEVICE_CUH_
#define MLA_OFFLOAD_KERNELS_CUDA_DECODE_DEVICE_CUH_

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/fp8_device.cuh"
#include "kernels/geometry.h"

namespace mla {
namespace cuda {
namespace {

constexpr int kMaxSplits = 32;

// The bf16 bits of a value that is exactly representable in bf16.
__device__ __forceinline__ uint32_t ExactBf16Bits(float value) { return __float_as_uint(value) >> 16; }

// e4m3 code -> float (exact): the code's bits placed in a float, times 2^120.
__device__ __forceinline__ float E4m3(uint32_t code) {
  const uint32_t bits = (code & 0x80u) << 24 | (code & 0x7fu) << 20;
  return __uint_as_float(bits) * 0x1p120f;
}

// Four e4m3 codes (one 32-bit word, code i in byte i) times 2^(s - 127) as
// four bf16 values: codes 0, 1 in `lo`, codes 2, 3 in `hi` (low half first).
// Each code's bits are moved into a bf16's (sign to bit 15, exponent and
// mantissa shifted so that the value is the e4m3 value times 2^-120, also for
// subnormal codes), then one bf16x2 multiply by 2^(s - 7) applies the bias
// difference and the block scale. Exact wherever the fp32 path is (products
// of 4 significant bits above 2^-133) for 3 <= s <= 134: 2^(s - 7) is a
// normal bf16 and no product falls below bf16's smallest subnormal
// (FastScaleOk); other scales take the fp32 path.
__device__ __forceinline__ uint32_t E4m3PairToScaledBits(uint32_t spread) {
  return (spread & 0x80008000u) | ((spread >> 4) & 0x07f007f0u);
}

__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ bool FastScaleOk(uint32_t scale_byte) {
  return scale_byte >= 3u && scale_byte <= 134u;
}

// bf16x2 of 2^(s - 7) in both halves, for FastScaleOk(s).
__device__ __forceinline__ uint32_t FastScaleWord(uint32_t scale_byte) {
  const uint32_t half = (scale_byte + 120u) << 7;
  return half | half << 16;
}

__device__ __forceinline__ void E4m3x4ToBf16(uint32_t codes, uint32_t scale_word, uint32_t& lo,
                                             uint32_t& hi) {
  lo = MulBf16x2(E4m3PairToScaledBits(__byte_perm(codes, 0u, 0x1404u)), scale_word);
  hi = MulBf16x2(E4m3PairToScaledBits(__byte_perm(codes, 0u, 0x3424u)), scale_word);
}

__device__ __forceinline__ float ScaleOfByte(uint32_t byte) {
  return byte != 0 ? __uint_as_float(byte << 23) : 0x1p-127f;
}

// 16 e4m3 codes (one 16-byte piece of a cache row) times `scale` as 16 bf16
// values, two a word (low half first), through fp32: exact for every scale.
__device__ __forceinline__ void DequantisePieceFp32(uint4 raw, float scale, uint32_t (&out)[8]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t w = words[q];
    out[2 * q] = ExactBf16Bits(E4m3(w & 0xffu) * scale) |
                 ExactBf16Bits(E4m3((w >> 8) & 0xffu) * scale) << 16;
    out[2 * q + 1] = ExactBf16Bits(E4m3((w >> 16) & 0xffu) * scale) |
                     ExactBf16Bits(E4m3(w >> 24) * scale) << 16;
  }
}

// The same for the scale byte `scale_byte`, by the bf16x2 path where that
// is exact (FastScaleOk), else through fp32. A zero piece gives +0 values
// whatever the scale.
__device__ __forceinline__ void DequantisePiece(uint4 raw, uint32_t scale_byte, uint32_t (&out)[8]) {
  if (FastScaleOk(scale_byte)) {
    const uint32_t scale_word = FastScaleWord(scale_byte);
    E4m3x4ToBf16(raw.x, scale_word, out[0], out[1]);
    E4m3x4ToBf16(raw.y, scale_word, out[2], out[3]);
    E4m3x4ToBf16(raw.z, scale_word, out[4], out[5]);
    E4m3x4ToBf16(raw.w, scale_word, out[6], out[7]);
  } else {
    DequantisePieceFp32(raw, ScaleOfByte(scale_byte), out);
  }
}

__device__ __forceinline__ int ListLength(const KeyListParams& list, int64_t t) {
  if (list.width == 0) return 0;
  return list.lengths == nullptr ? list.width : __ldg(list.lengths + t);
}

__device__ __forceinline__ float SinkOf(const DecodeParams& p, int64_t t, int h) {
  if (p.sinks == nullptr) return -INFINITY;
  return p.sinks_per_token ? __ldg(p.sinks + t * p.num_heads + h) : __ldg(p.sinks + h);
}

// What the end of a row (token t, head h) needs once, from the unnormalised
// softmax state (m, l): the factor 1 / (l (1 + exp(sink - lse))) that
// normalises o with the sink (0 for an empty row) and lse (+inf when empty).
struct RowEnd {
  float factor;
  float lse;
};
__device__ __forceinline__ RowEnd EndOfRow(const DecodeParams& p, int64_t t, int h, float m,
                                           float l) {
  if (!(l > 0.0f)) return RowEnd{0.0f, INFINITY};
  const float lse = m + logf(l);
  return RowEnd{1.0f / (l * (1.0f + expf(SinkOf(p, t, h) - lse))), lse};
}

// The RoPE row (cos [32], then sin [32]) that de-rotates token t's output,
// or nullptr when the output is not de-rotated.
__device__ __forceinline__ const float* DerotationOf(const DecodeParams& p, int64_t t) {
  return p.derotate ? p.rope.data + int64_t{__ldg(p.positions + t)} * kRopeDim : nullptr;
}

// Dims (2w, 2w+1) of a row scaled by the row's factor and de-rotated when
// cos_sin is given and they are RoPE dims, in fp32: what either output
// format rounds. Loads nothing but cos_sin: callers hoist the per-row and
// per-token reads (EndOfRow, DerotationOf) out of their loops over dims.
__device__ __forceinline__ float2 FinishedValues(int w, float factor, const float* cos_sin,
                                                 float o0, float o1) {
  // factor 0: an empty row (or a sink that outweighs it), written as +0
  // whatever o holds (and not rotated: cos < 0 would make it -0).
  o0 = factor == 0.0f ? 0.0f : o0 * factor;
  o1 = factor == 0.0f ? 0.0f : o1 * factor;
  if (factor != 0.0f && cos_sin != nullptr && w >= kNopeDim / 2) {
    const int pair = w - kNopeDim / 2;
    const float c = __ldg(cos_sin + pair);
    const float s = -__ldg(cos_sin + kRopePairs + pair);
    const float a = o0;
    const float b = o1;
    o0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    o1 = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
  return make_float2(o0, o1);
}

// FinishedValues as two bf16 (2w in the low half).
__device__ __forceinline__ uint32_t FinishedPair(int w, float factor, const float* cos_sin,
                                                 float o0, float o1) {
  const float2 v = FinishedValues(w, factor, cos_sin, o0, o1);
  return PackBf16(v.x, v.y);
}

// The FP8 output (DecodeParams::out_e4m3, spec section 5) rather than bf16.
__device__ __forceinline__ bool Fp8Output(const DecodeParams& p) { return p.out_e4m3 != nullptr; }

// The largest magnitude of v over the `lanes` lanes (a power of two) of a
// warp that share a block, lanes 1, 2, 4, .. apart.
template <int kLanes>
__device__ __forceinline__ float LanesMax(float v) {
#pragma unroll
  for (int apart = 1; apart < kLanes; apart *= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, apart));
  }
  return v;
}

// Head h of token t as FP8: its e4m3 row and its four scale bytes.
__device__ __forceinline__ uint8_t* E4m3Row(const DecodeParams& p, int64_t t, int h) {
  return p.out_e4m3 + (t * p.num_heads + h) * kHeadDim;
}
__device__ __forceinline__ uint8_t* ScaleBytes(const DecodeParams& p, int64_t t, int h) {
  return p.out_scales + (t * p.num_heads + h) * kOutputQuantBlocks;
}

// FinishedPair stored as dims (2w, 2w+1) of head h of token t.
__device__ __forceinline__ void StorePair(const DecodeParams& p, int64_t t, int h, int w,
                                          float factor, const float* cos_sin, float o0,
                                          float o1) {
  uint32_t* out = reinterpret_cast<uint32_t*>(p.out + (t * p.num_heads + h) * kHeadDim);
  out[w] = FinishedPair(w, factor, cos_sin, o0, o1);
}

__device__ __forceinline__ void StoreLse(const DecodeParams& p, int64_t t, int h, float lse) {
  if (p.lse != nullptr) p.lse[t * p.num_heads + h] = lse;
}

// Final scaling, sink, de-rotation and bf16 rounding of dims (2w, 2w+1) of
// head h of token t, from the unnormalised o and the softmax state (m, l),
// for kernels that finish one pair of a row per thread (bf16 only).
__device__ __forceinline__ void Finish(const DecodeParams& p, int64_t t, int h, int w, float m,
                                       float l, float o0, float o1) {
  const RowEnd end = EndOfRow(p, t, h, m, l);
  StorePair(p, t, h, w, end.factor, DerotationOf(p, t), o0, o1);
  if (w == 0) StoreLse(p, t, h, end.lse);
}

// Partial results of one split: o [splits][512] fp32 and (m, l) per
// (token, padded head, split). Every decode kernel writes them through
// Store and StoreState; the combine kernel reads them back.
struct Partials {
  float* o;   // [N, Hp, splits, 512]
  float* ml;  // [N, Hp, splits, 2]

  // The index of (token t, padded head h, split) in both arrays.
  __device__ __forceinline__ static int64_t Item(const DecodeParams& p, int64_t t, int h,
                                                 int splits, int split) {
    return (t * p.padded_heads + h) * splits + split;
  }
  // Unnormalised dims (2w, 2w+1) of an item.
  __device__ __forceinline__ void Store(int64_t item, int w, float o0, float o1) const {
    reinterpret_cast<float2*>(o + item * kHeadDim)[w] = make_float2(o0, o1);
  }
  // The item's softmax state: running max m and sum l.
  __device__ __forceinline__ void StoreState(int64_t item, float m, float l) const {
    ml[2 * item] = m;
    ml[2 * item + 1] = l;
  }
};

}  // namespace
}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_DECODE_DEVICE_CUH_
