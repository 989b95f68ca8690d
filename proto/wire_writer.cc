#include "proto/wire_writer.h"

#include <cstring>
#include <utility>

#include <grpcpp/support/slice.h>

namespace mla::wire {
namespace {

// The destroy callback of a referencing slice: gRPC calls it once, when the
// slice's last reference goes.
void ReleaseKeepAlive(void* keep_alive) {
  delete static_cast<std::shared_ptr<const void>*>(keep_alive);
}

}  // namespace

std::string& WireWriter::OwnedTail() {
  if (chunks_.empty() || chunks_.back().keep_alive != nullptr) {
    chunks_.emplace_back();
  }
  return chunks_.back().owned;
}

void WireWriter::AppendVarint(uint64_t value) {
  std::string& out = OwnedTail();
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
    ++size_;
  }
  out.push_back(static_cast<char>(value));
  ++size_;
}

void WireWriter::AppendTag(uint32_t field, WireType type) {
  AppendVarint((uint64_t{field} << 3) | static_cast<uint64_t>(type));
}

void WireWriter::WriteVarint(uint32_t field, uint64_t value) {
  if (value == 0) return;
  AppendTag(field, WireType::kVarint);
  AppendVarint(value);
}

void WireWriter::WriteDouble(uint32_t field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  if (bits == 0) return;
  AppendTag(field, WireType::kFixed64);
  std::string& out = OwnedTail();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(bits >> (8 * i)));
  size_ += 8;
}

void WireWriter::WritePackedInt64(uint32_t field,
                                  absl::Span<const int64_t> values) {
  if (values.empty()) return;
  WireWriter packed;
  for (int64_t value : values) packed.AppendVarint(static_cast<uint64_t>(value));
  AppendTag(field, WireType::kLengthDelimited);
  AppendVarint(packed.size());
  OwnedTail() += packed.chunks_.front().owned;
  size_ += packed.size();
}

void WireWriter::WriteBytes(uint32_t field, absl::Span<const Piece> pieces,
                            const std::shared_ptr<const void>& keep_alive) {
  size_t length = 0;
  for (const Piece& piece : pieces) length += piece.size();
  if (length == 0) return;
  AppendTag(field, WireType::kLengthDelimited);
  AppendVarint(length);
  size_ += length;
  for (const Piece& piece : pieces) {
    if (piece.empty()) continue;
    if (keep_alive == nullptr) {
      OwnedTail().append(reinterpret_cast<const char*>(piece.data()),
                         piece.size());
    } else {
      chunks_.push_back(Chunk{std::string(), piece, keep_alive});
    }
  }
}

void WireWriter::WriteString(uint32_t field, absl::string_view value) {
  const Piece piece(reinterpret_cast<const uint8_t*>(value.data()),
                    value.size());
  WriteBytes(field, absl::MakeConstSpan(&piece, 1), nullptr);
}

void WireWriter::WriteMessage(uint32_t field, WireWriter&& message) {
  AppendTag(field, WireType::kLengthDelimited);
  AppendVarint(message.size());
  size_ += message.size();
  for (Chunk& chunk : message.chunks_) {
    if (chunk.keep_alive == nullptr) {
      OwnedTail() += chunk.owned;
    } else {
      chunks_.push_back(std::move(chunk));
    }
  }
  message.chunks_.clear();
  message.size_ = 0;
}

grpc::ByteBuffer WireWriter::Finish() {
  std::vector<grpc::Slice> slices;
  slices.reserve(chunks_.size());
  for (Chunk& chunk : chunks_) {
    if (chunk.keep_alive == nullptr) {
      slices.emplace_back(chunk.owned);
    } else {
      // gRPC only reads a slice it sends; the cast is for its C interface.
      slices.emplace_back(const_cast<uint8_t*>(chunk.external.data()),
                          chunk.external.size(), &ReleaseKeepAlive,
                          new std::shared_ptr<const void>(
                              std::move(chunk.keep_alive)));
    }
  }
  chunks_.clear();
  size_ = 0;
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace mla::wire
