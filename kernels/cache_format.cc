#include "kernels/cache_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/fp8_e4m3.h"

namespace mla {
namespace {

// The e4m3 bits shifted into a float's bit positions (sign to bit 31, the
// 4 exponent and 3 mantissa bits to bits 20..26) form a float whose value is
// exactly the e4m3 value times 2^-120, normals and subnormals alike. Integer
// operations and one compare only, so the loop that calls it vectorises.
inline float DecodeE4m3(uint8_t code) {
  const uint32_t magnitude = code & 0x7fu;
  const uint32_t bits = magnitude == 0x7fu ? 0x7fc00000u  // NaN
                                           : (code & 0x80u) << 24 | magnitude << 20;
  return __builtin_bit_cast(float, bits) * 0x1p120f;
}

// 2^(byte - 127); byte 0 is the subnormal 2^-127.
float ScaleOfByte(uint8_t byte) {
  return byte != 0 ? __builtin_bit_cast(float, uint32_t{byte} << 23) : std::ldexp(1.0f, -127);
}

}  // namespace

int TileScaleExponent(float amax) {
  return CeilLog2FromBits(std::max(amax, 1e-4f) / kE4m3Max);
}

void QuantizeRow(const float* row, uint8_t* data, uint8_t* scales) {
  for (int tile = 0; tile < kNopeTiles; ++tile) {
    const float* values = row + tile * kQuantTile;
    float amax = 0.0f;
    for (int i = 0; i < kQuantTile; ++i) amax = std::max(amax, std::fabs(values[i]));
    const int exponent = TileScaleExponent(amax);
    const float inverse_scale = std::ldexp(1.0f, -exponent);
    for (int i = 0; i < kQuantTile; ++i) {
      const float scaled = std::clamp(values[i] * inverse_scale, -kE4m3Max, kE4m3Max);
      data[tile * kQuantTile + i] = FloatToE4m3(scaled);
    }
    scales[tile] = static_cast<uint8_t>(std::clamp(exponent + 127, 0, 255));
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
    const float scale = ScaleOfByte(scales[tile]);
    for (int i = 0; i < kQuantTile; ++i) {
      row[tile * kQuantTile + i] = DecodeE4m3(data[tile * kQuantTile + i]) * scale;
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits = static_cast<uint16_t>(data[kNopeDim + 2 * i] |
                                                (data[kNopeDim + 2 * i + 1] << 8));
    row[kNopeDim + i] = Bf16ToFloat(bits);
  }
}

}  // namespace mla
