// The attend codec on malformed and hostile bytes: each kind of damage is an
// InvalidArgument naming the field, and thousands of random mutations of
// valid messages never crash the parser nor make it disagree with the
// generated classes.
#include <random>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/attend_codec.h"
#include "proto/attend_codec_test_util.h"

namespace mla::wire {
namespace {

using ::mla::wire::testing::BufferWithRandomCuts;
using ::mla::wire::testing::Fixed64Field;
using ::mla::wire::testing::Key;
using ::mla::wire::testing::LengthDelimited;
using ::mla::wire::testing::RandomBytes;
using ::mla::wire::testing::RandomRequest;
using ::mla::wire::testing::RandomResponse;
using ::mla::wire::testing::Rng;
using ::mla::wire::testing::SameMessage;
using ::mla::wire::testing::StaticBuffer;
using ::mla::wire::testing::ToProto;
using ::mla::wire::testing::Varint;
using ::mla::wire::testing::VarintField;
using ::mla_offload::v1::AttendRequest;
using ::mla_offload::v1::AttendResponse;

constexpr size_t kNoLimit = ~size_t{0};

std::string Repeat(const std::string& part, int times) {
  std::string result;
  for (int i = 0; i < times; ++i) result += part;
  return result;
}

struct Malformed {
  const char* name;
  std::string wire;
  std::string message;  // the whole error message
  bool response = false;
};

std::vector<Malformed> MalformedCases() {
  const std::string negative_three =
      Varint(static_cast<uint64_t>(int64_t{-3}));
  return {
      {"TruncatedVarint", Key(2, WireType::kVarint) + "\x80",
       "AttendRequest.layer: truncated varint"},
      {"TruncatedLength", Key(5, WireType::kLengthDelimited) + "\x80",
       "AttendRequest.q: truncated varint"},
      {"TruncatedTag", VarintField(2, 1) + "\x88",
       "AttendRequest: truncated tag"},
      {"LengthPastTheBuffer",
       Key(5, WireType::kLengthDelimited) + Varint(100) + "abc",
       "AttendRequest.q: length 100 runs past the end of the message (3 "
       "bytes left)"},
      {"LengthPastTheEnclosingMessage",
       LengthDelimited(5, Key(3, WireType::kLengthDelimited) + Varint(10) +
                              "ab") +
           std::string(20, 'x'),
       "AttendRequest.q.data: length 10 runs past the end of the message (2 "
       "bytes left)"},
      {"HugeLength", Key(6, WireType::kLengthDelimited) + Varint(~uint64_t{0}),
       "AttendRequest.kv: length 18446744073709551615 runs past the end of "
       "the message (0 bytes left)"},
      {"ScalarAsLengthDelimited", LengthDelimited(2, "x"),
       "AttendRequest.layer: wire type 2 (length-delimited) where varint is "
       "expected"},
      {"TensorAsVarint", VarintField(5, 1),
       "AttendRequest.q: wire type 0 (varint) where length-delimited is "
       "expected"},
      {"TensorAsGroup",
       Key(7, WireType::kStartGroup) + Key(7, WireType::kEndGroup),
       "AttendRequest.compressed_kv: wire type 3 (start-group) where "
       "length-delimited is expected"},
      {"ShapeAsFixed64", LengthDelimited(8, Fixed64Field(2, 1)),
       "AttendRequest.topk.shape: wire type 1 (fixed64) where varint or "
       "length-delimited (packed) is expected"},
      {"DataAsVarint", LengthDelimited(5, VarintField(3, 1)),
       "AttendRequest.q.data: wire type 0 (varint) where length-delimited is "
       "expected"},
      {"SessionIdAsVarint",
       LengthDelimited(3, "") + LengthDelimited(3, VarintField(1, 1)),
       "AttendRequest.segments[1].session_id: wire type 0 (varint) where "
       "length-delimited is expected"},
      {"DoubleAsVarint", LengthDelimited(4, VarintField(3, 1)),
       "AttendResponse.timing.decode_us: wire type 0 (varint) where fixed64 "
       "is expected",
       true},
      {"TruncatedDouble",
       LengthDelimited(4, Key(1, WireType::kFixed64) + "1234"),
       "AttendResponse.timing.queue_us: truncated fixed64", true},
      {"VarintOver10Bytes",
       Key(1, WireType::kVarint) + std::string(10, '\xFF') + "\x01",
       "AttendRequest.request_id: varint longer than 10 bytes"},
      {"VarintOver10BytesInShape",
       LengthDelimited(5, LengthDelimited(2, Varint(1) +
                                                 std::string(11, '\x80') +
                                                 "\x01")),
       "AttendRequest.q.shape[1]: varint longer than 10 bytes"},
      {"TagOver5Bytes", std::string("\x88\x80\x80\x80\x80\x00", 6),
       "AttendRequest: tag longer than 5 bytes"},
      {"TagAbove32Bits", "\xF8\xFF\xFF\xFF\x7F",
       "AttendRequest: tag 34359738360 does not fit 32 bits"},
      {"FieldNumberZero", std::string("\x00\x01", 2),
       "AttendRequest: field number 0"},
      {"WireType6", Varint((20 << 3) | 6), "AttendRequest: invalid wire type 6 "
                                            "(field 20)"},
      {"WireType7InTensor", LengthDelimited(5, Varint((1 << 3) | 7)),
       "AttendRequest.q: invalid wire type 7 (field 1)"},
      {"TruncatedUnknownFixed32",
       Key(20, WireType::kFixed32) + "12",
       "AttendRequest: truncated fixed32 (field 20)"},
      {"EndGroupWithoutStart", Key(17, WireType::kEndGroup),
       "AttendRequest: end-group tag of field 17 without a start-group"},
      {"MismatchedEndGroup",
       Key(17, WireType::kStartGroup) + Key(18, WireType::kEndGroup),
       "AttendRequest: end-group tag of field 18 inside the group of field "
       "17"},
      {"UnterminatedGroup", Key(17, WireType::kStartGroup) + VarintField(1, 1),
       "AttendRequest: group of field 17 has no end-group tag"},
      {"GroupCrossingTheEnclosingMessage",
       LengthDelimited(5, Key(17, WireType::kStartGroup)) +
           Key(17, WireType::kEndGroup),
       "AttendRequest.q: group of field 17 has no end-group tag"},
      {"GroupsNestedTooDeep",
       Repeat(Key(17, WireType::kStartGroup), 40) +
           Repeat(Key(17, WireType::kEndGroup), 40),
       "AttendRequest: groups nested deeper than 32 (field 17)"},
      {"NegativeDimensionPacked",
       LengthDelimited(5, LengthDelimited(2, Varint(4) + negative_three)),
       "AttendRequest.q.shape[1]: negative dimension -3"},
      {"NegativeDimensionUnpacked",
       LengthDelimited(2, VarintField(2, 4) + VarintField(2, 5) +
                              Key(2, WireType::kVarint) + negative_three),
       "AttendResponse.out.shape[2]: negative dimension -3", true},
      {"OverlongUtf8",
       LengthDelimited(3, LengthDelimited(1, "ok")) +
           LengthDelimited(3, LengthDelimited(1, "\xC0\x80")),
       "AttendRequest.segments[1].session_id: not valid UTF-8"},
      {"SurrogateUtf8", LengthDelimited(3, LengthDelimited(1, "\xED\xA0\x80")),
       "AttendRequest.segments[0].session_id: not valid UTF-8"},
      {"Utf8AboveU10FFFF",
       LengthDelimited(3, LengthDelimited(1, "\xF4\x90\x80\x80")),
       "AttendRequest.segments[0].session_id: not valid UTF-8"},
      {"StatusMessageNotUtf8",
       LengthDelimited(5, VarintField(1, 3) + LengthDelimited(2, "\xFF")),
       "AttendResponse.status.message: not valid UTF-8", true},
      {"StatusCodeAsFixed32",
       LengthDelimited(5, Key(1, WireType::kFixed32) + "abcd"),
       "AttendResponse.status.code: wire type 5 (fixed32) where varint is "
       "expected",
       true},
      {"TruncatedUtf8", LengthDelimited(3, LengthDelimited(1, "ab\xE6\xBC")),
       "AttendRequest.segments[0].session_id: not valid UTF-8"},
      {"Fp8OutputAsLengthDelimited", LengthDelimited(13, "\x01"),
       "AttendRequest.fp8_output: wire type 2 (length-delimited) where varint "
       "is expected"},
      {"TruncatedFp8Output", Key(13, WireType::kVarint) + "\x80",
       "AttendRequest.fp8_output: truncated varint"},
      {"OutScalesRegionAsVarint", VarintField(14, 4),
       "AttendRequest.out_scales_region: wire type 0 (varint) where "
       "length-delimited is expected"},
      {"OutScalesRegionOffsetAsFixed64",
       LengthDelimited(14, Fixed64Field(2, 4)),
       "AttendRequest.out_scales_region.offset: wire type 1 (fixed64) where "
       "varint is expected"},
      {"OutScalesAsVarint", VarintField(6, 1),
       "AttendResponse.out_scales: wire type 0 (varint) where "
       "length-delimited is expected",
       true},
      {"OutScalesNegativeDimension",
       LengthDelimited(6, LengthDelimited(2, Varint(2) + negative_three)),
       "AttendResponse.out_scales.shape[1]: negative dimension -3", true},
      {"OutScalesDataPastTheMessage",
       LengthDelimited(6, Key(3, WireType::kLengthDelimited) + Varint(9) +
                              "abcd"),
       "AttendResponse.out_scales.data: length 9 runs past the end of the "
       "message (4 bytes left)",
       true},
  };
}

class MalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedTest, IsInvalidArgumentNamingTheField) {
  const Malformed& malformed = GetParam();
  const grpc::ByteBuffer buffer = StaticBuffer(malformed.wire);
  const absl::Status status =
      malformed.response ? ParseAttendResponse(buffer, kNoLimit).status()
                         : ParseAttendRequest(buffer, kNoLimit).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), malformed.message);
}

INSTANTIATE_TEST_SUITE_P(
    AttendCodec, MalformedTest, ::testing::ValuesIn(MalformedCases()),
    [](const ::testing::TestParamInfo<Malformed>& info) {
      return std::string(info.param.name);
    });

TEST(AttendCodecMalformedTest, MessageOverTheLimit) {
  const std::string wire =
      LengthDelimited(5, LengthDelimited(3, std::string(994, 'x')));
  ASSERT_EQ(wire.size(), 1000u);
  EXPECT_TRUE(ParseAttendRequest(StaticBuffer(wire), 1000).ok());
  const absl::Status status =
      ParseAttendRequest(StaticBuffer(wire), 999).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "AttendRequest: message of 1000 bytes exceeds the limit of 999 "
            "bytes");
  EXPECT_EQ(ParseAttendResponse(StaticBuffer(wire), 10).status().message(),
            "AttendResponse: message of 1000 bytes exceeds the limit of 10 "
            "bytes");
}

TEST(AttendCodecMalformedTest, UninitialisedBuffer) {
  const absl::Status status =
      ParseAttendRequest(grpc::ByteBuffer(), kNoLimit).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "AttendRequest: no message (uninitialised ByteBuffer)");
}

// An unknown dtype is not a wire error (proto3 enums are open): the value
// comes through and CheckTensor names it.
TEST(AttendCodecMalformedTest, UnknownDtypeIsLeftToCheckTensor) {
  const std::string wire = LengthDelimited(
      5, VarintField(1, 9) + VarintField(2, 1) + LengthDelimited(3, "ab"));
  absl::StatusOr<AttendRequestView> view =
      ParseAttendRequest(StaticBuffer(wire), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(static_cast<int>(view->q->dtype), 9);
  EXPECT_EQ(
      CheckTensor(view->q, "AttendRequest.q", DType::kBf16, {1}).message(),
      "AttendRequest.q: expected bf16 [1], got dtype 9 [1]");
}

// Damages `wire` in one of several ways that hit tags, lengths and varints.
void Mutate(Rng& rng, std::string* wire) {
  const auto position = [&rng](size_t size) {
    return std::uniform_int_distribution<size_t>(0, size)(rng);
  };
  switch (std::uniform_int_distribution<int>(0, 6)(rng)) {
    case 0:  // flip a bit
      if (!wire->empty()) {
        (*wire)[position(wire->size() - 1)] ^=
            static_cast<char>(1 << (rng() % 8));
      }
      break;
    case 1:  // replace a byte
      if (!wire->empty()) {
        (*wire)[position(wire->size() - 1)] = static_cast<char>(rng());
      }
      break;
    case 2:  // truncate
      wire->resize(position(wire->size()));
      break;
    case 3:  // insert random bytes
      wire->insert(position(wire->size()),
                   RandomBytes(1 + rng() % 8, rng));
      break;
    case 4: {  // delete a range
      const size_t begin = position(wire->size());
      wire->erase(begin, 1 + rng() % 8);
      break;
    }
    case 5: {  // duplicate a range (repeated fields, merges)
      const size_t begin = position(wire->size());
      const std::string range = wire->substr(begin, 1 + rng() % 32);
      wire->insert(position(wire->size()), range);
      break;
    }
    case 6:  // a run of continuation bytes (long varints)
      wire->insert(position(wire->size()), std::string(1 + rng() % 12, '\xFF'));
      break;
  }
}

// What the codec accepts the generated class accepts, with the same result;
// what only the generated class accepts is one of the codec's documented
// strictnesses.
template <typename Message, typename View>
void CheckAgainstGenerated(const std::string& wire,
                           const absl::StatusOr<View>& view) {
  Message expected;
  const bool generated_ok = expected.ParseFromString(wire);
  if (view.ok()) {
    ASSERT_TRUE(generated_ok);
    expected.DiscardUnknownFields();  // kept by the generated class only
    EXPECT_TRUE(SameMessage(expected, ToProto(*view)));
    return;
  }
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(view.status().message()),
              ::testing::StartsWith(Message::descriptor()->name()));
  if (generated_ok) {
    EXPECT_THAT(std::string(view.status().message()),
                ::testing::AnyOf(::testing::HasSubstr(" is expected"),
                                 ::testing::HasSubstr("negative dimension"),
                                 ::testing::HasSubstr("dimensions"),
                                 ::testing::HasSubstr("nested deeper"),
                                 ::testing::HasSubstr("does not fit 32 bits")));
  }
}

TEST(AttendCodecMalformedTest, RandomMutationsNeverCrash) {
  // Invalid UTF-8 makes the generated parser log; the failure is what counts.
  google::protobuf::LogSilencer silence_generated_parser;
  Rng rng(11);
  int accepted = 0;
  constexpr int kIterations = 20000;
  for (int i = 0; i < kIterations; ++i) {
    SCOPED_TRACE(i);
    const bool response = i % 2 == 1;
    std::string wire = response ? RandomResponse(rng, 64).SerializeAsString()
                                : RandomRequest(rng, 64).SerializeAsString();
    if (rng() % 4 == 0) {
      // Groups to damage, before or after the known fields.
      const std::string group =
          Key(30, WireType::kStartGroup) + VarintField(1, 7) +
          Key(31, WireType::kStartGroup) + Key(31, WireType::kEndGroup) +
          Key(30, WireType::kEndGroup);
      wire = rng() % 2 ? group + wire : wire + group;
    }
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) Mutate(rng, &wire);
    const grpc::ByteBuffer buffer = BufferWithRandomCuts(wire, rng() % 8, rng);
    if (response) {
      const absl::StatusOr<AttendResponseView> view =
          ParseAttendResponse(buffer, kNoLimit);
      accepted += view.ok();
      CheckAgainstGenerated<AttendResponse>(wire, view);
    } else {
      const absl::StatusOr<AttendRequestView> view =
          ParseAttendRequest(buffer, kNoLimit);
      accepted += view.ok();
      CheckAgainstGenerated<AttendRequest>(wire, view);
    }
    if (HasFatalFailure()) return;
  }
  RecordProperty("accepted", accepted);
  // Both outcomes must be exercised for the comparison to mean anything.
  EXPECT_GT(accepted, kIterations / 20);
  EXPECT_LT(accepted, kIterations * 19 / 20);
}

}  // namespace
}  // namespace mla::wire
