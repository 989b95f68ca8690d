#include "kernels/cache_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/bf16.h"
#include "kernels/fp8_e4m3.h"

namespace mla {
namespace {

// Decoded value of every e4m3 code: dequantisation is a table look-up.
struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int code = 0; code < 256; ++code) value[code] = E4m3ToFloat(static_cast<uint8_t>(code));
  }
};

const E4m3Table& DecodeTable() {
  static const E4m3Table table;
  return table;
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
  const float* decode = DecodeTable().value;
  for (int tile = 0; tile < kNopeTiles; ++tile) {
    const float scale = std::ldexp(1.0f, static_cast<int>(scales[tile]) - 127);
    for (int i = 0; i < kQuantTile; ++i) {
      row[tile * kQuantTile + i] = decode[data[tile * kQuantTile + i]] * scale;
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    const uint16_t bits = static_cast<uint16_t>(data[kNopeDim + 2 * i] |
                                                (data[kNopeDim + 2 * i + 1] << 8));
    row[kNopeDim + i] = Bf16ToFloat(bits);
  }
}

}  // namespace mla
