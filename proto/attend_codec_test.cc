// The attend codec against the generated classes: round trips both ways,
// buffers in many slices, unusual but valid encodings, zero copy and the
// keep-alive of referenced memory. Malformed input: attend_codec_malformed_test.
#include "proto/attend_codec.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/support/slice.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/attend_codec_test_util.h"

namespace mla::wire {
namespace {

using ::mla::wire::testing::BufferWithCuts;
using ::mla::wire::testing::BufferWithRandomCuts;
using ::mla::wire::testing::Fixed32Field;
using ::mla::wire::testing::Fixed64Field;
using ::mla::wire::testing::Flatten;
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
using ::mla::wire::testing::ViewOf;
using ::mla_offload::v1::AttendRequest;
using ::mla_offload::v1::AttendResponse;

constexpr size_t kNoLimit = ~size_t{0};
constexpr size_t kMaxTensorBytes = 3 << 20;

// What the generated class makes of `wire`, and what the codec makes of it
// when it arrives cut at `cuts`; both must agree.
void ExpectRequestParsesLikeGenerated(const std::string& wire,
                                      const std::vector<size_t>& cuts = {}) {
  AttendRequest expected;
  ASSERT_TRUE(expected.ParseFromString(wire));
  expected.DiscardUnknownFields();  // kept by the generated class only
  absl::StatusOr<AttendRequestView> view =
      ParseAttendRequest(BufferWithCuts(wire, cuts), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(SameMessage(expected, ToProto(*view)));
}

void ExpectResponseParsesLikeGenerated(const std::string& wire) {
  AttendResponse expected;
  ASSERT_TRUE(expected.ParseFromString(wire));
  expected.DiscardUnknownFields();
  absl::StatusOr<AttendResponseView> view =
      ParseAttendResponse(BufferWithCuts(wire, {}), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(SameMessage(expected, ToProto(*view)));
}

TEST(AttendCodecTest, RandomRequestsRoundTripBothWays) {
  Rng rng(1);
  for (int i = 0; i < 40; ++i) {
    SCOPED_TRACE(i);
    auto message =
        std::make_shared<AttendRequest>(RandomRequest(rng, kMaxTensorBytes));
    const std::string wire = message->SerializeAsString();

    // Generated -> codec.
    absl::StatusOr<AttendRequestView> parsed =
        ParseAttendRequest(BufferWithRandomCuts(wire, 20, rng), kNoLimit);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(SameMessage(*message, ToProto(*parsed)));

    // Codec -> generated, tensor data in several pieces; the bytes are the
    // generated serializer's.
    const std::string written =
        Flatten(SerializeAttendRequest(ViewOf(*message, message, &rng)));
    EXPECT_EQ(written, wire);
    AttendRequest reparsed;
    ASSERT_TRUE(reparsed.ParseFromString(written));
    EXPECT_TRUE(SameMessage(*message, reparsed));
  }
}

TEST(AttendCodecTest, RandomResponsesRoundTripBothWays) {
  Rng rng(2);
  for (int i = 0; i < 40; ++i) {
    SCOPED_TRACE(i);
    auto message =
        std::make_shared<AttendResponse>(RandomResponse(rng, kMaxTensorBytes));
    const std::string wire = message->SerializeAsString();

    absl::StatusOr<AttendResponseView> parsed =
        ParseAttendResponse(BufferWithRandomCuts(wire, 20, rng), kNoLimit);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(SameMessage(*message, ToProto(*parsed)));
    if (message->has_timing()) {
      // -0.0 equals 0.0 for the differencer; the bits must survive too.
      EXPECT_EQ(std::signbit(parsed->timing->queue_us),
                std::signbit(message->timing().queue_us()));
    }

    const std::string written =
        Flatten(SerializeAttendResponse(ViewOf(*message, message, &rng)));
    EXPECT_EQ(written, wire);
    AttendResponse reparsed;
    ASSERT_TRUE(reparsed.ParseFromString(written));
    EXPECT_TRUE(SameMessage(*message, reparsed));
  }
}

TEST(AttendCodecTest, EmptyMessagesRoundTrip) {
  const std::string wire;
  ExpectRequestParsesLikeGenerated(wire);
  ExpectResponseParsesLikeGenerated(wire);
  EXPECT_EQ(Flatten(SerializeAttendRequest(AttendRequestView())), "");
  EXPECT_EQ(Flatten(SerializeAttendResponse(AttendResponseView())), "");
}

TEST(AttendCodecTest, OneByteSlicesParseLikeOneSlice) {
  Rng rng(3);
  for (int i = 0; i < 30; ++i) {
    const std::string wire = RandomRequest(rng, 300).SerializeAsString();
    std::vector<size_t> cuts(wire.size());
    std::iota(cuts.begin(), cuts.end(), 0);
    ExpectRequestParsesLikeGenerated(wire, cuts);
  }
}

TEST(AttendCodecTest, EveryTwoAndThreeWayCutParses) {
  Rng rng(4);
  AttendRequest message = RandomRequest(rng, 64);
  // Make sure every field kind is there, with multi-byte varints.
  message.set_request_id(~uint64_t{0});
  message.set_layer(-5);
  message.add_segments()->set_session_id("s\xC3\xA9");
  message.mutable_q()->add_shape(300);
  message.mutable_q()->set_data(std::string(40, 'q'));
  const std::string wire = message.SerializeAsString();
  for (size_t a = 0; a <= wire.size(); ++a) {
    ExpectRequestParsesLikeGenerated(wire, {a});
    for (size_t b = a; b <= wire.size(); b += 7) {
      ExpectRequestParsesLikeGenerated(wire, {a, b});
    }
  }
}

TEST(AttendCodecTest, ManyRandomCutsOfLargeMessages) {
  Rng rng(5);
  for (int i = 0; i < 10; ++i) {
    const std::string wire =
        RandomRequest(rng, kMaxTensorBytes).SerializeAsString();
    AttendRequest expected;
    ASSERT_TRUE(expected.ParseFromString(wire));
    absl::StatusOr<AttendRequestView> view =
        ParseAttendRequest(BufferWithRandomCuts(wire, 2000, rng), kNoLimit);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_TRUE(SameMessage(expected, ToProto(*view)));
  }
}

TEST(AttendCodecTest, ShapePackedAndUnpacked) {
  const std::string packed =
      LengthDelimited(2, Varint(3) + Varint(300) + Varint(uint64_t{1} << 40));
  const std::string unpacked =
      VarintField(2, 3) + VarintField(2, 300) + VarintField(2, uint64_t{1} << 40);
  // Both forms, and a mix of them, append in order.
  const std::string mixed = VarintField(2, 3) +
                            LengthDelimited(2, Varint(300)) +
                            VarintField(2, uint64_t{1} << 40);
  for (const std::string& shape : {packed, unpacked, mixed}) {
    const std::string wire =
        LengthDelimited(5, VarintField(1, 1) + shape + LengthDelimited(3, "xy"));
    ExpectRequestParsesLikeGenerated(wire);
    absl::StatusOr<AttendRequestView> view =
        ParseAttendRequest(StaticBuffer(wire), kNoLimit);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_THAT(view->q->shape,
                ::testing::ElementsAre(3, 300, int64_t{1} << 40));
  }
  // An empty packed list is no dimensions at all.
  ExpectRequestParsesLikeGenerated(LengthDelimited(5, LengthDelimited(2, "")));
}

// The parser's memory bounds: a shape of more than kMaxTensorDims
// dimensions, and more segments than the caller allows, are refused at the
// element that breaks the limit (each would cost far more memory than bytes).
TEST(AttendCodecTest, ShapesAndSegmentsAreBounded) {
  std::string dims;
  for (size_t d = 0; d < kMaxTensorDims; ++d) dims += Varint(1);
  const std::string longest = LengthDelimited(5, LengthDelimited(2, dims));
  absl::StatusOr<AttendRequestView> view = ParseAttendRequest(StaticBuffer(longest), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->q->shape.size(), kMaxTensorDims);
  const std::string too_long = LengthDelimited(5, LengthDelimited(2, dims + Varint(1)));
  view = ParseAttendRequest(StaticBuffer(too_long), kNoLimit);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(view.status().message()),
              ::testing::HasSubstr("AttendRequest.q.shape[8]: more than 8 dimensions"));

  const std::string segment = LengthDelimited(3, VarintField(3, 1));
  const std::string three = segment + segment + segment;
  view = ParseAttendRequest(StaticBuffer(three), kNoLimit, 3);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->segments.size(), 3u);
  view = ParseAttendRequest(StaticBuffer(three + VarintField(2, 4) + segment), kNoLimit, 3);
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(view.status().message()),
              ::testing::HasSubstr("AttendRequest.segments: more than 3 segments"));
}

// Unknown fields of every wire type, groups nested in groups included.
std::string UnknownFields(uint32_t field) {
  return VarintField(field, ~uint64_t{0}) + Fixed64Field(field + 1, 42) +
         LengthDelimited(field + 2, "ignored") + Fixed32Field(field + 3, 7) +
         Key(field + 4, WireType::kStartGroup) + VarintField(1, 5) +
         Key(2, WireType::kStartGroup) + LengthDelimited(3, "x") +
         Key(2, WireType::kEndGroup) + Key(field + 4, WireType::kEndGroup);
}

TEST(AttendCodecTest, UnknownFieldsOfEveryWireTypeAreSkipped) {
  const std::string tensor = UnknownFields(10) + VarintField(1, 2) +
                             UnknownFields(20) + VarintField(2, 4) +
                             LengthDelimited(3, "abcd") + UnknownFields(99);
  const std::string segment = LengthDelimited(1, "s") + UnknownFields(6) +
                              VarintField(3, 2);
  const std::string timing =
      Fixed64Field(1, 0x3ff0000000000000) + UnknownFields(1000);
  ExpectRequestParsesLikeGenerated(
      UnknownFields(15) + VarintField(1, 9) + LengthDelimited(3, segment) +
      UnknownFields(536870900) + LengthDelimited(5, tensor) +
      UnknownFields(50));
  const std::string status =
      UnknownFields(3) + VarintField(1, 5) + LengthDelimited(2, "why");
  ExpectResponseParsesLikeGenerated(
      UnknownFields(7) + LengthDelimited(2, tensor) +
      LengthDelimited(4, timing) + LengthDelimited(5, status));
}

TEST(AttendCodecTest, FieldsOutOfOrderAndRepeatedMergeLikeProtobuf) {
  const std::string wire =
      VarintField(10, 1) +                                      // derotate
      LengthDelimited(5, VarintField(1, 1) + VarintField(2, 4) +
                             LengthDelimited(3, "first")) +     // q
      LengthDelimited(3, LengthDelimited(1, "a") + VarintField(2, 7)) +
      VarintField(2, 3) +                                       // layer
      VarintField(1, 100) + VarintField(1, 200) +               // request_id
      LengthDelimited(3, VarintField(2, 8) + LengthDelimited(1, "b")) +
      // q again: dtype replaced, shape appended, data replaced.
      LengthDelimited(5, LengthDelimited(3, "second") + VarintField(2, 5) +
                             VarintField(1, 2)) +
      VarintField(2, 4) +
      // q a third time without data: the data stays.
      LengthDelimited(5, VarintField(2, 6)) +
      // A segment whose fields repeat inside it.
      LengthDelimited(3, LengthDelimited(1, "c") + LengthDelimited(1, "d") +
                             VarintField(3, 1) + VarintField(3, 9));
  ExpectRequestParsesLikeGenerated(wire);
  absl::StatusOr<AttendRequestView> view =
      ParseAttendRequest(StaticBuffer(wire), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->request_id, 200u);
  EXPECT_EQ(view->layer, 4);
  ASSERT_EQ(view->segments.size(), 3u);
  EXPECT_EQ(view->segments[2].session_id, "d");
  EXPECT_EQ(view->segments[2].num_tokens, 9);
  EXPECT_EQ(view->q->dtype, DType::kF32);
  EXPECT_THAT(view->q->shape, ::testing::ElementsAre(4, 5, 6));
  EXPECT_EQ(view->q->size_bytes(), 6u);

  const std::string response =
      LengthDelimited(4, Fixed64Field(1, 0x4000000000000000)) +
      VarintField(1, 1) +
      LengthDelimited(4, Fixed64Field(2, 0x3ff0000000000000) +
                             VarintField(5, 3)) +
      LengthDelimited(5, LengthDelimited(2, "first")) +
      LengthDelimited(5, VarintField(1, 3));
  ExpectResponseParsesLikeGenerated(response);
}

// Region references (the same-host data plane): a tensor's and the
// answer's, repeated ones merged field by field as protobuf merges them,
// negative numbers kept as they came (the server checks them), and written
// back as the generated class writes them.
TEST(AttendCodecTest, RegionReferencesParseAndMergeLikeProtobuf) {
  const std::string wire =
      LengthDelimited(5, VarintField(1, 1) +
                             LengthDelimited(4, VarintField(1, 7) + VarintField(2, 64))) +
      LengthDelimited(11, VarintField(1, 9) + VarintField(3, 4096)) +
      // out_region again: byte_size replaced, offset added.
      LengthDelimited(11, VarintField(3, 2048) +
                              VarintField(2, static_cast<uint64_t>(int64_t{-2}))) +
      LengthDelimited(12, "") +
      // q's region again: its id replaced, its offset kept.
      LengthDelimited(5, LengthDelimited(4, VarintField(1, 8)));
  ExpectRequestParsesLikeGenerated(wire);
  absl::StatusOr<AttendRequestView> view = ParseAttendRequest(StaticBuffer(wire), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(view->q.has_value() && view->q->region.has_value());
  EXPECT_EQ(view->q->region->region_id, 8u);
  EXPECT_EQ(view->q->region->offset, 64);
  EXPECT_TRUE(view->q->pieces.empty());
  ASSERT_TRUE(view->out_region.has_value());
  EXPECT_EQ(view->out_region->region_id, 9u);
  EXPECT_EQ(view->out_region->offset, -2);
  EXPECT_EQ(view->out_region->byte_size, 2048);
  ASSERT_TRUE(view->lse_region.has_value()) << "an empty reference is present";
  EXPECT_EQ(view->lse_region->region_id, 0u);
  EXPECT_FALSE(view->kv.has_value());

  AttendRequest expected;
  ASSERT_TRUE(expected.ParseFromString(wire));
  EXPECT_EQ(Flatten(SerializeAttendRequest(*view)), expected.SerializeAsString());
}

// The FP8 output (fields 13 and 14 of the request, 6 of the response):
// written as the generated class writes them, in field order (out_scales
// after the status), and parsed in any order, repeated ones merged.
TEST(AttendCodecTest, Fp8OutputFieldsRoundTripLikeGenerated) {
  AttendRequest request;
  request.set_request_id(5);
  request.set_return_lse(true);
  request.set_fp8_output(true);
  request.mutable_out_region()->set_region_id(3);
  request.mutable_out_region()->set_byte_size(512);
  request.mutable_out_scales_region()->set_region_id(3);
  request.mutable_out_scales_region()->set_offset(512);
  request.mutable_out_scales_region()->set_byte_size(4);
  const std::string request_wire = request.SerializeAsString();
  absl::StatusOr<AttendRequestView> parsed =
      ParseAttendRequest(StaticBuffer(request_wire), kNoLimit);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->fp8_output);
  ASSERT_TRUE(parsed->out_scales_region.has_value());
  EXPECT_EQ(parsed->out_scales_region->offset, 512);
  EXPECT_EQ(parsed->out_scales_region->byte_size, 4);
  EXPECT_EQ(Flatten(SerializeAttendRequest(*parsed)), request_wire);

  AttendResponse response;
  response.set_request_id(5);
  response.mutable_out()->set_dtype(mla_offload::v1::DTYPE_E4M3FN);
  for (int64_t dim : {1, 1, 512}) response.mutable_out()->add_shape(dim);
  response.mutable_out()->set_data(std::string(512, '\x38'));
  response.mutable_status()->set_message("");
  response.mutable_out_scales()->set_dtype(mla_offload::v1::DTYPE_UE8M0);
  for (int64_t dim : {1, 1, 4}) response.mutable_out_scales()->add_shape(dim);
  response.mutable_out_scales()->set_data("\x7f\x69\x80\x01");
  auto shared = std::make_shared<AttendResponse>(response);
  const std::string response_wire = response.SerializeAsString();
  EXPECT_EQ(Flatten(SerializeAttendResponse(ViewOf(*shared, shared))), response_wire);
  absl::StatusOr<AttendResponseView> view =
      ParseAttendResponse(StaticBuffer(response_wire), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE(view->out_scales.has_value());
  EXPECT_EQ(view->out_scales->dtype, DType::kUe8m0);
  EXPECT_EQ(DTypeSize(view->out_scales->dtype), 1u);
  EXPECT_EQ(view->out->dtype, DType::kE4m3fn);
  EXPECT_TRUE(CheckTensor(view->out_scales, "out_scales", DType::kUe8m0, {1, 1, 4}).ok());
  EXPECT_TRUE(CheckTensor(view->out, "out", DType::kE4m3fn, {1, 1, 512}).ok());

  // Out of order and repeated: out_scales before out, its data replaced;
  // out_scales_region before fp8_output, merged.
  ExpectResponseParsesLikeGenerated(
      LengthDelimited(6, VarintField(1, 5) + LengthDelimited(3, "ab")) +
      LengthDelimited(2, VarintField(1, 4)) + LengthDelimited(6, LengthDelimited(3, "cdef")));
  const std::string shuffled = LengthDelimited(14, VarintField(2, 8)) + VarintField(13, 1) +
                               VarintField(2, 3) + LengthDelimited(14, VarintField(3, 12));
  ExpectRequestParsesLikeGenerated(shuffled);
  absl::StatusOr<AttendRequestView> merged = ParseAttendRequest(StaticBuffer(shuffled), kNoLimit);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_TRUE(merged->fp8_output);
  ASSERT_TRUE(merged->out_scales_region.has_value());
  EXPECT_EQ(merged->out_scales_region->offset, 8);
  EXPECT_EQ(merged->out_scales_region->byte_size, 12);
}

TEST(AttendCodecTest, NonCanonicalButValidEncodings) {
  // Over-long varints (still at most 10 bytes), negative int32 in 10 bytes,
  // bool values other than 1, and an int32 from a value above 32 bits keep
  // the low bits as protobuf does.
  const std::string wire =
      Key(2, WireType::kVarint) +
      std::string("\x85\x80\x80\x80\x80\x80\x80\x80\x80\x00", 10) +
      VarintField(4, static_cast<uint64_t>(int64_t{-7})) +
      VarintField(9, 256) + VarintField(10, uint64_t{1} << 40) +
      LengthDelimited(3, VarintField(2, 0x1'0000'0005));
  ExpectRequestParsesLikeGenerated(wire);
}

TEST(AttendCodecTest, UnknownDtypeIsKept) {
  const std::string wire = LengthDelimited(
      6, VarintField(1, static_cast<uint64_t>(int64_t{-3})) +
             LengthDelimited(3, "ab"));
  ExpectRequestParsesLikeGenerated(wire);
  absl::StatusOr<AttendRequestView> view =
      ParseAttendRequest(StaticBuffer(wire), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(static_cast<int>(view->kv->dtype), -3);
}

// Parsing hands out pieces of the received slices: they point into the
// original bytes, at the offset of the data in the message.
TEST(AttendCodecTest, ParsedTensorsPointIntoTheReceivedBytes) {
  Rng rng(6);
  AttendRequest message;
  message.mutable_q()->set_dtype(mla_offload::v1::DTYPE_BF16);
  message.mutable_q()->add_shape(1 << 20);
  message.mutable_q()->set_data(RandomBytes(2 << 20, rng));
  message.mutable_topk()->set_data(RandomBytes(1000, rng));
  const std::string wire = message.SerializeAsString();

  absl::StatusOr<AttendRequestView> view =
      ParseAttendRequest(StaticBuffer(wire), kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  std::optional<Piece> q = view->q->contiguous();
  ASSERT_TRUE(q.has_value());
  const auto* begin = reinterpret_cast<const uint8_t*>(wire.data());
  EXPECT_EQ(q->data(), begin + wire.find(message.q().data()));
  EXPECT_EQ(q->size(), 2u << 20);

  // Cut into many refcounted slices: every piece lies inside one of them,
  // and the pieces are those slices' memory, not copies.
  const grpc::ByteBuffer buffer = BufferWithRandomCuts(wire, 100, rng);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  view = ParseAttendRequest(buffer, kNoLimit);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_GT(view->q->pieces.size(), 1u);
  for (const TensorView* tensor : {&*view->q, &*view->topk}) {
    for (const Piece& piece : tensor->pieces) {
      const bool inside = std::any_of(
          slices.begin(), slices.end(), [&piece](const grpc::Slice& slice) {
            return piece.data() >= slice.begin() &&
                   piece.data() + piece.size() <= slice.end();
          });
      EXPECT_TRUE(inside);
    }
  }
  std::string copy(view->q->size_bytes(), '\0');
  view->q->CopyTo(copy.data());
  EXPECT_EQ(copy, message.q().data());
  EXPECT_FALSE(view->q->contiguous().has_value());
}

TEST(AttendCodecTest, ParsedViewsOutliveTheBuffer) {
  Rng rng(7);
  const AttendRequest message = RandomRequest(rng, 5000);
  std::optional<TensorView> kv;
  {
    // Small slices are inlined in grpc_slice itself: the view must hold
    // the slice objects, not only their refcounts.
    const std::string wire = message.SerializeAsString();
    std::vector<size_t> cuts;
    for (size_t i = 0; i < wire.size(); i += 5) cuts.push_back(i);
    grpc::ByteBuffer buffer = BufferWithCuts(wire, cuts);
    absl::StatusOr<AttendRequestView> view =
        ParseAttendRequest(buffer, kNoLimit);
    ASSERT_TRUE(view.ok()) << view.status();
    kv = view->kv;
  }
  ASSERT_EQ(kv.has_value(), message.has_kv());
  if (kv) {
    std::string data(kv->size_bytes(), '\0');
    kv->CopyTo(data.data());
    EXPECT_EQ(data, message.kv().data());
  }
}

// Counts how often the memory a response references is released.
struct Released {
  std::atomic<int> count{0};
};

std::shared_ptr<const void> CountingKeepAlive(std::vector<uint8_t>* memory,
                                              Released* released) {
  return std::shared_ptr<const void>(
      memory->data(), [released](const void*) { ++released->count; });
}

TEST(AttendCodecTest, ResponseReferencesCallerMemoryUntilFreed) {
  std::vector<uint8_t> out(3 << 20);
  std::vector<uint8_t> lse(4096);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = static_cast<uint8_t>(i);
  Released released;
  std::optional<grpc::ByteBuffer> buffer;
  {
    std::shared_ptr<const void> keep_alive = CountingKeepAlive(&out, &released);
    AttendResponseView response;
    response.request_id = 77;
    response.out = MakeTensorView(DType::kBf16, {3, 1 << 19}, out.data(),
                                  out.size(), keep_alive);
    // The lse in two pieces, guarded by the same keep-alive.
    response.lse =
        MakeTensorView(DType::kF32, {1024}, lse.data(), 1000, keep_alive);
    response.lse->pieces.emplace_back(lse.data() + 1000, lse.size() - 1000);
    response.timing = TimingView{1, 2, 3, 4, 5};
    buffer = SerializeAttendResponse(response);
  }
  EXPECT_EQ(released.count, 0);

  // The slices are the caller's memory, not copies of it.
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer->Dump(&slices).ok());
  const auto references = [&slices](const uint8_t* data, size_t size) {
    return std::any_of(slices.begin(), slices.end(),
                       [&](const grpc::Slice& slice) {
                         return slice.begin() == data && slice.size() == size;
                       });
  };
  EXPECT_TRUE(references(out.data(), out.size()));
  EXPECT_TRUE(references(lse.data(), 1000));
  EXPECT_TRUE(references(lse.data() + 1000, lse.size() - 1000));
  slices.clear();

  AttendResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(*buffer)));
  EXPECT_EQ(parsed.request_id(), 77u);
  EXPECT_EQ(parsed.out().data(),
            std::string(out.begin(), out.end()));
  EXPECT_EQ(parsed.lse().data(), std::string(lse.begin(), lse.end()));
  EXPECT_EQ(parsed.timing().batch_tokens(), 5);

  // A copy of the buffer shares the slices: the memory is released once,
  // when the last of them goes.
  std::optional<grpc::ByteBuffer> copy = *buffer;
  buffer.reset();
  EXPECT_EQ(released.count, 0);
  copy.reset();
  EXPECT_EQ(released.count, 1);
}

TEST(AttendCodecTest, RequestReferencesCallerMemoryToo) {
  std::vector<uint8_t> q(1 << 20, 0x5A);
  Released released;
  std::optional<grpc::ByteBuffer> buffer;
  {
    AttendRequestView request;
    request.segments.push_back(SegmentView{"session", 10, 4, 0, 0});
    request.q = MakeTensorView(DType::kBf16, {4, 1, 131072}, q.data(), q.size(),
                               CountingKeepAlive(&q, &released));
    buffer = SerializeAttendRequest(request);
  }
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer->Dump(&slices).ok());
  EXPECT_TRUE(std::any_of(slices.begin(), slices.end(),
                          [&q](const grpc::Slice& slice) {
                            return slice.begin() == q.data();
                          }));
  slices.clear();
  absl::StatusOr<AttendRequestView> parsed =
      ParseAttendRequest(*buffer, kNoLimit);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->q->contiguous()->data(), q.data());
  EXPECT_EQ(parsed->segments[0].session_id, "session");
  buffer.reset();
  // The parsed view holds the slices, which hold the caller's memory.
  EXPECT_EQ(released.count, 0);
  parsed = absl::UnknownError("dropped");
  EXPECT_EQ(released.count, 1);
}

TEST(AttendCodecTest, TensorWithoutKeepAliveIsCopied) {
  std::vector<uint8_t> data(100000, 3);
  AttendResponseView response;
  response.out =
      MakeTensorView(DType::kBf16, {50000}, data.data(), data.size(), nullptr);
  grpc::ByteBuffer buffer = SerializeAttendResponse(response);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  for (const grpc::Slice& slice : slices) {
    EXPECT_FALSE(slice.begin() >= data.data() &&
                 slice.begin() < data.data() + data.size());
  }
  data.assign(data.size(), 0);
  AttendResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.out().data(), std::string(100000, 3));
}

}  // namespace
}  // namespace mla::wire
