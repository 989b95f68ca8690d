// The unary calls' messages (CreateSession, AppendKV, ...) read from and
// written to grpc::ByteBuffer by the server's raw unary methods, so that a
// request that does not parse is answered INVALID_ARGUMENT saying what did
// not parse (gRPC's own deserialisation answers such a request with an empty
// status message).
//
// ParseUnaryMessage parses with protobuf itself (the generated class decides
// what is valid); only when that fails does it walk the bytes with
// WireReader and the message's descriptor to find the first field that is
// wrong: a truncated value, a length past the end, a string that is not
// UTF-8, a nested message that is itself malformed. The error is
// InvalidArgument naming the path, e.g.
// "AppendKVRequest.layers[0].swa_kv.shape[0]: truncated varint".
//
// CreateSessionView and AppendKVView give the engine's view of a parsed
// request (proto/views.h): its tensors point into the message's `data`
// strings (no bytes are copied), so the message must outlive the view.
//
// Thread safety: reentrant.
#ifndef MLA_OFFLOAD_PROTO_UNARY_CODEC_H_
#define MLA_OFFLOAD_PROTO_UNARY_CODEC_H_

#include <grpcpp/support/byte_buffer.h>

#include <google/protobuf/message.h>

#include "absl/status/status.h"
#include "proto/mla_offload.pb.h"
#include "proto/views.h"

namespace mla::wire {

// Replaces *message with the parsed buffer. An uninitialised buffer is an
// error; an empty one is the empty message.
absl::Status ParseUnaryMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The message's wire bytes in one owned slice.
grpc::ByteBuffer SerializeUnaryMessage(const google::protobuf::Message& message);

// Views of `request`, valid while it lives and is not changed. A tensor
// field is present in the view when the message has it.
CreateSessionRequestView CreateSessionView(const ::mla_offload::v1::CreateSessionRequest& request);
AppendKVRequestView AppendKVView(const ::mla_offload::v1::AppendKVRequest& request);

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_UNARY_CODEC_H_
