#include "proto/wire_reader.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace mla::wire {
namespace {

constexpr int kMaxVarintBytes = 10;
// Protobuf reads keys as 32-bit varints.
constexpr int kMaxTagBytes = 5;

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF,
// which is what protobuf's parsers accept in proto3 strings.
bool IsUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t lead = static_cast<uint8_t>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // The second byte's range is narrower after some lead bytes; that is
    // where overlong forms, surrogates and values above U+10FFFF are caught.
    size_t continuation = 0;
    uint8_t second_low = 0x80;
    uint8_t second_high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      continuation = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      continuation = 2;
      if (lead == 0xE0) second_low = 0xA0;
      if (lead == 0xED) second_high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      continuation = 3;
      if (lead == 0xF0) second_low = 0x90;
      if (lead == 0xF4) second_high = 0x8F;
    } else {
      return false;
    }
    if (text.size() - i <= continuation) return false;
    for (size_t k = 1; k <= continuation; ++k) {
      const uint8_t byte = static_cast<uint8_t>(text[i + k]);
      const uint8_t low = k == 1 ? second_low : 0x80;
      const uint8_t high = k == 1 ? second_high : 0xBF;
      if (byte < low || byte > high) return false;
    }
    i += continuation + 1;
  }
  return true;
}

}  // namespace

const char* WireTypeName(WireType type) {
  switch (type) {
    case WireType::kVarint:
      return "varint";
    case WireType::kFixed64:
      return "fixed64";
    case WireType::kLengthDelimited:
      return "length-delimited";
    case WireType::kStartGroup:
      return "start-group";
    case WireType::kEndGroup:
      return "end-group";
    case WireType::kFixed32:
      return "fixed32";
  }
  return "invalid";
}

WireReader::WireReader(absl::Span<const Piece> pieces) : pieces_(pieces) {
  for (const Piece& piece : pieces_) limit_ += piece.size();
}

uint8_t WireReader::NextByte() {
  while (piece_offset_ == pieces_[piece_index_].size()) {
    ++piece_index_;
    piece_offset_ = 0;
  }
  ++position_;
  return pieces_[piece_index_][piece_offset_++];
}

template <typename Visit>
void WireReader::Consume(size_t length, Visit&& visit) {
  position_ += length;
  while (length > 0) {
    const Piece& piece = pieces_[piece_index_];
    const size_t take = std::min(length, piece.size() - piece_offset_);
    if (take > 0) visit(piece.subspan(piece_offset_, take));
    piece_offset_ += take;
    length -= take;
    if (length > 0) {
      ++piece_index_;
      piece_offset_ = 0;
    }
  }
}

absl::Status WireReader::ReadVarintOfAtMost(int max_bytes, const char* what,
                                            uint64_t* value) {
  uint64_t result = 0;
  for (int i = 0; i < max_bytes; ++i) {
    if (AtLimit()) {
      return absl::InvalidArgumentError(absl::StrCat("truncated ", what));
    }
    const uint8_t byte = NextByte();
    result |= uint64_t{byte & 0x7Fu} << (7 * i);
    if ((byte & 0x80) == 0) {
      *value = result;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " longer than ", max_bytes, " bytes"));
}

absl::Status WireReader::ReadVarint(uint64_t* value) {
  return ReadVarintOfAtMost(kMaxVarintBytes, "varint", value);
}

absl::Status WireReader::ReadTag(Tag* tag) {
  uint64_t key = 0;
  if (absl::Status status = ReadVarintOfAtMost(kMaxTagBytes, "tag", &key);
      !status.ok()) {
    return status;
  }
  if (key > UINT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("tag ", key, " does not fit 32 bits"));
  }
  const uint32_t field = static_cast<uint32_t>(key >> 3);
  const uint32_t type = static_cast<uint32_t>(key & 7);
  if (field == 0) return absl::InvalidArgumentError("field number 0");
  if (type > static_cast<uint32_t>(WireType::kFixed32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid wire type ", type, " (field ", field, ")"));
  }
  tag->field = field;
  tag->type = static_cast<WireType>(type);
  return absl::OkStatus();
}

absl::Status WireReader::ReadFixed64(uint64_t* value) {
  if (BytesLeft() < 8) return absl::InvalidArgumentError("truncated fixed64");
  uint64_t result = 0;
  for (int i = 0; i < 8; ++i) result |= uint64_t{NextByte()} << (8 * i);
  *value = result;
  return absl::OkStatus();
}

absl::Status WireReader::ReadLength(size_t* length) {
  uint64_t value = 0;
  if (absl::Status status = ReadVarint(&value); !status.ok()) return status;
  if (value > BytesLeft()) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", value, " runs past the end of the message (",
                     BytesLeft(), " bytes left)"));
  }
  *length = static_cast<size_t>(value);
  return absl::OkStatus();
}

void WireReader::TakePieces(size_t length, std::vector<Piece>* pieces) {
  Consume(length, [pieces](Piece piece) { pieces->push_back(piece); });
}

absl::Status WireReader::ReadUtf8String(std::string* value) {
  size_t length = 0;
  if (absl::Status status = ReadLength(&length); !status.ok()) return status;
  value->clear();
  value->reserve(length);
  Consume(length, [value](Piece piece) {
    value->append(reinterpret_cast<const char*>(piece.data()), piece.size());
  });
  if (!IsUtf8(*value)) return absl::InvalidArgumentError("not valid UTF-8");
  return absl::OkStatus();
}

absl::Status WireReader::SkipField(const Tag& tag) {
  return SkipFieldAtDepth(tag, 0);
}

absl::Status WireReader::SkipFieldAtDepth(const Tag& tag, int group_depth) {
  switch (tag.type) {
    case WireType::kVarint: {
      uint64_t ignored = 0;
      return ReadVarint(&ignored);
    }
    case WireType::kFixed64:
    case WireType::kFixed32: {
      const size_t width = tag.type == WireType::kFixed64 ? 8 : 4;
      if (BytesLeft() < width) {
        return absl::InvalidArgumentError(absl::StrCat(
            "truncated ", WireTypeName(tag.type), " (field ", tag.field, ")"));
      }
      Consume(width, [](Piece) {});
      return absl::OkStatus();
    }
    case WireType::kLengthDelimited: {
      size_t length = 0;
      if (absl::Status status = ReadLength(&length); !status.ok()) {
        return status;
      }
      Consume(length, [](Piece) {});
      return absl::OkStatus();
    }
    case WireType::kStartGroup:
      if (group_depth >= kMaxGroupDepth) {
        return absl::InvalidArgumentError(absl::StrCat(
            "groups nested deeper than ", kMaxGroupDepth, " (field ",
            tag.field, ")"));
      }
      while (true) {
        if (AtLimit()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "group of field ", tag.field, " has no end-group tag"));
        }
        Tag inner;
        if (absl::Status status = ReadTag(&inner); !status.ok()) {
          return status;
        }
        if (inner.type == WireType::kEndGroup) {
          if (inner.field == tag.field) return absl::OkStatus();
          return absl::InvalidArgumentError(
              absl::StrCat("end-group tag of field ", inner.field,
                           " inside the group of field ", tag.field));
        }
        if (absl::Status status = SkipFieldAtDepth(inner, group_depth + 1);
            !status.ok()) {
          return status;
        }
      }
    case WireType::kEndGroup:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "end-group tag of field ", tag.field, " without a start-group"));
}

size_t WireReader::PushLimit(size_t length) {
  const size_t previous = limit_;
  limit_ = position_ + length;
  return previous;
}

}  // namespace mla::wire
