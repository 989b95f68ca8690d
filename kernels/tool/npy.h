// NumPy .npy files: the exchange format of the kernel tool.
//
// Reads format versions 1.0 and 2.0 and writes 1.0 (2.0 only when the header
// does not fit 1.0's 16-bit length), always little-endian and C order, with
// the 64-byte header alignment NumPy uses. Five element types are known:
// '<u2' (bf16 values travel as their 16-bit patterns), '<f4', '<i4', '<i8'
// and '|u1'. Fortran order, big-endian data, object or structured arrays and
// any other type are rejected with a message that says so.
//
// Every failure is an absl::Status whose message starts with the file's name
// (its last path component) and says what was expected and what was found,
// e.g. "q.npy: expected dtype <u2 (bf16 bits), found <f4". Nothing here
// aborts on bad input.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_NPY_H_
#define MLA_OFFLOAD_KERNELS_TOOL_NPY_H_

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mla {

enum class NpyDtype { kUint8, kUint16, kInt32, kInt64, kFloat32 };

// The NumPy descr: "|u1", "<u2", "<i4", "<i8", "<f4".
absl::string_view NpyDescr(NpyDtype dtype);
// The descr with what this project stores in it, for messages: "<u2 (bf16 bits)".
std::string NpyDtypeText(NpyDtype dtype);
int NpyItemSize(NpyDtype dtype);

template <typename T>
constexpr NpyDtype NpyDtypeOf() {
  static_assert(std::is_same_v<T, uint8_t> || std::is_same_v<T, uint16_t> ||
                    std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
                    std::is_same_v<T, float>,
                "no .npy dtype for this type");
  if constexpr (std::is_same_v<T, uint8_t>) return NpyDtype::kUint8;
  if constexpr (std::is_same_v<T, uint16_t>) return NpyDtype::kUint16;
  if constexpr (std::is_same_v<T, int32_t>) return NpyDtype::kInt32;
  if constexpr (std::is_same_v<T, int64_t>) return NpyDtype::kInt64;
  return NpyDtype::kFloat32;
}

// A dense little-endian C-order array in host memory.
struct NpyArray {
  NpyDtype dtype = NpyDtype::kUint8;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // num_elements() * NpyItemSize(dtype) bytes

  // A zero-filled array.
  static NpyArray Zeros(NpyDtype dtype, std::vector<int64_t> shape);

  template <typename T>
  static NpyArray FromValues(std::vector<int64_t> shape, absl::Span<const T> values) {
    NpyArray array = Zeros(NpyDtypeOf<T>(), std::move(shape));
    CheckAccess<T>(array, values.size());
    std::copy(values.begin(), values.end(), array.values<T>().begin());
    return array;
  }

  int64_t num_elements() const;

  // Typed views; T must match dtype (a programming error aborts, as a bad
  // file never can: readers check the dtype first).
  template <typename T>
  absl::Span<const T> values() const {
    CheckAccess<T>(*this, data.size() / sizeof(T));
    return absl::MakeConstSpan(reinterpret_cast<const T*>(data.data()), data.size() / sizeof(T));
  }
  template <typename T>
  absl::Span<T> values() {
    CheckAccess<T>(*this, data.size() / sizeof(T));
    return absl::MakeSpan(reinterpret_cast<T*>(data.data()), data.size() / sizeof(T));
  }

 private:
  template <typename T>
  static void CheckAccess(const NpyArray& array, size_t count) {
    if (array.dtype != NpyDtypeOf<T>() || count != static_cast<size_t>(array.num_elements())) {
      std::fprintf(stderr, "NpyArray: accessed %s data as %s with %zu elements\n",
                   std::string(NpyDescr(array.dtype)).c_str(),
                   std::string(NpyDescr(NpyDtypeOf<T>())).c_str(), count);
      std::abort();
    }
  }
};

// "[4, 8, 512]"; kAnyDim entries print as "*".
inline constexpr int64_t kAnyDim = -1;
std::string ShapeText(absl::Span<const int64_t> shape);

// Parses the bytes of a .npy file; `name` prefixes every message.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view name);
// The bytes of a .npy file holding `array`.
std::string SerializeNpy(const NpyArray& array);

absl::StatusOr<NpyArray> ReadNpy(const std::string& path);
absl::Status WriteNpy(const std::string& path, const NpyArray& array);

// Checks the dtype and the shape (kAnyDim matches any size); `name` prefixes
// the message. An '<i8' array checked as '<i4' is converted in place when
// every value fits, since NumPy's default integer type is int64.
absl::Status ConformNpy(absl::string_view name, NpyDtype dtype, absl::Span<const int64_t> shape,
                        NpyArray& array);

// ReadNpy then ConformNpy.
absl::StatusOr<NpyArray> ReadNpyAs(const std::string& path, NpyDtype dtype,
                                   absl::Span<const int64_t> shape);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_NPY_H_
