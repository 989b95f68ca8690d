// WireWriter: writes a proto3 message in the protobuf wire format straight
// into the slices of a grpc::ByteBuffer, with large byte fields referencing
// the caller's memory instead of being copied.
//
// It is the writing twin of proto/wire_reader.h: it knows the encodings and
// proto3's rule that a scalar holding its default value is not written; the
// message codecs (proto/attend_codec.h) say which field is which. The bytes
// it produces are those protobuf's generated SerializeToString produces when
// fields are written in field-number order, as the codecs do.
//
// Small values (tags, numbers, strings, length prefixes) are copied into
// buffers the writer owns. Bytes given with a keep-alive become slices of
// their own that point at the caller's memory: each slice holds a copy of the
// keep-alive and releases it when gRPC frees the slice, which may be on any
// thread and after the call that sent it has finished. The memory must not
// change until then.
//
// A writer is used by one thread; nested messages are written into a writer
// of their own and then added whole (WriteMessage), which is how their length
// prefixes are known without a separate sizing pass.
#ifndef MLA_OFFLOAD_PROTO_WIRE_WRITER_H_
#define MLA_OFFLOAD_PROTO_WIRE_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/wire_reader.h"

namespace mla::wire {

class WireWriter {
 public:
  // Scalars; nothing is written for 0 (for doubles: for +0.0 only, as
  // protobuf compares bit patterns).
  void WriteVarint(uint32_t field, uint64_t value);
  void WriteDouble(uint32_t field, double value);
  // Nothing is written for an empty list; written packed, as proto3 does.
  void WritePackedInt64(uint32_t field, absl::Span<const int64_t> values);
  // The concatenation of `pieces` as one bytes field; nothing is written when
  // it is empty. With a keep-alive the pieces are referenced, without one
  // they are copied.
  void WriteBytes(uint32_t field, absl::Span<const Piece> pieces,
                  const std::shared_ptr<const void>& keep_alive);
  void WriteString(uint32_t field, absl::string_view value);
  // A nested message (always written, even when empty: message fields have
  // presence).
  void WriteMessage(uint32_t field, WireWriter&& message);

  // Bytes written so far.
  size_t size() const { return size_; }

  // The message, one slice per run of owned bytes and one per referenced
  // piece. The writer is left empty.
  grpc::ByteBuffer Finish();

 private:
  // A run of the output: owned bytes, or a piece of caller memory with the
  // keep-alive that guards it.
  struct Chunk {
    std::string owned;
    Piece external;
    std::shared_ptr<const void> keep_alive;
  };

  void AppendTag(uint32_t field, WireType type);
  void AppendVarint(uint64_t value);
  // The last chunk when it holds owned bytes, else a new owned one.
  std::string& OwnedTail();

  std::vector<Chunk> chunks_;
  size_t size_ = 0;
};

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_WIRE_WRITER_H_
