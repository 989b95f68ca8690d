// Tests of proto/unary_codec.h against the generated classes.
#include "proto/unary_codec.h"

#include <string>
#include <vector>

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

// The views point at the generated message's data, field for field.
TEST(UnaryCodecTest, AppendKVViewPointsIntoTheMessage) {
  pb::AppendKVRequest request = SomeAppend();
  request.mutable_layers(1)->set_first_compressed_row(3);
  pb::Tensor* compressed = request.mutable_layers(1)->mutable_compressed_kv();
  compressed->set_dtype(pb::DTYPE_BF16);
  compressed->add_shape(1);
  compressed->add_shape(512);
  compressed->set_data(std::string(1024, 'c'));
  request.mutable_layers(2)->mutable_compressed_kv();  // present and empty
  const AppendKVRequestView view = AppendKVView(request);
  EXPECT_EQ(view.session_id, "abc");
  EXPECT_EQ(view.first_position, 7);
  EXPECT_EQ(view.num_positions, 2);
  ASSERT_EQ(view.layers.size(), 3u);
  for (int layer = 0; layer < 3; ++layer) {
    const LayerRowsView& rows = view.layers[layer];
    EXPECT_EQ(rows.layer, layer);
    ASSERT_TRUE(rows.swa_kv.has_value());
    EXPECT_EQ(rows.swa_kv->dtype, DType::kBf16);
    EXPECT_EQ(rows.swa_kv->shape, (std::vector<int64_t>{2, 512}));
    ASSERT_EQ(rows.swa_kv->pieces.size(), 1u);
    EXPECT_EQ(static_cast<const void*>(rows.swa_kv->pieces[0].data()),
              request.layers(layer).swa_kv().data().data());
    EXPECT_EQ(rows.swa_kv->size_bytes(), 2048u);
  }
  EXPECT_FALSE(view.layers[0].compressed_kv.has_value());
  ASSERT_TRUE(view.layers[1].compressed_kv.has_value());
  EXPECT_EQ(view.layers[1].compressed_kv->size_bytes(), 1024u);
  EXPECT_EQ(view.layers[1].first_compressed_row, 3);
  ASSERT_TRUE(view.layers[2].compressed_kv.has_value());
  EXPECT_TRUE(view.layers[2].compressed_kv->pieces.empty());
}

TEST(UnaryCodecTest, CreateSessionView) {
  pb::CreateSessionRequest request;
  request.set_model("V4-Flash");
  request.set_num_heads(16);
  request.set_idle_ttl_seconds(30);
  EXPECT_FALSE(CreateSessionView(request).sinks.has_value());
  request.mutable_sinks()->set_dtype(static_cast<pb::DType>(7));
  request.mutable_sinks()->add_shape(2);
  request.mutable_sinks()->set_data(std::string(8, '\0'));
  const CreateSessionRequestView view = CreateSessionView(request);
  EXPECT_EQ(view.model, "V4-Flash");
  EXPECT_EQ(view.num_heads, 16);
  EXPECT_EQ(view.idle_ttl_seconds, 30);
  ASSERT_TRUE(view.sinks.has_value());
  EXPECT_EQ(static_cast<int>(view.sinks->dtype), 7);  // as it came
  EXPECT_EQ(view.sinks->shape, std::vector<int64_t>{2});
  EXPECT_EQ(static_cast<const void*>(view.sinks->pieces.at(0).data()),
            request.sinks().data().data());
  EXPECT_FALSE(view.sinks->region.has_value());
  // Kept, for CheckTensor to refuse: the unary calls take inline bytes.
  request.mutable_sinks()->mutable_region()->set_region_id(4);
  ASSERT_TRUE(CreateSessionView(request).sinks->region.has_value());
  EXPECT_EQ(CreateSessionView(request).sinks->region->region_id, 4u);
}

}  // namespace
}  // namespace mla::wire
