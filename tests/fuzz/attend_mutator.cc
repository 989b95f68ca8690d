#include "tests/fuzz/attend_mutator.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/statusor.h"
#include "kernels/geometry.h"
#include "proto/attend_codec.h"
#include "tests/fuzz/engine_fixture.h"
#include "tests/fuzz/owned_tensor.h"

namespace mla::fuzz {
namespace {

using Rng = std::mt19937;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
// Tensors reshaped to fit stay below this many rows (the engine takes 256
// tokens a message; 1024 is past every limit).
constexpr int64_t kMaxFitRows = 1024;

int64_t Below(Rng& rng, int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); }

int64_t OneOf(Rng& rng, std::initializer_list<int64_t> values) {
  return values.begin()[Below(rng, static_cast<int64_t>(values.size()))];
}

// A value a check may get wrong: the old one moved a little (wrapping, as
// a client's arithmetic might), an edge of int32 (of int64 too when
// `wide`), or a size the engine's limits are made of.
int64_t NewValue(Rng& rng, int64_t old, bool wide) {
  const int64_t small = Below(rng, 17);
  switch (Below(rng, wide ? 7 : 6)) {
    case 0:
      return static_cast<int64_t>(static_cast<uint64_t>(old) + 1 + small);
    case 1:
      return static_cast<int64_t>(static_cast<uint64_t>(old) - 1 - small);
    case 2:
      return kInt32Max - small;
    case 3:
      return kInt32Min + small;
    case 4:
      return OneOf(rng, {0, 1, -1, 2, 3, 4, 16, 44, 62, 63, 64, 127, 128, 129, 130, 131, 255,
                         256, 512, 1024, kMaxPosition - 1, kMaxPosition});
    case 5:
      return Below(rng, 300);
    default:
      return OneOf(rng, {kInt64Max - small, kInt64Min + small, int64_t{1} << (31 + Below(rng, 32)),
                         (int64_t{1} << 32) + small});
  }
}

void MutateInt32(Rng& rng, int32_t& value) {
  value = static_cast<int32_t>(NewValue(rng, value, /*wide=*/false));
}

// `rows` bf16 rows of 512 small values.
wire::TensorView Bf16Rows(Rng& rng, std::vector<int64_t> shape, int64_t rows) {
  std::vector<uint16_t> values(static_cast<size_t>(rows) * kHeadDim);
  for (uint16_t& value : values) value = static_cast<uint16_t>(0x3c00 + Below(rng, 0x400));
  return OwnedTensor(wire::DType::kBf16, std::move(shape), std::move(values));
}

// The dimension `index` of the tensor's shape if it is a count a message
// can have, else `fallback`.
int64_t DimOr(const std::optional<wire::TensorView>& tensor, size_t index, int64_t fallback) {
  if (!tensor.has_value() || tensor->shape.size() <= index) return fallback;
  const int64_t dim = tensor->shape[index];
  return dim >= 1 && dim <= kMaxFitRows ? dim : fallback;
}

// Gives one tensor the shape and bytes the segments ask for: q [T, H, 512],
// kv [T, 512], compressed_kv [M, 512], topk [T, K] of -1.
bool Fit(Rng& rng, wire::AttendRequestView& view) {
  int64_t tokens = 0, rows = 0;
  for (const wire::SegmentView& segment : view.segments) {
    tokens += std::clamp<int64_t>(segment.num_tokens, 0, kMaxFitRows);
    rows += std::clamp<int64_t>(segment.num_compressed_rows, 0, kMaxFitRows);
  }
  if (tokens > kMaxFitRows || rows > kMaxFitRows) return false;
  switch (Below(rng, 4)) {
    case 0: {
      const int64_t heads = DimOr(view.q, 1, 16);
      if (tokens * heads > kMaxFitRows) return false;
      view.q = Bf16Rows(rng, {tokens, heads, kHeadDim}, tokens * heads);
      return true;
    }
    case 1:
      view.kv = Bf16Rows(rng, {tokens, kHeadDim}, tokens);
      return true;
    case 2:
      view.compressed_kv = Bf16Rows(rng, {rows, kHeadDim}, rows);
      return true;
    default: {
      const int64_t width = DimOr(view.topk, 1, 8);
      view.topk = OwnedTensor(wire::DType::kI32, {tokens, width},
                              std::vector<int32_t>(static_cast<size_t>(tokens * width), -1));
      return true;
    }
  }
}

std::optional<wire::TensorView>& SomeTensor(Rng& rng, wire::AttendRequestView& view) {
  switch (Below(rng, 4)) {
    case 0:
      return view.q;
    case 1:
      return view.kv;
    case 2:
      return view.compressed_kv;
    default:
      return view.topk;
  }
}

// Sets one int32 of the top-k to a new value (on a copy of its bytes).
bool MutateTopK(Rng& rng, wire::AttendRequestView& view) {
  if (!view.topk.has_value() || view.topk->size_bytes() < sizeof(int32_t)) return false;
  std::vector<int32_t> values(view.topk->size_bytes() / sizeof(int32_t));
  std::vector<uint8_t> bytes(view.topk->size_bytes());
  view.topk->CopyTo(bytes.data());
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(int32_t));
  int32_t& value = values[Below(rng, static_cast<int64_t>(values.size()))];
  MutateInt32(rng, value);
  view.topk = OwnedTensor(view.topk->dtype, view.topk->shape, std::move(values));
  return true;
}

bool MutateSegments(Rng& rng, wire::AttendRequestView& view) {
  if (view.segments.empty() || Below(rng, 8) == 0) {
    view.segments.push_back({std::string(kFixtureSessions[0].alias), 0, 1, 0, 0});
  }
  std::vector<wire::SegmentView>& segments = view.segments;
  wire::SegmentView& segment = segments[Below(rng, static_cast<int64_t>(segments.size()))];
  static constexpr int32_t wire::SegmentView::*kNumbers[] = {
      &wire::SegmentView::position, &wire::SegmentView::num_tokens,
      &wire::SegmentView::first_compressed_row, &wire::SegmentView::num_compressed_rows};
  switch (Below(rng, 6)) {
    case 0: {
      const FixtureSession& session =
          kFixtureSessions[Below(rng, static_cast<int64_t>(std::size(kFixtureSessions)))];
      segment.session_id = std::string(session.alias);
      return true;
    }
    case 1:
    case 2:
    case 3:
      MutateInt32(rng, segment.*kNumbers[Below(rng, static_cast<int64_t>(std::size(kNumbers)))]);
      return true;
    case 4:
      segments.push_back(segment);
      return true;
    default:
      segments.erase(segments.begin() + Below(rng, static_cast<int64_t>(segments.size())));
      return true;
  }
}

bool MutateTensor(Rng& rng, wire::AttendRequestView& view) {
  std::optional<wire::TensorView>& tensor = SomeTensor(rng, view);
  switch (Below(rng, 4)) {
    case 0:
      tensor.reset();
      return true;
    case 1:
      if (!tensor.has_value()) return false;
      tensor->dtype = static_cast<wire::DType>(Below(rng, 7));
      return true;
    case 2: {
      if (!tensor.has_value()) return false;
      std::vector<int64_t>& shape = tensor->shape;
      if (shape.empty() || Below(rng, 8) == 0) shape.push_back(1);
      int64_t& dim = shape[Below(rng, static_cast<int64_t>(shape.size()))];
      dim = NewValue(rng, dim, /*wide=*/true);
      return true;
    }
    default:
      return Fit(rng, view);
  }
}

bool Mutate(Rng& rng, wire::AttendRequestView& view) {
  switch (Below(rng, 9)) {
    case 0:
      view.request_id = static_cast<uint64_t>(NewValue(rng, static_cast<int64_t>(view.request_id),
                                                       /*wide=*/true));
      return true;
    case 1:
      view.layer = Below(rng, 2) == 0 ? static_cast<int32_t>(Below(rng, 62))
                                      : static_cast<int32_t>(NewValue(rng, view.layer, false));
      return true;
    case 2:
      MutateInt32(rng, view.head_offset);
      return true;
    case 3:
      view.return_lse = !view.return_lse;
      return true;
    case 4:
      if (Below(rng, 2) == 0) {
        view.derotate_output = !view.derotate_output;
      } else {
        view.fp8_output = !view.fp8_output;
      }
      return true;
    case 5:
      return MutateTopK(rng, view);
    case 6:
    case 7:
      return MutateSegments(rng, view);
    default:
      return MutateTensor(rng, view);
  }
}

}  // namespace

size_t MutateAttendRequest(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  // The view points into this copy while data is overwritten.
  const std::string original(reinterpret_cast<const char*>(data), size);
  grpc::Slice slice(original.data(), original.size(), grpc::Slice::STATIC_SLICE);
  absl::StatusOr<wire::AttendRequestView> view =
      wire::ParseAttendRequest(grpc::ByteBuffer(&slice, 1), original.size());
  if (!view.ok()) return 0;
  Rng rng(seed);
  if (!Mutate(rng, *view)) return 0;
  grpc::Slice written;
  if (!wire::SerializeAttendRequest(*view).DumpToSingleSlice(&written).ok() ||
      written.size() > max_size) {
    return 0;
  }
  std::memcpy(data, written.begin(), written.size());
  return written.size();
}

}  // namespace mla::fuzz
