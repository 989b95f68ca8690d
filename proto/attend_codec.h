// The Attend stream's messages (AttendRequest, AttendResponse of
// proto/mla_offload.proto) read from and written to grpc::ByteBuffer without
// copying tensor bytes: the server's raw Attend method
// (MlaOffload::WithRawCallbackMethod_Attend) and the C++ client use these in
// place of the generated classes, whose `bytes` fields cost a copy each way
// (a plain stream of 2 MiB messages moves 0.73 GB/s).
//
// Parsing: ParseAttendRequest/ParseAttendResponse take the ByteBuffer's slices
// (references, not copies) and decode the small fields into the plain views
// of proto/views.h; each tensor's data is a list of pieces pointing into
// those slices, which the TensorView keeps alive. The one copy of the bytes is
// the caller's TensorView::CopyTo into its staging or device buffer.
//
// Serializing: SerializeAttendRequest/SerializeAttendResponse encode the
// small fields into small owned buffers and add each tensor's pieces as
// slices that point at the caller's memory and hold the TensorView's
// keep_alive until gRPC frees them (on a gRPC thread, possibly after the call
// has ended). The memory must not change until the keep-alive is released. A
// TensorView without keep_alive is copied into the message instead.
//
// Compatibility with the generated classes (the Python client uses them):
// serializing writes the bytes SerializeToString writes for the same message.
// Parsing gives what ParseFromString gives, with protobuf's rules for repeated
// occurrences: a scalar's last value wins, `segments` entries append (also
// when the field is split by other fields), and a message field seen twice is
// merged (Tensor: dtype last wins, shape appends, data last wins, region
// merged; Timing, RegionRef and RequestStatus: each field last wins). Unknown fields of every wire type,
// groups included, are skipped and not kept. The parser is stricter than
// protobuf in these ways, each an InvalidArgument: a known field with a wire
// type other than its own (protobuf would treat it as unknown), a negative
// shape dimension, a shape of more than kMaxTensorDims dimensions, more
// segments than the caller's limit, unknown groups nested deeper than
// WireReader::kMaxGroupDepth, a tag above 32 bits, and a message longer than
// the caller's limit. An unknown dtype value is kept as it is (proto3 enums
// are open); CheckTensor (proto/views.h) rejects it.
//
// Errors are InvalidArgument whose message names the field, e.g.
// "AttendRequest.q.shape[1]: negative dimension -3" or
// "AttendRequest.segments[2].session_id: not valid UTF-8". No input, however
// hostile, makes the parser read outside the buffer.
//
// Thread safety: the functions are reentrant; views are plain values and may
// be read from several threads at once.
#ifndef MLA_OFFLOAD_PROTO_ATTEND_CODEC_H_
#define MLA_OFFLOAD_PROTO_ATTEND_CODEC_H_

#include <cstddef>
#include <cstdint>

#include <grpcpp/support/byte_buffer.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/views.h"

namespace mla::wire {

// No tensor of the contract has more dimensions; a longer shape is refused
// while parsing (each dimension would cost 8 bytes of memory for 1 on the
// wire).
inline constexpr size_t kMaxTensorDims = 8;

// Messages longer than max_message_bytes are rejected before any field is
// read, and a request with more than max_segments segments as soon as the
// next one appears (each costs memory far beyond its bytes on the wire; a
// server passes its token limit, since a segment has at least one token). An
// uninitialised ByteBuffer is an error; an empty one is the empty message.
absl::StatusOr<AttendRequestView> ParseAttendRequest(
    const grpc::ByteBuffer& buffer, size_t max_message_bytes,
    size_t max_segments = SIZE_MAX);
absl::StatusOr<AttendResponseView> ParseAttendResponse(
    const grpc::ByteBuffer& buffer, size_t max_message_bytes);

// The request_id of a message ParseAttendRequest refused, so that the error
// answer can still be matched to it: serializers write fields in number
// order, so request_id (field 1, a varint) leads the message when set. 0 when
// the first field is not a complete request_id.
uint64_t LeadingRequestId(const grpc::ByteBuffer& buffer);

grpc::ByteBuffer SerializeAttendRequest(const AttendRequestView& request);
grpc::ByteBuffer SerializeAttendResponse(const AttendResponseView& response);
// The same, with `stamp` called on (a copy of) the timing after out and lse
// are written and before the timing is (it follows them on the wire), so
// that it can say how long writing them took; out_scales (field 6, written
// last, after the status) is a few bytes a head, referenced like out.
grpc::ByteBuffer SerializeAttendResponse(const AttendResponseView& response,
                                         absl::FunctionRef<void(TimingView&)> stamp);

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_ATTEND_CODEC_H_
