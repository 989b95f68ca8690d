#include "kernels/tool/npy.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace mla {
namespace {

constexpr absl::string_view kMagic = "\x93NUMPY";
// NumPy pads the header so that the data starts on a multiple of this.
constexpr int kHeaderAlign = 64;
constexpr NpyDtype kAllDtypes[] = {NpyDtype::kUint16, NpyDtype::kFloat32, NpyDtype::kInt32,
                                   NpyDtype::kInt64, NpyDtype::kUint8};

absl::string_view BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

absl::Status Invalid(absl::string_view name, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", message));
}

uint32_t ReadLittleEndian(absl::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) {
    value = value << 8 | static_cast<uint8_t>(bytes[i]);
  }
  return value;
}

// The header is a Python dict literal such as
// {'descr': '<u2', 'fortran_order': False, 'shape': (4, 8, 512), }
// This reads exactly that grammar: quoted strings, True/False, int tuples.
class HeaderParser {
 public:
  HeaderParser(absl::string_view text, absl::string_view name) : rest_(text), name_(name) {}

  absl::Status Parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool has_descr = false, has_order = false, has_shape = false;
    if (!Consume('{')) return Error("header is not a dict");
    while (!Consume('}')) {
      std::string key;
      if (!ParseString(key) || !Consume(':')) return Error("malformed header dict");
      if (key == "descr") {
        if (Peek() == '[') return Invalid(name_, "structured arrays are not supported");
        if (!ParseString(descr)) return Error("descr is not a string");
        has_descr = true;
      } else if (key == "fortran_order") {
        if (!ParseBool(fortran_order)) return Error("fortran_order is not True or False");
        has_order = true;
      } else if (key == "shape") {
        if (!ParseShape(shape)) return Error("shape is not a tuple of non-negative integers");
        has_shape = true;
      } else {
        return Error(absl::StrCat("unknown header key '", key, "'"));
      }
      if (!Consume(',') && Peek() != '}') return Error("malformed header dict");
    }
    if (!has_descr || !has_order || !has_shape) {
      return Error("header lacks one of descr, fortran_order, shape");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) {
    return Invalid(name_, absl::StrCat("not a valid .npy header (", what, ")"));
  }

  void SkipSpace() { rest_ = absl::StripLeadingAsciiWhitespace(rest_); }

  char Peek() {
    SkipSpace();
    return rest_.empty() ? '\0' : rest_.front();
  }

  bool Consume(char c) {
    if (Peek() != c) return false;
    rest_.remove_prefix(1);
    return true;
  }

  bool ParseString(std::string& out) {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return false;
    const size_t end = rest_.find(quote, 1);
    if (end == absl::string_view::npos) return false;
    out = std::string(rest_.substr(1, end - 1));
    rest_.remove_prefix(end + 1);
    return true;
  }

  bool ParseBool(bool& out) {
    SkipSpace();
    for (const auto& [word, value] : {std::pair<absl::string_view, bool>{"True", true},
                                      std::pair<absl::string_view, bool>{"False", false}}) {
      if (absl::ConsumePrefix(&rest_, word)) {
        out = value;
        return true;
      }
    }
    return false;
  }

  bool ParseShape(std::vector<int64_t>& out) {
    if (!Consume('(')) return false;
    out.clear();
    while (!Consume(')')) {
      SkipSpace();
      size_t digits = 0;
      while (digits < rest_.size() && absl::ascii_isdigit(rest_[digits])) ++digits;
      int64_t dim;
      if (digits == 0 || !absl::SimpleAtoi(rest_.substr(0, digits), &dim)) return false;
      out.push_back(dim);
      rest_.remove_prefix(digits);
      absl::ConsumePrefix(&rest_, "L");  // Python 2 wrote long integers so.
      if (!Consume(',') && Peek() != ')') return false;
    }
    return true;
  }

  absl::string_view rest_;
  absl::string_view name_;
};

absl::StatusOr<NpyDtype> DtypeFromDescr(absl::string_view descr, absl::string_view name) {
  for (NpyDtype dtype : kAllDtypes) {
    if (descr == NpyDescr(dtype)) return dtype;
  }
  const std::string supported = absl::StrJoin(
      kAllDtypes, ", ", [](std::string* out, NpyDtype d) { absl::StrAppend(out, NpyDescr(d)); });
  if (absl::StartsWith(descr, ">")) {
    return Invalid(
        name, absl::StrCat("big-endian data (", descr,
                           ") is not supported; save it with a.astype('<", descr.substr(1), "')"));
  }
  if (absl::StrContains(descr, "O")) {
    return Invalid(name, "object arrays are not supported; save a numeric array");
  }
  return Invalid(name, absl::StrCat("unsupported dtype ", descr, "; expected one of ", supported));
}

absl::Status ConvertInt64ToInt32(absl::string_view name, NpyArray& array) {
  absl::Span<const int64_t> wide = array.values<int64_t>();
  std::vector<int32_t> narrow(wide.size());
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < std::numeric_limits<int32_t>::min() ||
        wide[i] > std::numeric_limits<int32_t>::max()) {
      return Invalid(name, absl::StrCat("value ", wide[i], " at flat index ", i,
                                        " does not fit the int32 this file holds"));
    }
    narrow[i] = static_cast<int32_t>(wide[i]);
  }
  array = NpyArray::FromValues<int32_t>(std::move(array.shape), narrow);
  return absl::OkStatus();
}

}  // namespace

absl::string_view NpyDescr(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kUint8:
      return "|u1";
    case NpyDtype::kUint16:
      return "<u2";
    case NpyDtype::kInt32:
      return "<i4";
    case NpyDtype::kInt64:
      return "<i8";
    case NpyDtype::kFloat32:
      return "<f4";
  }
  return "?";
}

std::string NpyDtypeText(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kUint8:
      return "|u1 (bytes)";
    case NpyDtype::kUint16:
      return "<u2 (bf16 bits)";
    case NpyDtype::kInt32:
      return "<i4 (int32)";
    case NpyDtype::kInt64:
      return "<i8 (int64)";
    case NpyDtype::kFloat32:
      return "<f4 (float32)";
  }
  return "?";
}

int NpyItemSize(NpyDtype dtype) {
  switch (dtype) {
    case NpyDtype::kUint8:
      return 1;
    case NpyDtype::kUint16:
      return 2;
    case NpyDtype::kInt32:
    case NpyDtype::kFloat32:
      return 4;
    case NpyDtype::kInt64:
      return 8;
  }
  return 1;
}

NpyArray NpyArray::Zeros(NpyDtype dtype, std::vector<int64_t> shape) {
  NpyArray array;
  array.dtype = dtype;
  array.shape = std::move(shape);
  array.data.assign(array.num_elements() * NpyItemSize(dtype), 0);
  return array;
}

int64_t NpyArray::num_elements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[",
                      absl::StrJoin(shape, ", ",
                                    [](std::string* out, int64_t dim) {
                                      absl::StrAppend(out,
                                                      dim == kAnyDim ? "*" : absl::StrCat(dim));
                                    }),
                      "]");
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes, absl::string_view name) {
  if (!absl::StartsWith(bytes, kMagic)) {
    return Invalid(name, "not a .npy file (it does not start with \\x93NUMPY)");
  }
  if (bytes.size() < kMagic.size() + 2) return Invalid(name, "truncated in the header");
  const int major = static_cast<uint8_t>(bytes[6]);
  const int minor = static_cast<uint8_t>(bytes[7]);
  if ((major != 1 && major != 2) || minor != 0) {
    return Invalid(name, absl::StrCat(".npy format version ", major, ".", minor,
                                      " is not supported (1.0 and 2.0 are)"));
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagic.size() + 2 + length_bytes;
  if (bytes.size() < prefix) return Invalid(name, "truncated in the header");
  const size_t header_length = ReadLittleEndian(bytes.substr(8, length_bytes));
  if (bytes.size() - prefix < header_length) return Invalid(name, "truncated in the header");

  std::string descr;
  bool fortran_order = false;
  NpyArray array;
  HeaderParser parser(bytes.substr(prefix, header_length), name);
  if (absl::Status status = parser.Parse(descr, fortran_order, array.shape); !status.ok()) {
    return status;
  }
  absl::StatusOr<NpyDtype> dtype = DtypeFromDescr(descr, name);
  if (!dtype.ok()) return dtype.status();
  array.dtype = *dtype;
  if (fortran_order) {
    return Invalid(name, "Fortran-order arrays are not supported; save np.ascontiguousarray(a)");
  }

  const absl::string_view payload = bytes.substr(prefix + header_length);
  // Saturates instead of overflowing; nothing is allocated unless the bytes
  // are there.
  constexpr uint64_t kSaturated = std::numeric_limits<uint64_t>::max();
  uint64_t expected = NpyItemSize(array.dtype);
  for (int64_t dim : array.shape) {
    const uint64_t size = static_cast<uint64_t>(dim);
    expected = size != 0 && expected > kSaturated / size ? kSaturated : expected * size;
  }
  if (expected != payload.size()) {
    return Invalid(
        name, absl::StrCat("shape ", ShapeText(array.shape), " of ", descr, " needs ",
                           expected == kSaturated ? std::string("more") : absl::StrCat(expected),
                           " bytes of data, the file holds ", payload.size(),
                           expected > payload.size() ? " (truncated)" : " (trailing bytes)"));
  }
  array.data.assign(payload.begin(), payload.end());
  return array;
}

std::string SerializeNpy(const NpyArray& array) {
  std::string shape;
  for (int64_t dim : array.shape) absl::StrAppend(&shape, dim, ", ");
  if (array.shape.size() > 1) shape.resize(shape.size() - 2);
  if (array.shape.size() == 1) shape.resize(shape.size() - 1);  // "(4,)", as Python writes it
  std::string header = absl::StrCat("{'descr': '", NpyDescr(array.dtype),
                                    "', 'fortran_order': False, 'shape': (", shape, "), }");
  const bool fits_v1 =
      kMagic.size() + 4 + header.size() + kHeaderAlign <= std::numeric_limits<uint16_t>::max();
  const size_t prefix = kMagic.size() + 2 + (fits_v1 ? 2 : 4);
  const size_t padded =
      (prefix + header.size() + 1 + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign;
  header.append(padded - prefix - header.size() - 1, ' ');
  header.push_back('\n');

  std::string bytes(kMagic);
  bytes.push_back(static_cast<char>(fits_v1 ? 1 : 2));
  bytes.push_back(0);
  for (size_t i = 0; i < prefix - kMagic.size() - 2; ++i) {
    bytes.push_back(static_cast<char>(header.size() >> (8 * i) & 0xff));
  }
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(array.data.data()), array.data.size());
  return bytes;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  const absl::string_view name = BaseName(path);
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (file == nullptr) {
    const int error = errno;
    const std::string message =
        absl::StrCat(name, ": cannot open ", path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  std::string bytes;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) bytes.append(buffer, got);
  if (std::ferror(file.get())) {
    return Invalid(name, absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  return ParseNpy(bytes, name);
}

absl::Status WriteNpy(const std::string& path, const NpyArray& array) {
  const std::string bytes = SerializeNpy(array);
  FILE* file = std::fopen(path.c_str(), "wb");
  bool ok = file != nullptr && std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size();
  int error = errno;
  if (file != nullptr && std::fclose(file) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (!ok) {
    return absl::UnavailableError(
        absl::StrCat(BaseName(path), ": cannot write ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::Status ConformNpy(absl::string_view name, NpyDtype dtype, absl::Span<const int64_t> shape,
                        NpyArray& array) {
  if (dtype == NpyDtype::kInt32 && array.dtype == NpyDtype::kInt64) {
    if (absl::Status status = ConvertInt64ToInt32(name, array); !status.ok()) return status;
  }
  if (array.dtype != dtype) {
    return Invalid(name, absl::StrCat("expected dtype ", NpyDtypeText(dtype), ", found ",
                                      NpyDescr(array.dtype)));
  }
  bool matches = array.shape.size() == shape.size();
  for (size_t i = 0; matches && i < shape.size(); ++i) {
    matches = shape[i] == kAnyDim || shape[i] == array.shape[i];
  }
  if (!matches) {
    return Invalid(name, absl::StrCat("expected shape ", ShapeText(shape), ", found ",
                                      ShapeText(array.shape)));
  }
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpyAs(const std::string& path, NpyDtype dtype,
                                   absl::Span<const int64_t> shape) {
  absl::StatusOr<NpyArray> array = ReadNpy(path);
  if (!array.ok()) return array.status();
  if (absl::Status status = ConformNpy(BaseName(path), dtype, shape, *array); !status.ok()) {
    return status;
  }
  return array;
}

}  // namespace mla
