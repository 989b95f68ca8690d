// Deterministic test data for the engine's tests: a seeded generator, bf16
// KV and query rows, sink logits, and tensors over host vectors cut into
// pieces the way a parsed message's are. Every value is a pure function of
// its seed, so a test can build the same row again at any time. Not
// thread-safe (Random); the free functions are.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_ROWS_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "proto/views.h"

namespace mla::engine_testing {

inline constexpr float kInf = std::numeric_limits<float>::infinity();
inline constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
inline constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();

class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull) {}

  uint64_t Next() {  // SplitMix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  int64_t Uniform(int64_t low, int64_t high) {
    return low + static_cast<int64_t>(Next() % static_cast<uint64_t>(high - low + 1));
  }
  bool Chance(double p) { return static_cast<double>(Next() >> 11) * 0x1.0p-53 < p; }

 private:
  uint64_t state_;
};

// A seed made of two.
uint64_t Mix(uint64_t a, uint64_t b);

// `count` rows of 512 bf16 values, none zero. Each 64-wide tile has its own
// scale between 2^-7 and 2^0 (one tile in twenty 2^-20, below the 1e-4 floor
// of the cache's tile scale); values spread over 2^-2..2^1 of it and one in a
// hundred is 2^-12 of it, so that e4m3 subnormals and negative zeros occur.
// Keys of this size give logits of spread about 1: the softmax weighs many
// keys, so that a single wrong, missing or extra key shows in out and lse.
std::vector<uint16_t> Rows(uint64_t seed, int64_t count);

// `count` sink logits around the lse of the random data (about 5 for 130
// keys), so that sinks matter; one in eight is -inf (no sink).
std::vector<float> RandomSinks(uint64_t seed, int64_t count);

// A tensor over `bytes` of `data`, cut into up to three pieces at arbitrary
// byte offsets (odd ones included), so that copies out of it cross piece
// boundaries. Like a parsed message's, no piece is empty. The data must
// outlive the tensor.
wire::TensorView Tensor(wire::DType dtype, std::vector<int64_t> shape, const void* data,
                        size_t bytes, uint64_t seed);

template <typename T>
wire::TensorView Tensor(wire::DType dtype, std::vector<int64_t> shape, const std::vector<T>& values,
                        uint64_t seed) {
  return Tensor(dtype, std::move(shape), values.data(), values.size() * sizeof(T), seed);
}

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_ROWS_H_
