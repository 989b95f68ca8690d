#include "tests/support/test_rows.h"

#include <cmath>
#include <random>

#include "kernels/bf16.h"
#include "kernels/geometry.h"

namespace mla {

std::vector<uint16_t> TestRows(uint64_t seed, int64_t count) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> rows(count * kHeadDim);
  for (int64_t tile = 0; tile < count * (kHeadDim / kQuantTile); ++tile) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 5) - 3);
    for (int i = 0; i < kQuantTile; ++i) {
      float value = normal(rng) * scale;
      if (FloatToBf16(value) == 0 || FloatToBf16(value) == 0x8000) value = 1e-3f;
      rows[tile * kQuantTile + i] = FloatToBf16(value);
    }
  }
  return rows;
}

}  // namespace mla
