// The Attend stream's messages (AttendRequest, AttendResponse of
// proto/mla_offload.proto) read from and written to grpc::ByteBuffer without
// copying tensor bytes: the server's raw Attend method
// (MlaOffload::WithRawCallbackMethod_Attend) and the C++ client use these in
// place of the generated classes, whose `bytes` fields cost a copy each way
// (a plain stream of 2 MiB messages moves 0.73 GB/s).
//
// Parsing: ParseAttendRequest/ParseAttendResponse take the ByteBuffer's slices
// (references, not copies) and decode the small fields into plain structs;
// each tensor's data is a list of pieces pointing into those slices, which the
// TensorView keeps alive. The one copy of the bytes is the caller's
// TensorView::CopyTo into its staging or device buffer.
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
// merged (Tensor: dtype last wins, shape appends, data last wins; Timing and
// RequestStatus: each field last wins). Unknown fields of every wire type,
// groups included, are skipped and not kept. The parser is stricter than
// protobuf in these ways, each an InvalidArgument: a known field with a wire
// type other than its own (protobuf would treat it as unknown), a negative
// shape dimension, a shape of more than kMaxTensorDims dimensions, more
// segments than the caller's limit, unknown groups nested deeper than
// WireReader::kMaxGroupDepth, a tag above 32 bits, and a message longer than
// the caller's limit. An unknown dtype value is kept as it is (proto3 enums
// are open); CheckTensorBytes rejects it.
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/mla_offload.pb.h"
#include "proto/wire_reader.h"

namespace mla::wire {

using DType = ::mla_offload::v1::DType;

// No tensor of the contract has more dimensions; a longer shape is refused
// while parsing (each dimension would cost 8 bytes of memory for 1 on the
// wire).
inline constexpr size_t kMaxTensorDims = 8;

// Bytes per element of a known dtype; 0 for DTYPE_UNSPECIFIED and unknown
// values.
size_t DTypeSize(DType dtype);

// A Tensor message whose data lies in memory this view does not own.
struct TensorView {
  // The wire value as it came, possibly one DType does not name.
  DType dtype = ::mla_offload::v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  // The data, in order: the concatenation of the pieces. No piece is empty.
  std::vector<Piece> pieces;
  // Keeps the pieces' memory alive: the received slices after parsing, the
  // caller's buffer when serializing (see the file comment).
  std::shared_ptr<const void> keep_alive;

  size_t size_bytes() const;
  // Copies the data to dst (size_bytes() bytes), one memcpy per piece.
  void CopyTo(void* dst) const;
  // The data as one span when it lies in at most one piece (the usual case
  // for a message that arrived in one slice); nullopt when it is split.
  std::optional<Piece> contiguous() const;
};

// A TensorView of `size_bytes` bytes at `data`, guarded by keep_alive.
TensorView MakeTensorView(DType dtype, std::vector<int64_t> shape,
                          const void* data, size_t size_bytes,
                          std::shared_ptr<const void> keep_alive);

// InvalidArgument naming `field` unless the dtype is known and the data has
// exactly product(shape) * DTypeSize(dtype) bytes, the contract of message
// Tensor. Parsing leaves this to the caller so that the server can word the
// error for the field it expected.
absl::Status CheckTensorBytes(const TensorView& tensor,
                              absl::string_view field);

struct SegmentView {
  std::string session_id;
  int32_t position = 0;
  int32_t num_tokens = 0;
  int32_t first_compressed_row = 0;
  int32_t num_compressed_rows = 0;
};

struct AttendRequestView {
  uint64_t request_id = 0;
  int32_t layer = 0;
  std::vector<SegmentView> segments;
  int32_t head_offset = 0;
  // Message fields have presence: nullopt when absent from the wire.
  std::optional<TensorView> q;
  std::optional<TensorView> kv;
  std::optional<TensorView> compressed_kv;
  std::optional<TensorView> topk;
  bool return_lse = false;
  bool derotate_output = false;
};

struct TimingView {
  double queue_us = 0;
  double prologue_us = 0;
  double decode_us = 0;
  double total_us = 0;
  int32_t batch_tokens = 0;
  double plan_us = 0;
  double upload_us = 0;
  double readback_us = 0;
};

// The outcome of one Attend message (message RequestStatus).
struct RequestStatusView {
  int32_t code = 0;  // a grpc::StatusCode; 0 = OK
  std::string message;
};

struct AttendResponseView {
  uint64_t request_id = 0;
  std::optional<TensorView> out;
  std::optional<TensorView> lse;
  std::optional<TimingView> timing;
  std::optional<RequestStatusView> status;
};

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

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_ATTEND_CODEC_H_
