// Helpers for the attend codec's tests and benchmark: random Attend messages
// of the generated classes, conversions between those and the codec's views,
// ByteBuffers cut into slices at chosen points, and a hand encoder for
// writing malformed or unusual wire bytes independently of the codec's own
// writer.
#ifndef MLA_OFFLOAD_PROTO_ATTEND_CODEC_TEST_UTIL_H_
#define MLA_OFFLOAD_PROTO_ATTEND_CODEC_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "gtest/gtest.h"

#include "proto/attend_codec.h"
#include "proto/mla_offload.pb.h"
#include "proto/wire_reader.h"

namespace mla::wire::testing {

using Rng = std::mt19937_64;

std::string RandomBytes(size_t size, Rng& rng);

// Random messages: random segment counts, ids (over 2^63 too), negative
// positions, non-ASCII session ids, unknown dtypes, absent and empty tensors.
// Tensor data sizes are up to max_tensor_bytes, most of them small.
mla_offload::v1::AttendRequest RandomRequest(Rng& rng,
                                             size_t max_tensor_bytes);
mla_offload::v1::AttendResponse RandomResponse(Rng& rng,
                                               size_t max_tensor_bytes);

// A generated message with the same content as a view (tensor data copied).
mla_offload::v1::AttendRequest ToProto(const AttendRequestView& view);
mla_offload::v1::AttendResponse ToProto(const AttendResponseView& view);

// Views of a generated message's tensors, guarded by keep_alive. With rng,
// each tensor's data is cut into up to four pieces at random points.
AttendRequestView ViewOf(const mla_offload::v1::AttendRequest& message,
                         std::shared_ptr<const void> keep_alive,
                         Rng* rng = nullptr);
AttendResponseView ViewOf(const mla_offload::v1::AttendResponse& message,
                          std::shared_ptr<const void> keep_alive,
                          Rng* rng = nullptr);

// Field-by-field equality of two generated messages (bytes compared exactly,
// NaN equal to NaN), with the differences as the failure message.
::testing::AssertionResult SameMessage(
    const google::protobuf::Message& expected,
    const google::protobuf::Message& actual);

// `wire` as a ByteBuffer cut at the sorted offsets `cuts` (copied slices).
grpc::ByteBuffer BufferWithCuts(const std::string& wire,
                                const std::vector<size_t>& cuts);
// `wire` cut at `count` random offsets.
grpc::ByteBuffer BufferWithRandomCuts(const std::string& wire, size_t count,
                                      Rng& rng);
// `wire` in one slice that references it (no copy): it must outlive the
// buffer.
grpc::ByteBuffer StaticBuffer(const std::string& wire);
std::string Flatten(const grpc::ByteBuffer& buffer);

// A hand encoder for the protobuf wire format.
std::string Varint(uint64_t value);
std::string Key(uint32_t field, WireType type);
std::string VarintField(uint32_t field, uint64_t value);
std::string LengthDelimited(uint32_t field, const std::string& payload);
std::string Fixed64Field(uint32_t field, uint64_t value);
std::string Fixed32Field(uint32_t field, uint32_t value);

}  // namespace mla::wire::testing

#endif  // MLA_OFFLOAD_PROTO_ATTEND_CODEC_TEST_UTIL_H_
