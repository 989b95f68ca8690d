// Tests of proto/unary_codec.h against the generated classes.
#include "proto/unary_codec.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/mla_offload.pb.h"

namespace mla::wire {
namespace {

namespace pb = ::mla_offload::v1;
using ::testing::HasSubstr;

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

pb::AppendKVRequest SomeAppend() {
  pb::AppendKVRequest request;
  request.set_session_id("abc");
  request.set_first_position(7);
  request.set_num_positions(2);
  for (int layer = 0; layer < 3; ++layer) {
    pb::LayerRows* rows = request.add_layers();
    rows->set_layer(layer);
    rows->mutable_swa_kv()->set_dtype(pb::DTYPE_BF16);
    rows->mutable_swa_kv()->add_shape(2);
    rows->mutable_swa_kv()->add_shape(512);
    rows->mutable_swa_kv()->set_data(std::string(2048, static_cast<char>(layer + 1)));
  }
  return request;
}

TEST(UnaryCodecTest, RoundTripsWhatTheGeneratedClassWrites) {
  const pb::AppendKVRequest request = SomeAppend();
  const grpc::ByteBuffer buffer = SerializeUnaryMessage(request);
  EXPECT_EQ(buffer.Length(), request.ByteSizeLong());
  pb::AppendKVRequest parsed;
  ASSERT_TRUE(ParseUnaryMessage(buffer, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), request.SerializeAsString());
}

TEST(UnaryCodecTest, TheEmptyBufferIsTheEmptyMessage) {
  pb::CreateSessionRequest parsed;
  parsed.set_model("left over");
  ASSERT_TRUE(ParseUnaryMessage(BufferOf(""), &parsed).ok());
  EXPECT_EQ(parsed.model(), "");
  EXPECT_FALSE(ParseUnaryMessage(grpc::ByteBuffer(), &parsed).ok());
}

struct BadCase {
  std::string name;
  std::string bytes;
  std::string error;  // a substring of the message
};

TEST(UnaryCodecTest, NamesTheFieldThatDidNotParse) {
  const std::string good = SomeAppend().SerializeAsString();
  // layers[0] holds swa_kv, whose shape's varint is cut short.
  const std::string nested("\x22\x04\x12\x02\x10\xff", 6);
  const std::vector<BadCase> cases = {
      {"truncated", good.substr(0, good.size() - 10), "AppendKVRequest.layers[2]"},
      {"a length past the end", std::string("\x0a\x7f" "abc", 5),
       "AppendKVRequest.session_id"},
      {"a string that is not UTF-8", std::string("\x0a\x02\xff\xfe", 4),
       "AppendKVRequest.session_id: "},
      {"a field of another wire type, then a cut one",
       std::string("\x11\x01\x02\x03\x04\x05\x06\x07\x08\x18\x80", 11),
       "AppendKVRequest.num_positions: "},
      {"a nested message with a bad field", nested, "AppendKVRequest.layers[0].swa_kv.shape[0]: "},
      {"field number 0", std::string("\x00\x01", 2), "AppendKVRequest: "},
  };
  for (const BadCase& bad : cases) {
    pb::AppendKVRequest parsed;
    const absl::Status status = ParseUnaryMessage(BufferOf(bad.bytes), &parsed);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad.name;
    EXPECT_THAT(std::string(status.message()), HasSubstr(bad.error)) << bad.name;
    EXPECT_EQ(parsed.ByteSizeLong(), 0u) << bad.name << ": a failed parse leaves the message clear";
    // Protobuf refuses these too: the walk only explains its verdict.
    pb::AppendKVRequest generated;
    EXPECT_FALSE(generated.ParseFromString(bad.bytes)) << bad.name;
  }
}

}  // namespace
}  // namespace mla::wire
