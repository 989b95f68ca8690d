#include "proto/attend_codec.h"

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <grpcpp/support/slice.h>

#include "absl/strings/str_cat.h"
#include "proto/mla_offload.pb.h"
#include "proto/wire_reader.h"
#include "proto/wire_writer.h"

namespace mla::wire {
namespace {

using ::mla_offload::v1::AttendRequest;
using ::mla_offload::v1::AttendResponse;
using ::mla_offload::v1::RegionRef;
using ::mla_offload::v1::RequestStatus;
using ::mla_offload::v1::Segment;
using ::mla_offload::v1::Tensor;
using ::mla_offload::v1::Timing;

// The views' DType carries the wire's numbers.
static_assert(static_cast<int>(DType::kUnspecified) ==
              ::mla_offload::v1::DTYPE_UNSPECIFIED);
static_assert(static_cast<int>(DType::kBf16) == ::mla_offload::v1::DTYPE_BF16);
static_assert(static_cast<int>(DType::kF32) == ::mla_offload::v1::DTYPE_F32);
static_assert(static_cast<int>(DType::kI32) == ::mla_offload::v1::DTYPE_I32);
static_assert(static_cast<int>(DType::kE4m3fn) == ::mla_offload::v1::DTYPE_E4M3FN);
static_assert(static_cast<int>(DType::kUe8m0) == ::mla_offload::v1::DTYPE_UE8M0);

// Where a field sits in the message, for error messages: built on the stack
// as parsing descends, turned into text only when something fails.
struct FieldPath {
  const FieldPath* parent = nullptr;
  absl::string_view name;
  int64_t index = -1;  // the element of a repeated field, or -1
};

std::string PathText(const FieldPath& path) {
  std::string text =
      path.parent == nullptr ? std::string() : PathText(*path.parent) + ".";
  absl::StrAppend(&text, path.name);
  if (path.index >= 0) absl::StrAppend(&text, "[", path.index, "]");
  return text;
}

absl::Status Invalid(const FieldPath& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(PathText(path), ": ", what));
}

// A WireReader error says what went wrong; this puts the field in front.
absl::Status AtPath(const FieldPath& path, const absl::Status& status) {
  if (status.ok()) return status;
  return Invalid(path, status.message());
}

// How protobuf turns a varint into each field type: int32 and enums keep the
// low 32 bits, bool is "not zero".
template <typename T>
T FromVarint(uint64_t raw) {
  if constexpr (std::is_same_v<T, bool>) {
    return raw != 0;
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<T>(static_cast<int32_t>(raw));
  } else {
    return static_cast<T>(raw);
  }
}

// ... and back: negative int32 values are sign-extended to 64 bits.
uint64_t ToVarint(int64_t value) { return static_cast<uint64_t>(value); }

// Decodes one message of the Attend stream from a WireReader; the pieces it
// hands out are kept alive by `slices`.
class Parser {
 public:
  Parser(absl::Span<const Piece> pieces, std::shared_ptr<const void> slices,
         size_t max_segments)
      : reader_(pieces), slices_(std::move(slices)), max_segments_(max_segments) {}

  absl::Status Request(const FieldPath& path, AttendRequestView* request);
  absl::Status Response(const FieldPath& path, AttendResponseView* response);

 private:
  // Calls parse_field(tag) for each field up to the reader's limit.
  template <typename ParseField>
  absl::Status Fields(const FieldPath& path, ParseField&& parse_field);
  // A length-delimited field whose bytes parse_body() reads to the end.
  template <typename ParseBody>
  absl::Status Nested(const Tag& tag, const FieldPath& path,
                      ParseBody&& parse_body);

  absl::Status TensorField(const Tag& tag, const FieldPath& path,
                           std::optional<TensorView>* tensor);
  absl::Status RegionField(const Tag& tag, const FieldPath& path,
                           std::optional<RegionRefView>* region);
  absl::Status Shape(const Tag& tag, const FieldPath& path,
                     std::vector<int64_t>* shape);
  absl::Status Dimension(const FieldPath& path, std::vector<int64_t>* shape);
  absl::Status SegmentField(const Tag& tag, const FieldPath& path,
                            SegmentView* segment);
  absl::Status TimingField(const Tag& tag, const FieldPath& path,
                           std::optional<TimingView>* timing);
  absl::Status StatusField(const Tag& tag, const FieldPath& path,
                           std::optional<RequestStatusView>* status);

  absl::Status Expect(const Tag& tag, WireType type, const FieldPath& path);
  template <typename T>
  absl::Status Varint(const Tag& tag, const FieldPath& path, T* value);
  absl::Status Double(const Tag& tag, const FieldPath& path, double* value);
  absl::Status String(const Tag& tag, const FieldPath& path,
                      std::string* value);
  absl::Status Skip(const Tag& tag, const FieldPath& message_path);

  WireReader reader_;
  std::shared_ptr<const void> slices_;
  const size_t max_segments_;
};

template <typename ParseField>
absl::Status Parser::Fields(const FieldPath& path, ParseField&& parse_field) {
  while (!reader_.AtLimit()) {
    Tag tag;
    if (absl::Status status = AtPath(path, reader_.ReadTag(&tag));
        !status.ok()) {
      return status;
    }
    if (absl::Status status = parse_field(tag); !status.ok()) return status;
  }
  return absl::OkStatus();
}

template <typename ParseBody>
absl::Status Parser::Nested(const Tag& tag, const FieldPath& path,
                            ParseBody&& parse_body) {
  if (absl::Status status = Expect(tag, WireType::kLengthDelimited, path);
      !status.ok()) {
    return status;
  }
  size_t length = 0;
  if (absl::Status status = AtPath(path, reader_.ReadLength(&length));
      !status.ok()) {
    return status;
  }
  const size_t outer_limit = reader_.PushLimit(length);
  absl::Status status = parse_body();
  reader_.PopLimit(outer_limit);
  return status;
}

absl::Status Parser::Expect(const Tag& tag, WireType type,
                            const FieldPath& path) {
  if (tag.type == type) return absl::OkStatus();
  return Invalid(path, absl::StrCat("wire type ", static_cast<int>(tag.type),
                                    " (", WireTypeName(tag.type), ") where ",
                                    WireTypeName(type), " is expected"));
}

template <typename T>
absl::Status Parser::Varint(const Tag& tag, const FieldPath& path, T* value) {
  if (absl::Status status = Expect(tag, WireType::kVarint, path);
      !status.ok()) {
    return status;
  }
  uint64_t raw = 0;
  if (absl::Status status = AtPath(path, reader_.ReadVarint(&raw));
      !status.ok()) {
    return status;
  }
  *value = FromVarint<T>(raw);
  return absl::OkStatus();
}

absl::Status Parser::Double(const Tag& tag, const FieldPath& path,
                            double* value) {
  if (absl::Status status = Expect(tag, WireType::kFixed64, path);
      !status.ok()) {
    return status;
  }
  uint64_t bits = 0;
  if (absl::Status status = AtPath(path, reader_.ReadFixed64(&bits));
      !status.ok()) {
    return status;
  }
  std::memcpy(value, &bits, sizeof(bits));
  return absl::OkStatus();
}

absl::Status Parser::String(const Tag& tag, const FieldPath& path,
                            std::string* value) {
  if (absl::Status status = Expect(tag, WireType::kLengthDelimited, path);
      !status.ok()) {
    return status;
  }
  return AtPath(path, reader_.ReadUtf8String(value));
}

absl::Status Parser::Skip(const Tag& tag, const FieldPath& message_path) {
  return AtPath(message_path, reader_.SkipField(tag));
}

absl::Status Parser::Dimension(const FieldPath& path,
                               std::vector<int64_t>* shape) {
  const FieldPath element{path.parent, path.name,
                          static_cast<int64_t>(shape->size())};
  uint64_t raw = 0;
  if (absl::Status status = AtPath(element, reader_.ReadVarint(&raw));
      !status.ok()) {
    return status;
  }
  const int64_t dimension = FromVarint<int64_t>(raw);
  if (dimension < 0) {
    return Invalid(element, absl::StrCat("negative dimension ", dimension));
  }
  if (shape->size() >= kMaxTensorDims) {
    return Invalid(element, absl::StrCat("more than ", kMaxTensorDims, " dimensions"));
  }
  shape->push_back(dimension);
  return absl::OkStatus();
}

// Parsers accept a repeated scalar both packed and one value per field.
absl::Status Parser::Shape(const Tag& tag, const FieldPath& path,
                           std::vector<int64_t>* shape) {
  if (tag.type == WireType::kVarint) return Dimension(path, shape);
  if (tag.type != WireType::kLengthDelimited) {
    return Invalid(path, absl::StrCat("wire type ", static_cast<int>(tag.type),
                                      " (", WireTypeName(tag.type),
                                      ") where varint or length-delimited "
                                      "(packed) is expected"));
  }
  return Nested(tag, path, [&]() -> absl::Status {
    while (!reader_.AtLimit()) {
      if (absl::Status status = Dimension(path, shape); !status.ok()) {
        return status;
      }
    }
    return absl::OkStatus();
  });
}

absl::Status Parser::TensorField(const Tag& tag, const FieldPath& path,
                                 std::optional<TensorView>* tensor) {
  return Nested(tag, path, [&]() {
    // A second occurrence merges into the first, as protobuf does.
    if (!tensor->has_value()) tensor->emplace().keep_alive = slices_;
    TensorView& view = **tensor;
    return Fields(path, [&](const Tag& field) -> absl::Status {
      switch (field.field) {
        case Tensor::kDtypeFieldNumber:
          return Varint(field, {&path, "dtype"}, &view.dtype);
        case Tensor::kShapeFieldNumber:
          return Shape(field, {&path, "shape"}, &view.shape);
        case Tensor::kDataFieldNumber: {
          const FieldPath data_path{&path, "data"};
          if (absl::Status status =
                  Expect(field, WireType::kLengthDelimited, data_path);
              !status.ok()) {
            return status;
          }
          size_t length = 0;
          if (absl::Status status =
                  AtPath(data_path, reader_.ReadLength(&length));
              !status.ok()) {
            return status;
          }
          view.pieces.clear();
          reader_.TakePieces(length, &view.pieces);
          return absl::OkStatus();
        }
        case Tensor::kRegionFieldNumber:
          return RegionField(field, {&path, "region"}, &view.region);
        default:
          return Skip(field, path);
      }
    });
  });
}

absl::Status Parser::RegionField(const Tag& tag, const FieldPath& path,
                                 std::optional<RegionRefView>* region) {
  return Nested(tag, path, [&]() {
    if (!region->has_value()) region->emplace();
    RegionRefView& view = **region;
    return Fields(path, [&](const Tag& field) -> absl::Status {
      switch (field.field) {
        case RegionRef::kRegionIdFieldNumber:
          return Varint(field, {&path, "region_id"}, &view.region_id);
        case RegionRef::kOffsetFieldNumber:
          return Varint(field, {&path, "offset"}, &view.offset);
        case RegionRef::kByteSizeFieldNumber:
          return Varint(field, {&path, "byte_size"}, &view.byte_size);
        default:
          return Skip(field, path);
      }
    });
  });
}

absl::Status Parser::SegmentField(const Tag& tag, const FieldPath& path,
                                  SegmentView* segment) {
  return Nested(tag, path, [&]() {
    return Fields(path, [&](const Tag& field) -> absl::Status {
      switch (field.field) {
        case Segment::kSessionIdFieldNumber:
          return String(field, {&path, "session_id"}, &segment->session_id);
        case Segment::kPositionFieldNumber:
          return Varint(field, {&path, "position"}, &segment->position);
        case Segment::kNumTokensFieldNumber:
          return Varint(field, {&path, "num_tokens"}, &segment->num_tokens);
        case Segment::kFirstCompressedRowFieldNumber:
          return Varint(field, {&path, "first_compressed_row"},
                        &segment->first_compressed_row);
        case Segment::kNumCompressedRowsFieldNumber:
          return Varint(field, {&path, "num_compressed_rows"},
                        &segment->num_compressed_rows);
        default:
          return Skip(field, path);
      }
    });
  });
}

absl::Status Parser::TimingField(const Tag& tag, const FieldPath& path,
                                 std::optional<TimingView>* timing) {
  return Nested(tag, path, [&]() {
    if (!timing->has_value()) timing->emplace();
    TimingView& view = **timing;
    return Fields(path, [&](const Tag& field) -> absl::Status {
      switch (field.field) {
        case Timing::kQueueUsFieldNumber:
          return Double(field, {&path, "queue_us"}, &view.queue_us);
        case Timing::kPrologueUsFieldNumber:
          return Double(field, {&path, "prologue_us"}, &view.prologue_us);
        case Timing::kDecodeUsFieldNumber:
          return Double(field, {&path, "decode_us"}, &view.decode_us);
        case Timing::kTotalUsFieldNumber:
          return Double(field, {&path, "total_us"}, &view.total_us);
        case Timing::kBatchTokensFieldNumber:
          return Varint(field, {&path, "batch_tokens"}, &view.batch_tokens);
        case Timing::kPlanUsFieldNumber:
          return Double(field, {&path, "plan_us"}, &view.plan_us);
        case Timing::kUploadUsFieldNumber:
          return Double(field, {&path, "upload_us"}, &view.upload_us);
        case Timing::kReadbackUsFieldNumber:
          return Double(field, {&path, "readback_us"}, &view.readback_us);
        case Timing::kSerializeUsFieldNumber:
          return Double(field, {&path, "serialize_us"}, &view.serialize_us);
        default:
          return Skip(field, path);
      }
    });
  });
}

absl::Status Parser::StatusField(const Tag& tag, const FieldPath& path,
                                 std::optional<RequestStatusView>* status) {
  return Nested(tag, path, [&]() {
    if (!status->has_value()) status->emplace();
    RequestStatusView& view = **status;
    return Fields(path, [&](const Tag& field) -> absl::Status {
      switch (field.field) {
        case RequestStatus::kCodeFieldNumber:
          return Varint(field, {&path, "code"}, &view.code);
        case RequestStatus::kMessageFieldNumber:
          return String(field, {&path, "message"}, &view.message);
        default:
          return Skip(field, path);
      }
    });
  });
}

absl::Status Parser::Request(const FieldPath& path,
                             AttendRequestView* request) {
  return Fields(path, [&](const Tag& field) -> absl::Status {
    switch (field.field) {
      case AttendRequest::kRequestIdFieldNumber:
        return Varint(field, {&path, "request_id"}, &request->request_id);
      case AttendRequest::kLayerFieldNumber:
        return Varint(field, {&path, "layer"}, &request->layer);
      case AttendRequest::kSegmentsFieldNumber:
        if (request->segments.size() >= max_segments_) {
          return Invalid({&path, "segments"},
                         absl::StrCat("more than ", max_segments_, " segments"));
        }
        request->segments.emplace_back();
        return SegmentField(
            field,
            {&path, "segments",
             static_cast<int64_t>(request->segments.size() - 1)},
            &request->segments.back());
      case AttendRequest::kHeadOffsetFieldNumber:
        return Varint(field, {&path, "head_offset"}, &request->head_offset);
      case AttendRequest::kQFieldNumber:
        return TensorField(field, {&path, "q"}, &request->q);
      case AttendRequest::kKvFieldNumber:
        return TensorField(field, {&path, "kv"}, &request->kv);
      case AttendRequest::kCompressedKvFieldNumber:
        return TensorField(field, {&path, "compressed_kv"},
                           &request->compressed_kv);
      case AttendRequest::kTopkFieldNumber:
        return TensorField(field, {&path, "topk"}, &request->topk);
      case AttendRequest::kReturnLseFieldNumber:
        return Varint(field, {&path, "return_lse"}, &request->return_lse);
      case AttendRequest::kDerotateOutputFieldNumber:
        return Varint(field, {&path, "derotate_output"},
                      &request->derotate_output);
      case AttendRequest::kOutRegionFieldNumber:
        return RegionField(field, {&path, "out_region"}, &request->out_region);
      case AttendRequest::kLseRegionFieldNumber:
        return RegionField(field, {&path, "lse_region"}, &request->lse_region);
      case AttendRequest::kFp8OutputFieldNumber:
        return Varint(field, {&path, "fp8_output"}, &request->fp8_output);
      case AttendRequest::kOutScalesRegionFieldNumber:
        return RegionField(field, {&path, "out_scales_region"}, &request->out_scales_region);
      default:
        return Skip(field, path);
    }
  });
}

absl::Status Parser::Response(const FieldPath& path,
                              AttendResponseView* response) {
  return Fields(path, [&](const Tag& field) -> absl::Status {
    switch (field.field) {
      case AttendResponse::kRequestIdFieldNumber:
        return Varint(field, {&path, "request_id"}, &response->request_id);
      case AttendResponse::kOutFieldNumber:
        return TensorField(field, {&path, "out"}, &response->out);
      case AttendResponse::kLseFieldNumber:
        return TensorField(field, {&path, "lse"}, &response->lse);
      case AttendResponse::kTimingFieldNumber:
        return TimingField(field, {&path, "timing"}, &response->timing);
      case AttendResponse::kStatusFieldNumber:
        return StatusField(field, {&path, "status"}, &response->status);
      case AttendResponse::kOutScalesFieldNumber:
        return TensorField(field, {&path, "out_scales"}, &response->out_scales);
      default:
        return Skip(field, path);
    }
  });
}

// The part both Parse functions share: limits, taking the slices, and the
// keep-alive that the views will hold.
template <typename View>
absl::StatusOr<View> ParseMessage(
    const grpc::ByteBuffer& buffer, size_t max_message_bytes, size_t max_segments,
    absl::string_view message_name,
    absl::Status (Parser::*parse)(const FieldPath&, View*)) {
  const FieldPath path{nullptr, message_name};
  if (!buffer.Valid()) {
    return Invalid(path, "no message (uninitialised ByteBuffer)");
  }
  if (buffer.Length() > max_message_bytes) {
    return Invalid(path, absl::StrCat("message of ", buffer.Length(),
                                      " bytes exceeds the limit of ",
                                      max_message_bytes, " bytes"));
  }
  // Dump takes references to the slices; their bytes stay where they are.
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  if (grpc::Status status = buffer.Dump(slices.get()); !status.ok()) {
    return Invalid(path, status.error_message());
  }
  std::vector<Piece> pieces;
  pieces.reserve(slices->size());
  for (const grpc::Slice& slice : *slices) {
    pieces.emplace_back(slice.begin(), slice.size());
  }
  Parser parser(pieces, std::move(slices), max_segments);
  View view;
  if (absl::Status status = (parser.*parse)(path, &view); !status.ok()) {
    return status;
  }
  return view;
}

void WriteRegion(uint32_t field, const std::optional<RegionRefView>& region,
                 WireWriter* writer) {
  if (!region.has_value()) return;
  WireWriter message;
  message.WriteVarint(RegionRef::kRegionIdFieldNumber, region->region_id);
  message.WriteVarint(RegionRef::kOffsetFieldNumber, ToVarint(region->offset));
  message.WriteVarint(RegionRef::kByteSizeFieldNumber,
                      ToVarint(region->byte_size));
  writer->WriteMessage(field, std::move(message));
}

WireWriter EncodeTensor(const TensorView& tensor) {
  WireWriter writer;
  writer.WriteVarint(Tensor::kDtypeFieldNumber,
                     ToVarint(static_cast<int32_t>(tensor.dtype)));
  writer.WritePackedInt64(Tensor::kShapeFieldNumber, tensor.shape);
  writer.WriteBytes(Tensor::kDataFieldNumber, tensor.pieces,
                    tensor.keep_alive);
  WriteRegion(Tensor::kRegionFieldNumber, tensor.region, &writer);
  return writer;
}

void WriteTensor(uint32_t field, const std::optional<TensorView>& tensor,
                 WireWriter* writer) {
  if (tensor.has_value()) writer->WriteMessage(field, EncodeTensor(*tensor));
}

}  // namespace

uint64_t LeadingRequestId(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok() || slices.empty()) return 0;
  const uint8_t* bytes = slices.front().begin();
  const size_t size = slices.front().size();
  if (size < 2 || bytes[0] != 0x08) return 0;
  uint64_t value = 0;
  for (size_t i = 1; i < size && i <= 10; ++i) {
    value |= static_cast<uint64_t>(bytes[i] & 0x7f) << (7 * (i - 1));
    if ((bytes[i] & 0x80) == 0) return value;
  }
  return 0;
}

absl::StatusOr<AttendRequestView> ParseAttendRequest(
    const grpc::ByteBuffer& buffer, size_t max_message_bytes, size_t max_segments) {
  return ParseMessage(buffer, max_message_bytes, max_segments, "AttendRequest",
                      &Parser::Request);
}

absl::StatusOr<AttendResponseView> ParseAttendResponse(
    const grpc::ByteBuffer& buffer, size_t max_message_bytes) {
  return ParseMessage(buffer, max_message_bytes, 0, "AttendResponse",
                      &Parser::Response);
}

grpc::ByteBuffer SerializeAttendRequest(const AttendRequestView& request) {
  WireWriter writer;
  writer.WriteVarint(AttendRequest::kRequestIdFieldNumber, request.request_id);
  writer.WriteVarint(AttendRequest::kLayerFieldNumber, ToVarint(request.layer));
  for (const SegmentView& segment : request.segments) {
    WireWriter message;
    message.WriteString(Segment::kSessionIdFieldNumber, segment.session_id);
    message.WriteVarint(Segment::kPositionFieldNumber,
                        ToVarint(segment.position));
    message.WriteVarint(Segment::kNumTokensFieldNumber,
                        ToVarint(segment.num_tokens));
    message.WriteVarint(Segment::kFirstCompressedRowFieldNumber,
                        ToVarint(segment.first_compressed_row));
    message.WriteVarint(Segment::kNumCompressedRowsFieldNumber,
                        ToVarint(segment.num_compressed_rows));
    writer.WriteMessage(AttendRequest::kSegmentsFieldNumber,
                        std::move(message));
  }
  writer.WriteVarint(AttendRequest::kHeadOffsetFieldNumber,
                     ToVarint(request.head_offset));
  WriteTensor(AttendRequest::kQFieldNumber, request.q, &writer);
  WriteTensor(AttendRequest::kKvFieldNumber, request.kv, &writer);
  WriteTensor(AttendRequest::kCompressedKvFieldNumber, request.compressed_kv,
              &writer);
  WriteTensor(AttendRequest::kTopkFieldNumber, request.topk, &writer);
  writer.WriteVarint(AttendRequest::kReturnLseFieldNumber, request.return_lse);
  writer.WriteVarint(AttendRequest::kDerotateOutputFieldNumber,
                     request.derotate_output);
  WriteRegion(AttendRequest::kOutRegionFieldNumber, request.out_region,
              &writer);
  WriteRegion(AttendRequest::kLseRegionFieldNumber, request.lse_region,
              &writer);
  writer.WriteVarint(AttendRequest::kFp8OutputFieldNumber, request.fp8_output);
  WriteRegion(AttendRequest::kOutScalesRegionFieldNumber,
              request.out_scales_region, &writer);
  return writer.Finish();
}

grpc::ByteBuffer SerializeAttendResponse(const AttendResponseView& response) {
  return SerializeAttendResponse(response, [](TimingView&) {});
}

grpc::ByteBuffer SerializeAttendResponse(const AttendResponseView& response,
                                         absl::FunctionRef<void(TimingView&)> stamp) {
  WireWriter writer;
  writer.WriteVarint(AttendResponse::kRequestIdFieldNumber,
                     response.request_id);
  WriteTensor(AttendResponse::kOutFieldNumber, response.out, &writer);
  WriteTensor(AttendResponse::kLseFieldNumber, response.lse, &writer);
  if (response.timing.has_value()) {
    TimingView timing = *response.timing;
    stamp(timing);
    WireWriter message;
    message.WriteDouble(Timing::kQueueUsFieldNumber, timing.queue_us);
    message.WriteDouble(Timing::kPrologueUsFieldNumber, timing.prologue_us);
    message.WriteDouble(Timing::kDecodeUsFieldNumber, timing.decode_us);
    message.WriteDouble(Timing::kTotalUsFieldNumber, timing.total_us);
    message.WriteVarint(Timing::kBatchTokensFieldNumber,
                        ToVarint(timing.batch_tokens));
    message.WriteDouble(Timing::kPlanUsFieldNumber, timing.plan_us);
    message.WriteDouble(Timing::kUploadUsFieldNumber, timing.upload_us);
    message.WriteDouble(Timing::kReadbackUsFieldNumber, timing.readback_us);
    message.WriteDouble(Timing::kSerializeUsFieldNumber, timing.serialize_us);
    writer.WriteMessage(AttendResponse::kTimingFieldNumber, std::move(message));
  }
  if (response.status.has_value()) {
    WireWriter message;
    message.WriteVarint(RequestStatus::kCodeFieldNumber,
                        ToVarint(response.status->code));
    message.WriteString(RequestStatus::kMessageFieldNumber,
                        response.status->message);
    writer.WriteMessage(AttendResponse::kStatusFieldNumber, std::move(message));
  }
  WriteTensor(AttendResponse::kOutScalesFieldNumber, response.out_scales,
              &writer);
  return writer.Finish();
}

}  // namespace mla::wire
