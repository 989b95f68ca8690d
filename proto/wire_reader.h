// WireReader: reads the protobuf wire format from an ordered list of byte
// pieces (the slices of a grpc::ByteBuffer) without joining them first.
//
// It is the one place that knows how varints, tags, fixed-width values,
// length-delimited fields and groups are laid out; the message codecs
// (proto/attend_codec.h) say what each field means. Large length-delimited
// values are handed out as pieces of the input (TakePieces), never copied.
//
// Ownership: the reader borrows the pieces and the memory they point to; both
// must outlive it. One reader is used by one thread.
//
// Errors: every read is checked against the current limit (the end of the
// input, or of the nested message being read; PushLimit/PopLimit). A failed
// read returns InvalidArgument whose message says what was wrong and not
// where ("truncated varint"); the caller prefixes the field. After a failure
// the reader's position is unspecified and it should not be used further.
// Hostile input can make reads fail but never read outside the pieces.
#ifndef MLA_OFFLOAD_PROTO_WIRE_READER_H_
#define MLA_OFFLOAD_PROTO_WIRE_READER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/views.h"

namespace mla::wire {

enum class WireType : uint8_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5,
};

// "varint", "fixed64", ... for error messages.
const char* WireTypeName(WireType type);

struct Tag {
  uint32_t field = 0;  // 1 .. 2^29 - 1
  WireType type = WireType::kVarint;
};

class WireReader {
 public:
  // Unknown groups nested deeper than this are rejected (protobuf's own
  // recursion limit is 100; nothing legitimate nests groups at all).
  static constexpr int kMaxGroupDepth = 32;

  explicit WireReader(absl::Span<const Piece> pieces);

  // Bytes between the position and the current limit.
  size_t BytesLeft() const { return limit_ - position_; }
  bool AtLimit() const { return position_ == limit_; }

  // A field key. Rejects field number 0, wire types 6 and 7, and keys longer
  // than 5 bytes or above 32 bits (as protobuf does).
  absl::Status ReadTag(Tag* tag);
  // At most 10 bytes; bits beyond the 64th are dropped, as protobuf does.
  absl::Status ReadVarint(uint64_t* value);
  absl::Status ReadFixed64(uint64_t* value);
  // The length prefix of a length-delimited field, checked against the
  // bytes left before the limit.
  absl::Status ReadLength(size_t* length);

  // Consumes `length` bytes (at most BytesLeft(), e.g. from ReadLength) and
  // appends them to `pieces` as views of the input; no empty piece is
  // appended.
  void TakePieces(size_t length, std::vector<Piece>* pieces);
  // The length prefix and value of a proto3 `string` field, copied into
  // `value` (replacing it). The bytes must be UTF-8, as the generated parsers
  // require.
  absl::Status ReadUtf8String(std::string* value);

  // Skips the value of a field this reader's caller does not know, of any
  // wire type; a start-group skips through its matching end-group. An
  // end-group tag here has no start-group and is an error.
  absl::Status SkipField(const Tag& tag);

  // Restricts reads to the next `length` bytes (at most BytesLeft()) and
  // returns the previous limit, to be given back to PopLimit once the reader
  // is at the new limit.
  size_t PushLimit(size_t length);
  void PopLimit(size_t previous_limit) { limit_ = previous_limit; }

 private:
  // Precondition: BytesLeft() > 0.
  uint8_t NextByte();
  // Calls visit(Piece) for the next `length` bytes, piece by piece.
  template <typename Visit>
  void Consume(size_t length, Visit&& visit);
  absl::Status ReadVarintOfAtMost(int max_bytes, const char* what,
                                  uint64_t* value);
  absl::Status SkipFieldAtDepth(const Tag& tag, int group_depth);

  absl::Span<const Piece> pieces_;
  size_t piece_index_ = 0;
  size_t piece_offset_ = 0;
  size_t position_ = 0;  // from the start of the input
  size_t limit_ = 0;
};

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_WIRE_READER_H_
