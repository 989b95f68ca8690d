#include "proto/attend_codec_test_util.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/support/slice.h>

namespace mla::wire::testing {
namespace {

using ::mla_offload::v1::AttendRequest;
using ::mla_offload::v1::AttendResponse;
using ::mla_offload::v1::Tensor;

bool Chance(Rng& rng, double probability) {
  return std::uniform_real_distribution<double>(0, 1)(rng) < probability;
}

// Zero often (proto3 does not write it), else anything, negative included.
int32_t RandomInt32(Rng& rng) {
  if (Chance(rng, 0.3)) return 0;
  if (Chance(rng, 0.5)) {
    return std::uniform_int_distribution<int32_t>(-1000, 100000)(rng);
  }
  return static_cast<int32_t>(rng());
}

// Also the text of random status messages.
std::string RandomSessionId(Rng& rng) {
  static const char* const kParts[] = {"a", "session", "7f3c", "\xC3\xA9",
                                       "\xE6\xBC\xA2", "\xF0\x9F\x98\x80",
                                       "-", ""};
  std::string id;
  const int parts = std::uniform_int_distribution<int>(0, 6)(rng);
  for (int i = 0; i < parts; ++i) {
    id += kParts[std::uniform_int_distribution<int>(0, 7)(rng)];
  }
  return id;
}

void FillRandomTensor(Rng& rng, size_t max_bytes, Tensor* tensor) {
  // Mostly the real dtypes, sometimes unspecified or values DType lacks.
  static const int kDtypes[] = {1, 1, 2, 3, 4, 5, 0, 7, -1};
  tensor->set_dtype(static_cast<mla_offload::v1::DType>(
      kDtypes[std::uniform_int_distribution<int>(0, 8)(rng)]));
  const int rank = std::uniform_int_distribution<int>(0, 4)(rng);
  for (int i = 0; i < rank; ++i) {
    tensor->add_shape(
        Chance(rng, 0.8)
            ? std::uniform_int_distribution<int64_t>(0, 600)(rng)
            : static_cast<int64_t>(rng() >> 1));
  }
  const size_t limit = Chance(rng, 0.25) ? max_bytes : std::min<size_t>(
                                                           max_bytes, 4096);
  const size_t size = std::uniform_int_distribution<size_t>(0, limit)(rng);
  tensor->set_data(RandomBytes(size, rng));
}

// Any numbers, negative and zero ones included (a reference is checked by
// the server, not the codec).
void FillRandomRegion(Rng& rng, mla_offload::v1::RegionRef* region) {
  if (Chance(rng, 0.7)) region->set_region_id(rng() >> (rng() % 64));
  if (Chance(rng, 0.7)) region->set_offset(static_cast<int64_t>(rng()) >> (rng() % 64));
  if (Chance(rng, 0.7)) region->set_byte_size(static_cast<int64_t>(rng()) >> (rng() % 64));
}

void RegionToProto(const RegionRefView& view, mla_offload::v1::RegionRef* region) {
  region->set_region_id(view.region_id);
  region->set_offset(view.offset);
  region->set_byte_size(view.byte_size);
}

RegionRefView RegionViewOf(const mla_offload::v1::RegionRef& region) {
  return {region.region_id(), region.offset(), region.byte_size()};
}

void TensorToProto(const TensorView& view, Tensor* tensor) {
  tensor->set_dtype(static_cast<mla_offload::v1::DType>(view.dtype));
  for (int64_t dimension : view.shape) tensor->add_shape(dimension);
  std::string data(view.size_bytes(), '\0');
  view.CopyTo(data.data());
  tensor->set_data(std::move(data));
  if (view.region) RegionToProto(*view.region, tensor->mutable_region());
}

TensorView TensorViewOf(const Tensor& tensor,
                        const std::shared_ptr<const void>& keep_alive,
                        Rng* rng) {
  TensorView view =
      MakeTensorView(static_cast<DType>(tensor.dtype()),
                     {tensor.shape().begin(), tensor.shape().end()},
                     tensor.data().data(), tensor.data().size(), keep_alive);
  if (tensor.has_region()) view.region = RegionViewOf(tensor.region());
  const size_t size = tensor.data().size();
  if (rng != nullptr && size > 1) {
    std::vector<size_t> cuts(3);
    for (size_t& cut : cuts) {
      cut = std::uniform_int_distribution<size_t>(1, size - 1)(*rng);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.push_back(size);
    const auto* data = reinterpret_cast<const uint8_t*>(tensor.data().data());
    view.pieces.clear();
    size_t begin = 0;
    for (size_t cut : cuts) {
      if (cut > begin) view.pieces.emplace_back(data + begin, cut - begin);
      begin = cut;
    }
  }
  return view;
}

}  // namespace

std::string RandomBytes(size_t size, Rng& rng) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, size - i));
  }
  return bytes;
}

AttendRequest RandomRequest(Rng& rng, size_t max_tensor_bytes) {
  AttendRequest request;
  if (Chance(rng, 0.8)) request.set_request_id(rng() >> (rng() % 64));
  request.set_layer(RandomInt32(rng));
  const int segments = std::uniform_int_distribution<int>(0, 5)(rng);
  for (int i = 0; i < segments; ++i) {
    mla_offload::v1::Segment* segment = request.add_segments();
    segment->set_session_id(RandomSessionId(rng));
    segment->set_position(RandomInt32(rng));
    segment->set_num_tokens(RandomInt32(rng));
    segment->set_first_compressed_row(RandomInt32(rng));
    segment->set_num_compressed_rows(RandomInt32(rng));
  }
  request.set_head_offset(RandomInt32(rng));
  if (Chance(rng, 0.8)) FillRandomTensor(rng, max_tensor_bytes, request.mutable_q());
  if (Chance(rng, 0.6)) FillRandomTensor(rng, max_tensor_bytes, request.mutable_kv());
  if (Chance(rng, 0.4)) {
    FillRandomTensor(rng, max_tensor_bytes, request.mutable_compressed_kv());
  }
  if (Chance(rng, 0.5)) FillRandomTensor(rng, max_tensor_bytes, request.mutable_topk());
  request.set_return_lse(Chance(rng, 0.5));
  request.set_derotate_output(Chance(rng, 0.5));
  for (mla_offload::v1::Tensor* tensor : {request.mutable_q(), request.mutable_kv()}) {
    if (Chance(rng, 0.3)) FillRandomRegion(rng, tensor->mutable_region());
  }
  if (Chance(rng, 0.3)) FillRandomRegion(rng, request.mutable_out_region());
  if (Chance(rng, 0.3)) FillRandomRegion(rng, request.mutable_lse_region());
  request.set_fp8_output(Chance(rng, 0.5));
  if (Chance(rng, 0.3)) FillRandomRegion(rng, request.mutable_out_scales_region());
  return request;
}

AttendResponse RandomResponse(Rng& rng, size_t max_tensor_bytes) {
  static const double kSpecial[] = {
      0.0, -0.0, 1.5, -3.25e7, std::numeric_limits<double>::infinity(),
      std::numeric_limits<double>::denorm_min()};
  AttendResponse response;
  if (Chance(rng, 0.8)) response.set_request_id(rng() >> (rng() % 64));
  if (Chance(rng, 0.8)) {
    FillRandomTensor(rng, max_tensor_bytes, response.mutable_out());
  }
  if (Chance(rng, 0.5)) {
    FillRandomTensor(rng, max_tensor_bytes, response.mutable_lse());
  }
  if (Chance(rng, 0.8)) {
    mla_offload::v1::Timing* timing = response.mutable_timing();
    auto value = [&rng]() {
      return Chance(rng, 0.3)
                 ? kSpecial[std::uniform_int_distribution<int>(0, 5)(rng)]
                 : std::uniform_real_distribution<double>(0, 1e6)(rng);
    };
    timing->set_queue_us(value());
    timing->set_prologue_us(value());
    timing->set_decode_us(value());
    timing->set_total_us(value());
    timing->set_batch_tokens(RandomInt32(rng));
    timing->set_plan_us(value());
    timing->set_upload_us(value());
    timing->set_readback_us(value());
    timing->set_serialize_us(value());
  }
  if (Chance(rng, 0.3)) {
    mla_offload::v1::RequestStatus* status = response.mutable_status();
    status->set_code(RandomInt32(rng) % 17);
    status->set_message(RandomSessionId(rng));
  }
  if (Chance(rng, 0.4)) {
    FillRandomTensor(rng, max_tensor_bytes, response.mutable_out_scales());
  }
  return response;
}

AttendRequest ToProto(const AttendRequestView& view) {
  AttendRequest request;
  request.set_request_id(view.request_id);
  request.set_layer(view.layer);
  for (const SegmentView& segment : view.segments) {
    mla_offload::v1::Segment* out = request.add_segments();
    out->set_session_id(segment.session_id);
    out->set_position(segment.position);
    out->set_num_tokens(segment.num_tokens);
    out->set_first_compressed_row(segment.first_compressed_row);
    out->set_num_compressed_rows(segment.num_compressed_rows);
  }
  request.set_head_offset(view.head_offset);
  if (view.q) TensorToProto(*view.q, request.mutable_q());
  if (view.kv) TensorToProto(*view.kv, request.mutable_kv());
  if (view.compressed_kv) {
    TensorToProto(*view.compressed_kv, request.mutable_compressed_kv());
  }
  if (view.topk) TensorToProto(*view.topk, request.mutable_topk());
  request.set_return_lse(view.return_lse);
  request.set_derotate_output(view.derotate_output);
  if (view.out_region) RegionToProto(*view.out_region, request.mutable_out_region());
  if (view.lse_region) RegionToProto(*view.lse_region, request.mutable_lse_region());
  request.set_fp8_output(view.fp8_output);
  if (view.out_scales_region) {
    RegionToProto(*view.out_scales_region, request.mutable_out_scales_region());
  }
  return request;
}

AttendResponse ToProto(const AttendResponseView& view) {
  AttendResponse response;
  response.set_request_id(view.request_id);
  if (view.out) TensorToProto(*view.out, response.mutable_out());
  if (view.lse) TensorToProto(*view.lse, response.mutable_lse());
  if (view.timing) {
    mla_offload::v1::Timing* timing = response.mutable_timing();
    timing->set_queue_us(view.timing->queue_us);
    timing->set_prologue_us(view.timing->prologue_us);
    timing->set_decode_us(view.timing->decode_us);
    timing->set_total_us(view.timing->total_us);
    timing->set_batch_tokens(view.timing->batch_tokens);
    timing->set_plan_us(view.timing->plan_us);
    timing->set_upload_us(view.timing->upload_us);
    timing->set_readback_us(view.timing->readback_us);
    timing->set_serialize_us(view.timing->serialize_us);
  }
  if (view.status) {
    response.mutable_status()->set_code(view.status->code);
    response.mutable_status()->set_message(view.status->message);
  }
  if (view.out_scales) TensorToProto(*view.out_scales, response.mutable_out_scales());
  return response;
}

AttendRequestView ViewOf(const AttendRequest& message,
                         std::shared_ptr<const void> keep_alive, Rng* rng) {
  AttendRequestView view;
  view.request_id = message.request_id();
  view.layer = message.layer();
  for (const mla_offload::v1::Segment& segment : message.segments()) {
    view.segments.push_back(SegmentView{
        segment.session_id(), segment.position(), segment.num_tokens(),
        segment.first_compressed_row(), segment.num_compressed_rows()});
  }
  view.head_offset = message.head_offset();
  if (message.has_q()) view.q = TensorViewOf(message.q(), keep_alive, rng);
  if (message.has_kv()) view.kv = TensorViewOf(message.kv(), keep_alive, rng);
  if (message.has_compressed_kv()) {
    view.compressed_kv =
        TensorViewOf(message.compressed_kv(), keep_alive, rng);
  }
  if (message.has_topk()) {
    view.topk = TensorViewOf(message.topk(), keep_alive, rng);
  }
  view.return_lse = message.return_lse();
  view.derotate_output = message.derotate_output();
  if (message.has_out_region()) view.out_region = RegionViewOf(message.out_region());
  if (message.has_lse_region()) view.lse_region = RegionViewOf(message.lse_region());
  view.fp8_output = message.fp8_output();
  if (message.has_out_scales_region()) {
    view.out_scales_region = RegionViewOf(message.out_scales_region());
  }
  return view;
}

AttendResponseView ViewOf(const AttendResponse& message,
                          std::shared_ptr<const void> keep_alive, Rng* rng) {
  AttendResponseView view;
  view.request_id = message.request_id();
  if (message.has_out()) {
    view.out = TensorViewOf(message.out(), keep_alive, rng);
  }
  if (message.has_lse()) {
    view.lse = TensorViewOf(message.lse(), keep_alive, rng);
  }
  if (message.has_timing()) {
    const mla_offload::v1::Timing& timing = message.timing();
    view.timing = TimingView{timing.queue_us(),   timing.prologue_us(),
                             timing.decode_us(),  timing.total_us(),
                             timing.batch_tokens(), timing.plan_us(),
                             timing.upload_us(),  timing.readback_us(),
                             timing.serialize_us()};
  }
  if (message.has_status()) {
    view.status =
        RequestStatusView{message.status().code(), message.status().message()};
  }
  if (message.has_out_scales()) {
    view.out_scales = TensorViewOf(message.out_scales(), keep_alive, rng);
  }
  return view;
}

::testing::AssertionResult SameMessage(
    const google::protobuf::Message& expected,
    const google::protobuf::Message& actual) {
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  std::string difference;
  differencer.ReportDifferencesToString(&difference);
  if (differencer.Compare(expected, actual)) {
    return ::testing::AssertionSuccess();
  }
  // Tensor data differences are long; the start says enough.
  return ::testing::AssertionFailure() << difference.substr(0, 2000);
}

grpc::ByteBuffer BufferWithCuts(const std::string& wire,
                                const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t begin = 0;
  for (size_t end : cuts) {
    slices.emplace_back(wire.data() + begin, end - begin);
    begin = end;
  }
  slices.emplace_back(wire.data() + begin, wire.size() - begin);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer BufferWithRandomCuts(const std::string& wire, size_t count,
                                      Rng& rng) {
  std::vector<size_t> cuts(count);
  for (size_t& cut : cuts) {
    cut = std::uniform_int_distribution<size_t>(0, wire.size())(rng);
  }
  std::sort(cuts.begin(), cuts.end());
  return BufferWithCuts(wire, cuts);
}

grpc::ByteBuffer StaticBuffer(const std::string& wire) {
  grpc::Slice slice(wire.data(), wire.size(), grpc::Slice::STATIC_SLICE);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

std::string Varint(uint64_t value) {
  std::string bytes;
  while (value >= 0x80) {
    bytes.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  bytes.push_back(static_cast<char>(value));
  return bytes;
}

std::string Key(uint32_t field, WireType type) {
  return Varint((uint64_t{field} << 3) | static_cast<uint64_t>(type));
}

std::string VarintField(uint32_t field, uint64_t value) {
  return Key(field, WireType::kVarint) + Varint(value);
}

std::string LengthDelimited(uint32_t field, const std::string& payload) {
  return Key(field, WireType::kLengthDelimited) + Varint(payload.size()) +
         payload;
}

std::string Fixed64Field(uint32_t field, uint64_t value) {
  std::string bytes = Key(field, WireType::kFixed64);
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>(value >> (8 * i)));
  return bytes;
}

std::string Fixed32Field(uint32_t field, uint32_t value) {
  std::string bytes = Key(field, WireType::kFixed32);
  for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(value >> (8 * i)));
  return bytes;
}

}  // namespace mla::wire::testing
