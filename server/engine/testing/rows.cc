#include "server/engine/testing/rows.h"

#include <algorithm>

#include "kernels/geometry.h"

namespace mla::engine_testing {

uint64_t Mix(uint64_t a, uint64_t b) { return Random(a ^ (b * 0xd1342543de82ef95ull)).Next(); }

std::vector<uint16_t> Rows(uint64_t seed, int64_t count) {
  Random rng(seed);
  std::vector<uint16_t> rows(count * kHeadDim);
  for (int64_t tile = 0; tile < count * (kHeadDim / kQuantTile); ++tile) {
    const uint64_t tile_bits = rng.Next();
    const int tile_exponent =
        tile_bits % 20 == 0 ? -20 : -7 + static_cast<int>((tile_bits >> 8) % 8);
    for (int i = 0; i < kQuantTile; ++i) {
      const uint64_t bits = rng.Next();
      int exponent = tile_exponent + static_cast<int>(bits & 3) - 2;
      if ((bits >> 2) % 100 == 0) exponent -= 12;
      const uint16_t mantissa = static_cast<uint16_t>((bits >> 16) & 0x7f);
      const uint16_t sign = static_cast<uint16_t>((bits >> 30) & 1);
      rows[tile * kQuantTile + i] =
          static_cast<uint16_t>(sign << 15 | (exponent + 127) << 7 | mantissa);
    }
  }
  return rows;
}

std::vector<float> RandomSinks(uint64_t seed, int64_t count) {
  Random rng(seed);
  std::vector<float> sinks(count);
  for (float& sink : sinks) {
    sink = rng.Chance(0.125) ? -kInf : static_cast<float>(rng.Uniform(-300, 1000)) / 100.0f;
  }
  return sinks;
}

wire::TensorView Tensor(wire::DType dtype, std::vector<int64_t> shape, const void* data,
                        size_t bytes, uint64_t seed) {
  wire::TensorView tensor;
  tensor.dtype = dtype;
  tensor.shape = std::move(shape);
  const uint8_t* base = static_cast<const uint8_t*>(data);
  Random rng(seed);
  size_t a = static_cast<size_t>(rng.Uniform(0, static_cast<int64_t>(bytes)));
  size_t b = static_cast<size_t>(rng.Uniform(0, static_cast<int64_t>(bytes)));
  if (a > b) std::swap(a, b);
  for (const wire::Piece piece :
       {wire::Piece(base, a), wire::Piece(base + a, b - a), wire::Piece(base + b, bytes - b)}) {
    if (!piece.empty()) tensor.pieces.push_back(piece);
  }
  return tensor;
}

}  // namespace mla::engine_testing
