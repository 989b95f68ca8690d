#include "proto/unary_codec.h"

#include <optional>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "proto/wire_reader.h"

namespace mla::wire {
namespace {

namespace pb = ::mla_offload::v1;

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;

// The wire type a field of this type is written with (packed repeated
// scalars are length-delimited, which IsPackable fields also accept).
WireType WireTypeOf(const FieldDescriptor& field) {
  switch (field.type()) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return WireType::kFixed64;
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return WireType::kFixed32;
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return WireType::kLengthDelimited;
    case FieldDescriptor::TYPE_GROUP:
      return WireType::kStartGroup;
    default:
      return WireType::kVarint;
  }
}

// Walks one message's fields and returns the first error, its path in
// front. Only called on bytes protobuf refused, so it need not be fast.
absl::Status FindError(WireReader& reader, const Descriptor& descriptor, const std::string& path,
                       int depth) {
  std::vector<int> seen(descriptor.field_count(), 0);
  while (!reader.AtLimit()) {
    Tag tag;
    if (absl::Status status = reader.ReadTag(&tag); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.message()));
    }
    const FieldDescriptor* field = descriptor.FindFieldByNumber(static_cast<int>(tag.field));
    if (field == nullptr) {
      if (absl::Status status = reader.SkipField(tag); !status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": unknown field ", tag.field, ": ", status.message()));
      }
      continue;
    }
    std::string name = absl::StrCat(path, ".", field->name());
    if (field->is_repeated()) absl::StrAppend(&name, "[", seen[field->index()], "]");
    ++seen[field->index()];
    // Protobuf keeps a known field of another wire type as an unknown one.
    const bool packed = field->is_packable() && tag.type == WireType::kLengthDelimited;
    if (tag.type != WireTypeOf(*field) && !packed) {
      if (absl::Status status = reader.SkipField(tag); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", status.message()));
      }
      continue;
    }
    if (field->type() == FieldDescriptor::TYPE_MESSAGE && depth < 64) {
      size_t length = 0;
      if (absl::Status status = reader.ReadLength(&length); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", status.message()));
      }
      const size_t outer = reader.PushLimit(length);
      if (absl::Status status = FindError(reader, *field->message_type(), name, depth + 1);
          !status.ok()) {
        return status;
      }
      reader.PopLimit(outer);
      continue;
    }
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (absl::Status status = reader.ReadUtf8String(&value); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", status.message()));
      }
      continue;
    }
    if (absl::Status status = reader.SkipField(tag); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", status.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseUnaryMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  const std::string name = message->GetDescriptor()->name();
  if (!buffer.Valid()) return absl::InvalidArgumentError(absl::StrCat(name, ": no message"));
  // ProtoBufferReader needs a mutable buffer; the copy shares the slices.
  grpc::ByteBuffer shared(buffer);
  {
    grpc::ProtoBufferReader reader(&shared);
    if (message->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  }
  std::vector<grpc::Slice> slices;
  if (grpc::Status status = buffer.Dump(&slices); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", status.error_message()));
  }
  std::vector<Piece> pieces;
  for (const grpc::Slice& slice : slices) pieces.emplace_back(slice.begin(), slice.size());
  WireReader reader(pieces);
  absl::Status found = FindError(reader, *message->GetDescriptor(), name, 0);
  if (found.ok()) {
    found = absl::InvalidArgumentError(absl::StrCat(
        name, ": the ", buffer.Length(), " bytes did not parse as mla_offload.v1.", name));
  }
  message->Clear();
  return found;
}

grpc::ByteBuffer SerializeUnaryMessage(const google::protobuf::Message& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

// The view of a Tensor field, nullopt when the message lacks it.
std::optional<TensorView> ViewOf(const pb::Tensor& tensor, bool present) {
  if (!present) return std::nullopt;
  TensorView view = MakeTensorView(static_cast<DType>(tensor.dtype()),
                                   {tensor.shape().begin(), tensor.shape().end()},
                                   tensor.data().data(), tensor.data().size(), nullptr);
  // Kept so that CheckTensor refuses it: these calls take inline bytes only.
  if (tensor.has_region()) {
    view.region = RegionRefView{tensor.region().region_id(), tensor.region().offset(),
                                tensor.region().byte_size()};
  }
  return view;
}

}  // namespace

CreateSessionRequestView CreateSessionView(const pb::CreateSessionRequest& request) {
  CreateSessionRequestView view;
  view.model = request.model();
  view.num_heads = request.num_heads();
  view.sinks = ViewOf(request.sinks(), request.has_sinks());
  view.idle_ttl_seconds = request.idle_ttl_seconds();
  return view;
}

AppendKVRequestView AppendKVView(const pb::AppendKVRequest& request) {
  AppendKVRequestView view;
  view.session_id = request.session_id();
  view.first_position = request.first_position();
  view.num_positions = request.num_positions();
  for (const pb::LayerRows& rows : request.layers()) {
    view.layers.push_back({rows.layer(), ViewOf(rows.swa_kv(), rows.has_swa_kv()),
                           ViewOf(rows.compressed_kv(), rows.has_compressed_kv()),
                           rows.first_compressed_row()});
  }
  return view;
}

}  // namespace mla::wire
