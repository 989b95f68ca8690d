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
// Thread safety: reentrant.
#ifndef MLA_OFFLOAD_PROTO_UNARY_CODEC_H_
#define MLA_OFFLOAD_PROTO_UNARY_CODEC_H_

#include <grpcpp/support/byte_buffer.h>

#include <google/protobuf/message.h>

#include "absl/status/status.h"

namespace mla::wire {

// Replaces *message with the parsed buffer. An uninitialised buffer is an
// error; an empty one is the empty message.
absl::Status ParseUnaryMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The message's wire bytes in one owned slice.
grpc::ByteBuffer SerializeUnaryMessage(const google::protobuf::Message& message);

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_UNARY_CODEC_H_
