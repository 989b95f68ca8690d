#include "proto/views.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace mla::wire {
namespace {

// A value DType does not name is quoted as the number that came.
std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
      return "unspecified";
    case DType::kBf16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kI32:
      return "i32";
    case DType::kE4m3fn:
      return "e4m3fn";
    case DType::kUe8m0:
      return "ue8m0";
  }
  return absl::StrCat("dtype ", static_cast<int32_t>(dtype));
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  std::vector<std::string> dims;
  for (int64_t dim : shape) dims.push_back(dim < 0 ? "*" : absl::StrCat(dim));
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kE4m3fn:
    case DType::kUe8m0:
      return 1;
    case DType::kBf16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    default:
      return 0;
  }
}

size_t TensorView::size_bytes() const {
  size_t size = 0;
  for (const Piece& piece : pieces) size += piece.size();
  return size;
}

namespace {

// A host read of device memory would fault or read another mapping: a bug
// of the caller, stopped before it touches anything.
void CheckHostMemory(const TensorView& tensor) {
  if (!tensor.device) return;
  std::fprintf(stderr, "mla-offload: a tensor in device memory was read on the host\n");
  std::abort();
}

}  // namespace

void TensorView::CopyTo(void* dst) const {
  CheckHostMemory(*this);
  auto* out = static_cast<uint8_t*>(dst);
  for (const Piece& piece : pieces) {
    std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
}

void TensorView::CopyRange(size_t offset, size_t length, void* dst) const {
  CheckHostMemory(*this);
  auto* out = static_cast<uint8_t*>(dst);
  for (const Piece& piece : pieces) {
    if (length == 0) return;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t take = std::min(piece.size() - offset, length);
    std::memcpy(out, piece.data() + offset, take);
    out += take;
    length -= take;
    offset = 0;
  }
}

std::optional<Piece> TensorView::contiguous() const {
  if (pieces.empty()) return Piece();
  if (pieces.size() == 1) return pieces.front();
  return std::nullopt;
}

TensorView MakeTensorView(DType dtype, std::vector<int64_t> shape, const void* data,
                          size_t size_bytes, std::shared_ptr<const void> keep_alive) {
  TensorView view;
  view.dtype = dtype;
  view.shape = std::move(shape);
  if (size_bytes > 0) view.pieces.emplace_back(static_cast<const uint8_t*>(data), size_bytes);
  view.keep_alive = std::move(keep_alive);
  return view;
}

absl::Status CheckTensor(const TensorView& tensor, absl::string_view field, DType dtype,
                         absl::Span<const int64_t> shape) {
  if (tensor.region.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".region: this tensor's bytes must travel inline, in data; only an Attend "
               "message's q, kv and compressed_kv may come from a region"));
  }
  const size_t element_size = DTypeSize(dtype);
  bool shape_ok = element_size > 0 && tensor.shape.size() == shape.size();
  bool has_zero = false;
  for (size_t i = 0; shape_ok && i < shape.size(); ++i) {
    shape_ok = tensor.shape[i] >= 0 && (shape[i] < 0 || tensor.shape[i] == shape[i]);
    has_zero = has_zero || tensor.shape[i] == 0;
  }
  if (tensor.dtype != dtype || !shape_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected ", DTypeName(dtype), " ", ShapeText(shape), ", got ",
                     DTypeName(tensor.dtype), " ", ShapeText(tensor.shape)));
  }
  // The byte count of the shape, or -1 when it would not fit in int64 (no
  // message can carry that many bytes). A dimension of 0 makes it 0 however
  // large the others are.
  int64_t needed = has_zero ? 0 : static_cast<int64_t>(element_size);
  for (size_t i = 0; !has_zero && i < shape.size() && needed >= 0; ++i) {
    needed = needed > std::numeric_limits<int64_t>::max() / tensor.shape[i]
                 ? -1
                 : needed * tensor.shape[i];
  }
  const size_t bytes = tensor.size_bytes();
  if (needed < 0 || bytes != static_cast<size_t>(needed)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape ", ShapeText(tensor.shape), " needs ",
                     needed < 0 ? std::string("more than 2^63") : absl::StrCat(needed),
                     " bytes of data, got ", bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckTensor(const std::optional<TensorView>& tensor, absl::string_view field,
                         DType dtype, absl::Span<const int64_t> shape) {
  static const TensorView* const kAbsent = new TensorView();
  return CheckTensor(tensor.has_value() ? *tensor : *kAbsent, field, dtype, shape);
}

}  // namespace mla::wire
