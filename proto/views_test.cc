// The plain views' helpers and the one tensor check.
#include "proto/views.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mla::wire {
namespace {

TEST(ViewsTest, TensorViewHelpers) {
  const std::string bytes = "0123456789";
  TensorView tensor;
  EXPECT_EQ(tensor.size_bytes(), 0u);
  ASSERT_TRUE(tensor.contiguous().has_value());
  EXPECT_TRUE(tensor.contiguous()->empty());
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  tensor.pieces = {Piece(data, 4)};
  EXPECT_EQ(tensor.contiguous()->data(), data);
  tensor.pieces.emplace_back(data + 4, 6);
  EXPECT_EQ(tensor.size_bytes(), 10u);
  EXPECT_FALSE(tensor.contiguous().has_value());
  std::string copy(10, '\0');
  tensor.CopyTo(copy.data());
  EXPECT_EQ(copy, bytes);
  // Ranges within a piece, across the cut, and empty.
  std::string range(5, '\0');
  tensor.CopyRange(1, 2, range.data());
  EXPECT_EQ(range.substr(0, 2), "12");
  tensor.CopyRange(2, 5, range.data());
  EXPECT_EQ(range, "23456");
  tensor.CopyRange(9, 0, range.data());
  EXPECT_EQ(range, "23456");
}

TEST(ViewsTest, MakeTensorViewHasNoEmptyPiece) {
  const uint8_t byte = 7;
  EXPECT_TRUE(MakeTensorView(DType::kBf16, {0}, &byte, 0, nullptr).pieces.empty());
  const TensorView one = MakeTensorView(DType::kI32, {1}, &byte, 1, nullptr);
  ASSERT_EQ(one.pieces.size(), 1u);
  EXPECT_EQ(one.pieces[0].data(), &byte);
}

TEST(ViewsTest, CheckTensor) {
  std::vector<uint8_t> data(24);
  auto tensor = [&data](DType dtype, std::vector<int64_t> shape, size_t size) {
    return MakeTensorView(dtype, std::move(shape), data.data(), size, nullptr);
  };
  EXPECT_TRUE(CheckTensor(tensor(DType::kBf16, {3, 4}, 24), "q", DType::kBf16, {3, 4}).ok());
  EXPECT_TRUE(CheckTensor(tensor(DType::kF32, {6}, 24), "lse", DType::kF32, {-1}).ok());
  EXPECT_TRUE(CheckTensor(tensor(DType::kI32, {2, 3}, 24), "topk", DType::kI32, {2, -1}).ok());
  EXPECT_TRUE(CheckTensor(tensor(DType::kBf16, {}, 2), "q", DType::kBf16, {}).ok());
  // The FP8 output's two byte types: one byte an element.
  EXPECT_TRUE(CheckTensor(tensor(DType::kE4m3fn, {2, 12}, 24), "out", DType::kE4m3fn, {2, 12}).ok());
  EXPECT_TRUE(
      CheckTensor(tensor(DType::kUe8m0, {6, 4}, 24), "out_scales", DType::kUe8m0, {6, 4}).ok());
  // A dimension of 0 makes the tensor empty however large the others are.
  EXPECT_TRUE(CheckTensor(tensor(DType::kBf16, {int64_t{1} << 62, 0, int64_t{1} << 62}, 0), "q",
                          DType::kBf16, {-1, 0, -1})
                  .ok());

  const auto error = [](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  EXPECT_EQ(error(CheckTensor(tensor(DType::kF32, {3, 2}, 24), "q", DType::kBf16, {-1, 4})),
            "q: expected bf16 [*, 4], got f32 [3, 2]");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kBf16, {3, 4, 1}, 24), "q", DType::kBf16, {3, 4})),
            "q: expected bf16 [3, 4], got bf16 [3, 4, 1]");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kUe8m0, {2, 12}, 24), "out", DType::kE4m3fn, {2, 12})),
            "out: expected e4m3fn [2, 12], got ue8m0 [2, 12]");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kE4m3fn, {2, 4}, 24), "out", DType::kE4m3fn, {2, 4})),
            "out: shape [2, 4] needs 8 bytes of data, got 24");
  EXPECT_EQ(error(CheckTensor(tensor(static_cast<DType>(9), {12}, 24), "q", DType::kBf16, {12})),
            "q: expected bf16 [12], got dtype 9 [12]");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kUnspecified, {12}, 24), "kv", DType::kI32, {12})),
            "kv: expected i32 [12], got unspecified [12]");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kBf16, {3, -5}, 24), "q", DType::kBf16, {3, -1})),
            "q: expected bf16 [3, *], got bf16 [3, *]");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kBf16, {3, 5}, 24), "q", DType::kBf16, {3, 5})),
            "q: shape [3, 5] needs 30 bytes of data, got 24");
  EXPECT_EQ(error(CheckTensor(tensor(DType::kBf16, {int64_t{1} << 62, int64_t{1} << 62}, 24), "q",
                              DType::kBf16, {-1, -1})),
            "q: shape [4611686018427387904, 4611686018427387904] needs more than 2^63 bytes of "
            "data, got 24");
  // Absent is empty.
  EXPECT_EQ(error(CheckTensor(std::optional<TensorView>(), "kv", DType::kBf16, {1, 512})),
            "kv: expected bf16 [1, 512], got unspecified []");
  EXPECT_TRUE(CheckTensor(std::optional<TensorView>(tensor(DType::kI32, {2, 3}, 24)), "topk",
                          DType::kI32, {2, 3})
                  .ok());
}

// A shape whose byte count does not fit int64 matches no data: not the real
// bytes of a tensor, and not the none that its product wrapped to 0 would
// claim. A dimension of 0 makes any shape 0 bytes.
TEST(ViewsTest, ShapesBeyondInt64MatchNoData) {
  const std::vector<uint8_t> q(4 * 512 * 2);
  TensorView real = MakeTensorView(DType::kBf16, {1, 4, 512}, q.data(), q.size(), nullptr);
  const std::vector<int64_t> any_q = {-1, -1, 512};
  ASSERT_TRUE(CheckTensor(real, "q", DType::kBf16, any_q).ok());
  real.shape = {int64_t{1} << 33, int64_t{1} << 31, 512};  // 2^74 bytes
  TensorView empty = real;
  empty.pieces.clear();
  for (const TensorView* tensor : {&real, &empty}) {
    const absl::Status status = CheckTensor(*tensor, "q", DType::kBf16, any_q);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(),
              absl::StrCat("q: shape [8589934592, 2147483648, 512] needs more than 2^63 bytes of "
                           "data, got ",
                           tensor->size_bytes()));
  }
  // 2^53 rows of 512 bf16 are 2^63 bytes, one more than int64 holds; 2^52
  // rows fit.
  empty.shape = {int64_t{1} << 53, 512};
  EXPECT_EQ(CheckTensor(empty, "kv", DType::kBf16, {-1, 512}).message(),
            "kv: shape [9007199254740992, 512] needs more than 2^63 bytes of data, got 0");
  empty.shape = {int64_t{1} << 52, 512};
  EXPECT_EQ(CheckTensor(empty, "kv", DType::kBf16, {-1, 512}).message(),
            "kv: shape [4503599627370496, 512] needs 4611686018427387904 bytes of data, got 0");
  empty.shape = {0, int64_t{1} << 62, 512};
  EXPECT_TRUE(CheckTensor(empty, "q", DType::kBf16, any_q).ok()) << "[0, 2^62, 512]";
}

// A tensor that still names a region was not resolved by the server: its
// field takes inline bytes only, whatever the bytes would have been.
TEST(ViewsTest, AnUnresolvedRegionReferenceIsRefused) {
  TensorView tensor;
  tensor.dtype = DType::kF32;
  tensor.shape = {0};
  tensor.region = RegionRefView{3, 0, 0};
  const absl::Status status = CheckTensor(tensor, "sinks", DType::kF32, {0});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "sinks.region: this tensor's bytes must travel inline, in data; only an Attend "
            "message's q, kv and compressed_kv may come from a region");
}

}  // namespace
}  // namespace mla::wire
