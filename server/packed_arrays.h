// Host arrays laid out in one buffer, so that a launch's small arrays reach
// the device in one copy (one host-to-device copy and synchronisation
// instead of one per array).
//
// Offsets are reserved first (Reserve), then the buffer is made once
// (Allocate) and the arrays are views of it (Array), filled in place; the
// same offsets find them in the device's copy of the buffer (In). Each array
// starts at a 16-byte boundary: the CUDA prologue reads compressed rows as
// 16-byte vectors. The buffer is owned by the PackedArrays; views die with
// it. Not thread-safe.
#ifndef MLA_OFFLOAD_SERVER_PACKED_ARRAYS_H_
#define MLA_OFFLOAD_SERVER_PACKED_ARRAYS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

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
  // Makes the buffer of every array reserved so far (contents undefined).
  void Allocate();
  // The array, every element set to its fill; only after Allocate().
  template <typename T>
  absl::Span<T> Array(const Place<T>& place) {
    T* first = reinterpret_cast<T*>(data_.get() + place.at);
    std::fill(first, first + place.count, place.fill);
    return absl::Span<T>(first, static_cast<size_t>(place.count));
  }
  // The array in a copy of the buffer at `copy` (null without one).
  template <typename T>
  static T* In(uint8_t* copy, const Place<T>& place) {
    return copy == nullptr ? nullptr : reinterpret_cast<T*>(copy + place.at);
  }

  const uint8_t* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
  std::unique_ptr<uint8_t[]> data_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_PACKED_ARRAYS_H_
