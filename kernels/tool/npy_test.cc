#include "kernels/tool/npy.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

// The bytes NumPy's format.write_array writes (numpy/lib/format.py,
// _wrap_header): magic, version, header length, then the dict text padded
// with spaces and a newline so that the data starts on a multiple of 64.
std::string NumpyBytes(int major, const std::string& dict_text, const std::string& payload) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t unpadded = dict_text.size() + 1;
  const size_t pad = 64 - (8 + length_bytes + unpadded) % 64;
  const size_t header_length = unpadded + pad;
  std::string bytes =
      absl::StrCat("\x93NUMPY", std::string(1, static_cast<char>(major)), std::string(1, '\0'));
  for (size_t i = 0; i < length_bytes; ++i) {
    bytes.push_back(static_cast<char>(header_length >> (8 * i) & 0xff));
  }
  return absl::StrCat(bytes, dict_text, std::string(pad, ' '), "\n", payload);
}

// np.arange(6, dtype='<f4').reshape(2, 3), as NumPy 1.26 writes it: the dict
// is followed by 20 spaces of room for the first axis to grow.
std::string ArangeF4() {
  std::string payload;
  for (int i = 0; i < 6; ++i) {
    const float value = static_cast<float>(i);
    payload.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  return NumpyBytes(
      1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + std::string(20, ' '),
      payload);
}

std::string Int64Payload(std::vector<int64_t> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 8);
}

template <typename T>
void ExpectRoundTrip(std::vector<int64_t> shape, std::vector<T> values) {
  const NpyArray array = NpyArray::FromValues<T>(shape, values);
  const std::string bytes = SerializeNpy(array);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_length = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  EXPECT_EQ((10 + header_length) % 64, 0u);
  EXPECT_EQ(bytes[10 + header_length - 1], '\n');

  absl::StatusOr<NpyArray> parsed = ParseNpy(bytes, "x.npy");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->dtype, NpyDtypeOf<T>());
  EXPECT_EQ(parsed->shape, shape);
  EXPECT_EQ(std::vector<T>(parsed->values<T>().begin(), parsed->values<T>().end()), values);

  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/round_trip.npy");
  ASSERT_TRUE(WriteNpy(path, array).ok());
  absl::StatusOr<NpyArray> read = ReadNpy(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->data, array.data);
  EXPECT_EQ(read->shape, shape);
}

TEST(NpyTest, RoundTripsEveryDtype) {
  ExpectRoundTrip<uint16_t>({2, 2}, {0x3f80, 0xbf80, 0x7fc0, 0x0001});
  ExpectRoundTrip<float>({3}, {1.5f, -2.0f, 1e-30f});
  ExpectRoundTrip<int32_t>({1, 3}, {-1, 0, 2147483647});
  ExpectRoundTrip<int64_t>({2}, {-5000000000LL, 7});
  ExpectRoundTrip<uint8_t>({2, 1, 2}, {0, 255, 128, 7});
}

TEST(NpyTest, RoundTripsScalarsAndEmptyArrays) {
  ExpectRoundTrip<float>({}, {3.0f});
  ExpectRoundTrip<int32_t>({0, 5}, {});
}

TEST(NpyTest, WritesPythonTupleSyntax) {
  const std::string one = SerializeNpy(NpyArray::Zeros(NpyDtype::kInt32, {4}));
  EXPECT_THAT(one, HasSubstr("{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }"));
  const std::string scalar = SerializeNpy(NpyArray::Zeros(NpyDtype::kUint8, {}));
  EXPECT_THAT(scalar, HasSubstr("'shape': ()"));
}

TEST(NpyTest, WritesVersionTwoOnlyWhenTheHeaderNeedsIt) {
  // 30000 axes of size 1: a header too long for version 1.0's 16-bit length.
  const NpyArray array = NpyArray::Zeros(NpyDtype::kUint8, std::vector<int64_t>(30000, 1));
  const std::string bytes = SerializeNpy(array);
  EXPECT_EQ(bytes[6], 2);
  EXPECT_EQ(bytes[7], 0);
  absl::StatusOr<NpyArray> parsed = ParseNpy(bytes, "big.npy");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->shape.size(), 30000u);
}

TEST(NpyTest, ReadsWhatNumpyWrites) {
  const std::string bytes = ArangeF4();
  ASSERT_EQ(bytes.size(), 128u + 24u);  // NumPy's 118-byte header after a 10-byte prefix.
  absl::StatusOr<NpyArray> array = ParseNpy(bytes, "arange.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDtype::kFloat32);
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  EXPECT_THAT(array->values<float>(), ElementsAre(0, 1, 2, 3, 4, 5));
}

TEST(NpyTest, ReadsVersionTwo) {
  const std::string payload("\x01\x00\x02\x00\x03\x00\x04\x00", 8);
  absl::StatusOr<NpyArray> array = ParseNpy(
      NumpyBytes(2, "{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }", payload),
      "v2.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->values<uint16_t>(), ElementsAre(1, 2, 3, 4));
}

TEST(NpyTest, ConvertsInt64ToInt32WhenValuesFit) {
  absl::StatusOr<NpyArray> array =
      ParseNpy(NumpyBytes(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                          Int64Payload({-1, 0, 2147483647})),
               "slots.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  ASSERT_TRUE(ConformNpy("slots.npy", NpyDtype::kInt32, {3}, *array).ok());
  EXPECT_EQ(array->dtype, NpyDtype::kInt32);
  EXPECT_THAT(array->values<int32_t>(), ElementsAre(-1, 0, 2147483647));
}

TEST(NpyTest, RejectsInt64ValuesBeyondInt32) {
  absl::StatusOr<NpyArray> array =
      ParseNpy(NumpyBytes(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                          Int64Payload({1, 5000000000LL})),
               "slots.npy");
  ASSERT_TRUE(array.ok());
  const absl::Status status = ConformNpy("slots.npy", NpyDtype::kInt32, {2}, *array);
  EXPECT_THAT(Message(status), HasSubstr("slots.npy: value 5000000000 at flat index 1"));
}

TEST(NpyTest, NamesExpectedAndFoundDtype) {
  absl::StatusOr<NpyArray> array = ParseNpy(ArangeF4(), "q.npy");
  ASSERT_TRUE(array.ok());
  const absl::Status status = ConformNpy("q.npy", NpyDtype::kUint16, {2, 3}, *array);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), "q.npy: expected dtype <u2 (bf16 bits), found <f4");
}

TEST(NpyTest, NamesExpectedAndFoundShape) {
  absl::StatusOr<NpyArray> array = ParseNpy(ArangeF4(), "q.npy");
  ASSERT_TRUE(array.ok());
  EXPECT_TRUE(ConformNpy("q.npy", NpyDtype::kFloat32, {kAnyDim, 3}, *array).ok());
  const absl::Status status =
      ConformNpy("q.npy", NpyDtype::kFloat32, {kAnyDim, kAnyDim, 512}, *array);
  EXPECT_EQ(Message(status), "q.npy: expected shape [*, *, 512], found [2, 3]");
}

TEST(NpyTest, RejectsTruncatedData) {
  const std::string bytes = ArangeF4();
  const absl::StatusOr<NpyArray> array = ParseNpy(bytes.substr(0, bytes.size() - 3), "q.npy");
  EXPECT_THAT(Message(array.status()),
              HasSubstr("q.npy: shape [2, 3] of <f4 needs 24 bytes of data, the file holds 21 "
                        "(truncated)"));
}

TEST(NpyTest, RejectsTruncatedHeader) {
  for (size_t size : {7, 9, 60}) {
    const absl::StatusOr<NpyArray> array = ParseNpy(ArangeF4().substr(0, size), "q.npy");
    EXPECT_THAT(Message(array.status()), HasSubstr("q.npy: truncated in the header")) << size;
  }
}

TEST(NpyTest, RejectsTrailingBytes) {
  const absl::StatusOr<NpyArray> array = ParseNpy(ArangeF4() + "xx", "q.npy");
  EXPECT_THAT(Message(array.status()), HasSubstr("(trailing bytes)"));
}

TEST(NpyTest, RejectsHugeShapesWithoutAllocating) {
  const absl::StatusOr<NpyArray> array =
      ParseNpy(NumpyBytes(1,
                          "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                          "4294967296, 4294967296), }",
                          ""),
               "huge.npy");
  EXPECT_THAT(Message(array.status()), HasSubstr("needs more bytes of data"));
}

TEST(NpyTest, RejectsBadMagic) {
  std::string bytes = ArangeF4();
  bytes[1] = 'X';
  EXPECT_THAT(Message(ParseNpy(bytes, "q.npy").status()), HasSubstr("q.npy: not a .npy file"));
  EXPECT_THAT(Message(ParseNpy("", "empty.npy").status()), HasSubstr("empty.npy: not a .npy file"));
}

TEST(NpyTest, RejectsUnknownVersions) {
  std::string bytes = ArangeF4();
  bytes[6] = 3;
  EXPECT_THAT(Message(ParseNpy(bytes, "q.npy").status()),
              HasSubstr("version 3.0 is not supported"));
}

TEST(NpyTest, RejectsWhatItCannotRepresent) {
  const struct {
    const char* dict;
    const char* message;
  } kCases[] = {
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", "Fortran-order"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }",
       "big-endian data (>f4) is not supported; save it with a.astype('<f4')"},
      {"{'descr': '|O', 'fortran_order': False, 'shape': (2, 3), }", "object arrays"},
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }",
       "unsupported dtype <f8; expected one of <u2, <f4, <i4, <i8, |u1"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3), }", "structured arrays"},
      {"{'descr': '<f4', 'shape': (2, 3), }", "lacks one of descr, fortran_order, shape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", "shape is not a tuple"},
      {"['descr']", "header is not a dict"},
  };
  for (const auto& c : kCases) {
    const absl::StatusOr<NpyArray> array =
        ParseNpy(NumpyBytes(1, c.dict, std::string(24, '\0')), "x.npy");
    EXPECT_THAT(Message(array.status()), HasSubstr(c.message)) << c.dict;
    EXPECT_THAT(Message(array.status()), HasSubstr("x.npy: ")) << c.dict;
  }
}

TEST(NpyTest, MissingFileIsNotFoundAndNamed) {
  const absl::StatusOr<NpyArray> array =
      ReadNpy(absl::StrCat(std::getenv("TEST_TMPDIR"), "/absent/kv.npy"));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(array.status()), HasSubstr("kv.npy: cannot open"));
}

TEST(NpyTest, ReadNpyAsChecksAfterReading) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/positions.npy");
  ASSERT_TRUE(WriteNpy(path, NpyArray::FromValues<int64_t>({2}, std::vector<int64_t>{3, 4})).ok());
  absl::StatusOr<NpyArray> array = ReadNpyAs(path, NpyDtype::kInt32, {2});
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->values<int32_t>(), ElementsAre(3, 4));
  EXPECT_EQ(Message(ReadNpyAs(path, NpyDtype::kInt32, {3}).status()),
            "positions.npy: expected shape [3], found [2]");
}

}  // namespace
}  // namespace mla
