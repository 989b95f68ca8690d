#include "server/requests.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mla {
namespace {

absl::string_view DTypeName(int dtype) {
  switch (static_cast<DType>(dtype)) {
    case DType::kBf16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kI32:
      return "i32";
    default:
      return "unspecified";
  }
}

int64_t DTypeSize(DType dtype) { return dtype == DType::kBf16 ? 2 : 4; }

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t dim : shape) dims.push_back(dim < 0 ? "*" : absl::StrCat(dim));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

}  // namespace

void TensorInput::CopyRange(int64_t offset, int64_t length, void* dst) const {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (const auto& [data, size] : pieces) {
    const int64_t piece_size = static_cast<int64_t>(size);
    if (length == 0) return;
    if (offset >= piece_size) {
      offset -= piece_size;
      continue;
    }
    const int64_t take = std::min(piece_size - offset, length);
    std::memcpy(out, data + offset, take);
    out += take;
    length -= take;
    offset = 0;
  }
}

absl::Status CheckTensor(const TensorInput& tensor, absl::string_view field, DType dtype,
                         const std::vector<int64_t>& shape) {
  bool shape_ok = tensor.shape.size() == shape.size();
  bool has_zero = false;
  for (size_t i = 0; shape_ok && i < shape.size(); ++i) {
    shape_ok = tensor.shape[i] >= 0 && (shape[i] < 0 || tensor.shape[i] == shape[i]);
    has_zero = has_zero || tensor.shape[i] == 0;
  }
  if (tensor.dtype != static_cast<int>(dtype) || !shape_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected ", DTypeName(static_cast<int>(dtype)), " ",
                     ShapeText(shape), ", got ", DTypeName(tensor.dtype), " ",
                     ShapeText(tensor.shape)));
  }
  // The byte count of the shape, or -1 when it would not fit in int64 (no
  // message can carry that many bytes). A dimension of 0 makes it 0 however
  // large the others are.
  int64_t needed = has_zero ? 0 : DTypeSize(dtype);
  for (size_t i = 0; !has_zero && i < shape.size() && needed >= 0; ++i) {
    needed = needed > std::numeric_limits<int64_t>::max() / tensor.shape[i]
                 ? -1
                 : needed * tensor.shape[i];
  }
  if (needed < 0 || tensor.bytes() != needed) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", ShapeText(tensor.shape), " needs ",
        needed < 0 ? std::string("more than 2^63") : absl::StrCat(needed), " bytes of data, got ",
        tensor.bytes()));
  }
  return absl::OkStatus();
}

std::string EchoClientText(absl::string_view text) {
  constexpr size_t kMaxEchoed = 64;
  if (text.size() <= kMaxEchoed) return absl::CHexEscape(text);
  return absl::StrCat(absl::CHexEscape(text.substr(0, kMaxEchoed)), "... (", text.size(),
                      " bytes)");
}

}  // namespace mla
