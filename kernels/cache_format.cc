#include "kernels/cache_format.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/fp8_e4m3.h"

namespace mla {
namespace {

// Eight e4m3 codes (the low 8 bytes of `codes`) decoded to floats: the
// code's bits shifted into a float's bit positions (sign to bit 31, the 4
// exponent and 3 mantissa bits to bits 20..26) form a float whose value is
// exactly the e4m3 value times 2^-120, normals and subnormals alike; times
// 2^120 (exact) it is the value. Code 0x7f or 0xff is the NaN 0x7fc00000.
inline __m256 DecodeE4m3x8(__m128i codes) {
  const __m256i wide = _mm256_cvtepu8_epi32(codes);
  const __m256i magnitude = _mm256_and_si256(wide, _mm256_set1_epi32(0x7f));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(wide, _mm256_set1_epi32(0x80)), 24);
  const __m256i bits = _mm256_or_si256(sign, _mm256_slli_epi32(magnitude, 20));
  const __m256i nan = _mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7f));
  const __m256i value = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x7fc00000), nan);
  return _mm256_mul_ps(_mm256_castsi256_ps(value), _mm256_set1_ps(0x1p120f));
}

// FloatToE4m3 (kernels/fp8_e4m3.h) of eight floats, as 32-bit codes, with the
// same cases in the same order of precedence: NaN -> sign | 0x7f; magnitude
// >= 448 -> sign | 0x7e; below 2^-6, the subnormal step 2^-9 rounded to
// nearest even; else the 23-bit mantissa rounded to 3 bits (nearest even),
// the carry moving into the exponent, capped at 0x7e. No clamp to +-448 is
// needed before it: the encoding saturates the same way.
inline __m256i EncodeE4m3x8(__m256 values) {
  const __m256i bits = _mm256_castps_si256(values);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
  const __m256i magnitude_bits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256 magnitude = _mm256_castsi256_ps(magnitude_bits);
  const __m256i nan = _mm256_cmpgt_epi32(magnitude_bits, _mm256_set1_epi32(0x7f800000));
  const __m256i saturated = _mm256_castps_si256(
      _mm256_cmp_ps(magnitude, _mm256_set1_ps(kE4m3Max), _CMP_GE_OQ));
  const __m256i subnormal = _mm256_castps_si256(
      _mm256_cmp_ps(magnitude, _mm256_set1_ps(0.015625f), _CMP_LT_OQ));
  // Scaling by 512 is exact; rounding to an integer is to nearest even.
  const __m256i subnormal_code = _mm256_cvtps_epi32(_mm256_round_ps(
      _mm256_mul_ps(magnitude, _mm256_set1_ps(512.0f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(magnitude_bits, 20), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_add_epi32(_mm256_add_epi32(magnitude_bits, _mm256_set1_epi32(0x7ffff)), lsb);
  // (biased exponent - 127 + 7) << 3 | mantissa = (rounded >> 20) - (120 << 3).
  const __m256i normal_code = _mm256_min_epi32(
      _mm256_sub_epi32(_mm256_srli_epi32(rounded, 20), _mm256_set1_epi32(120 << 3)),
      _mm256_set1_epi32(0x7e));
  __m256i code = _mm256_blendv_epi8(normal_code, subnormal_code, subnormal);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7e), saturated);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), nan);
  return _mm256_or_si256(code, sign);
}

// The largest |value| of a block of `count` (a multiple of 8), NaNs left
// out (as std::max(amax, |v|) from 0 leaves them out: a NaN never compares
// greater). The order of the comparisons does not matter: the result is
// the largest of a set.
inline float BlockAmax(const float* values, int count) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < count; i += 8) {
    // maxps(a, b) is a > b ? a : b: with a = |v|, a NaN yields b.
    amax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(values + i), abs_mask), amax);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float result = 0.0f;
  for (float lane : lanes) result = std::max(result, lane);
  return result;
}

// 2^(byte - 127); byte 0 is the subnormal 2^-127.
float ScaleOfByte(uint8_t byte) {
  return byte != 0 ? __builtin_bit_cast(float, uint32_t{byte} << 23) : std::ldexp(1.0f, -127);
}

}  // namespace

int TileScaleExponent(float amax) {
  return CeilLog2FromBits(std::max(amax, 1e-4f) / kE4m3Max);
}

uint8_t QuantizeBlock(const float* values, int count, uint8_t* codes) {
  const int exponent = TileScaleExponent(BlockAmax(values, count));
  const __m256 inverse_scale = _mm256_set1_ps(std::ldexp(1.0f, -exponent));
  for (int i = 0; i < count; i += 32) {
    __m256i words[4];
    for (int j = 0; j < 4; ++j) {
      words[j] = EncodeE4m3x8(_mm256_mul_ps(_mm256_loadu_ps(values + i + 8 * j), inverse_scale));
    }
    // Four vectors of 32-bit codes (all in 0..255) into 32 bytes in order:
    // the packs interleave 128-bit lanes, the permute puts them back.
    const __m256i words01 = _mm256_packus_epi32(words[0], words[1]);
    const __m256i words23 = _mm256_packus_epi32(words[2], words[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(words01, words23),
                                                      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), bytes);
  }
  return static_cast<uint8_t>(std::clamp(exponent + 127, 0, 255));
}

void QuantizeRow(const float* row, uint8_t* data, uint8_t* scales) {
  for (int tile = 0; tile < kNopeTiles; ++tile) {
    scales[tile] =
        QuantizeBlock(row + tile * kQuantTile, kQuantTile, data + tile * kQuantTile);
  }
  scales[kNopeTiles] = 0;
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits = FloatToBf16(row[kNopeDim + i]);
    data[kNopeDim + 2 * i] = static_cast<uint8_t>(bits & 0xff);
    data[kNopeDim + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
  }
}

void DequantizeRow(const uint8_t* data, const uint8_t* scales, float* row) {
  for (int tile = 0; tile < kNopeTiles; ++tile) {
    const __m256 scale = _mm256_set1_ps(ScaleOfByte(scales[tile]));
    for (int i = 0; i < kQuantTile; i += 8) {
      uint64_t codes;
      std::memcpy(&codes, data + tile * kQuantTile + i, sizeof(codes));
      const __m256 values = DecodeE4m3x8(_mm_cvtsi64_si128(static_cast<int64_t>(codes)));
      _mm256_storeu_ps(row + tile * kQuantTile + i, _mm256_mul_ps(values, scale));
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits = static_cast<uint16_t>(data[kNopeDim + 2 * i] |
                                                (data[kNopeDim + 2 * i + 1] << 8));
    row[kNopeDim + i] = Bf16ToFloat(bits);
  }
}

}  // namespace mla
