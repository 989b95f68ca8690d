// Host arrays laid out in one buffer, so that everything a launch sends to
// the device (q, kv, rows and the small arrays) goes in one copy.
//
// Offsets are reserved first (Reserve), then the buffer is given once
// (UseMemory: the caller's, of at least bytes(), typically the launcher's
// pinned staging) and the arrays are views of it (Array, filled in place,
// or Raw, left as they are for arrays the caller writes in full); the same
// offsets find them in the device's copy of the buffer (In). Each array
// starts at a 16-byte boundary: the CUDA kernels read q and rows as 16-byte
// vectors. The memory must outlive the views. Not thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_PACKED_ARRAYS_H_
#define MLA_OFFLOAD_SERVER_ENGINE_PACKED_ARRAYS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace mla {

class PackedArrays {
 public:
  // An array of `count` T that starts as `fill`, `at` bytes into the buffer.
  template <typename T>
  struct Place {
    size_t at;
    int64_t count;
    T fill;
  };

  // Room for an array; only before Allocate().
  template <typename T>
  Place<T> Reserve(int64_t count, T fill) {
    const size_t at = (bytes_ + 15) & ~size_t{15};
    bytes_ = at + sizeof(T) * static_cast<size_t>(count);
    return Place<T>{at, count, fill};
  }
  // The buffer of every array reserved so far: `memory`, bytes() of it.
  void UseMemory(uint8_t* memory) { data_ = memory; }
  // The array, every element set to its fill; only after UseMemory().
  template <typename T>
  absl::Span<T> Array(const Place<T>& place) {
    absl::Span<T> array = Raw(place);
    std::fill(array.begin(), array.end(), place.fill);
    return array;
  }
  // The array as the memory holds it (its fill unused).
  template <typename T>
  absl::Span<T> Raw(const Place<T>& place) {
    return absl::Span<T>(reinterpret_cast<T*>(data_ + place.at), static_cast<size_t>(place.count));
  }
  // The array in a copy of the buffer at `copy` (null without one).
  template <typename T>
  static T* In(uint8_t* copy, const Place<T>& place) {
    return copy == nullptr ? nullptr : reinterpret_cast<T*>(copy + place.at);
  }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
  uint8_t* data_ = nullptr;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_PACKED_ARRAYS_H_
