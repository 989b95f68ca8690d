// The attend codec against the generated classes on a V4-Pro TP8 message of
// 128 tokens: a request with 2 MiB of bf16 q (plus 128 KiB kv), and a
// response with 2 MiB of output (plus 8 KiB lse). Parsing runs on a buffer in
// one slice and on one cut into 16 KiB slices, as a transport delivers it.
//
//   bazel run //proto:attend_codec_bench  (.bazelrc builds with -O2)
//
// Throughput counts the message's bytes.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <grpcpp/impl/codegen/proto_utils.h>  // SerializationTraits
#include <grpcpp/support/byte_buffer.h>

#include "proto/attend_codec.h"
#include "proto/attend_codec_test_util.h"
#include "proto/mla_offload.pb.h"

namespace mla::wire {
namespace {

using ::mla::wire::testing::BufferWithCuts;
using ::mla::wire::testing::RandomBytes;
using ::mla::wire::testing::Rng;
using ::mla_offload::v1::AttendRequest;
using ::mla_offload::v1::AttendResponse;

constexpr int kTokens = 128;
constexpr int kHeads = 16;
constexpr int kHeadDim = 512;
constexpr size_t kOutBytes = size_t{kTokens} * kHeads * kHeadDim * 2;
constexpr size_t kLseBytes = size_t{kTokens} * kHeads * 4;

AttendRequest BenchRequest() {
  Rng rng(1);
  AttendRequest request;
  request.set_request_id(123456789);
  request.set_layer(17);
  mla_offload::v1::Segment* segment = request.add_segments();
  segment->set_session_id("0123456789abcdef0123456789abcdef");
  segment->set_position(4096);
  segment->set_num_tokens(kTokens);
  request.mutable_q()->set_dtype(mla_offload::v1::DTYPE_BF16);
  for (int64_t d : {kTokens, kHeads, kHeadDim}) request.mutable_q()->add_shape(d);
  request.mutable_q()->set_data(RandomBytes(kOutBytes, rng));
  request.mutable_kv()->set_dtype(mla_offload::v1::DTYPE_BF16);
  for (int64_t d : {kTokens, kHeadDim}) request.mutable_kv()->add_shape(d);
  request.mutable_kv()->set_data(RandomBytes(size_t{kTokens} * kHeadDim * 2, rng));
  return request;
}

// The request's bytes as gRPC hands them over: one slice, or 16 KiB slices.
grpc::ByteBuffer RequestBuffer(int64_t slice_bytes) {
  const std::string wire = BenchRequest().SerializeAsString();
  std::vector<size_t> cuts;
  for (size_t at = slice_bytes; at < wire.size(); at += slice_bytes) {
    cuts.push_back(at);
  }
  return BufferWithCuts(wire, cuts);
}

// The slice size of a run: 0 means one slice.
int64_t SliceBytes(const benchmark::State& state) {
  return state.range(0) == 0 ? int64_t{1} << 40 : state.range(0);
}

// What a plain service's SerializationTraits do: read the ByteBuffer through
// a zero-copy stream into the generated class, whose bytes fields copy.
void BM_ParseRequestGeneratedTraits(benchmark::State& state) {
  const grpc::ByteBuffer buffer = RequestBuffer(SliceBytes(state));
  for (auto _ : state) {
    grpc::ByteBuffer consumed = buffer;  // Deserialize clears its input
    AttendRequest request;
    grpc::Status status =
        grpc::SerializationTraits<AttendRequest>::Deserialize(&consumed,
                                                              &request);
    benchmark::DoNotOptimize(request.q().data().data());
    if (!status.ok()) state.SkipWithError("deserialize failed");
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

// The traits' parse plus the copy a server still has to make from the
// message's strings into its staging buffer: two copies in all.
void BM_ParseRequestGeneratedTraitsAndCopy(benchmark::State& state) {
  const grpc::ByteBuffer buffer = RequestBuffer(SliceBytes(state));
  std::vector<uint8_t> staging(buffer.Length());
  for (auto _ : state) {
    grpc::ByteBuffer consumed = buffer;
    AttendRequest request;
    grpc::Status status =
        grpc::SerializationTraits<AttendRequest>::Deserialize(&consumed,
                                                              &request);
    if (!status.ok()) state.SkipWithError("deserialize failed");
    const std::string& q = request.q().data();
    const std::string& kv = request.kv().data();
    std::memcpy(staging.data(), q.data(), q.size());
    std::memcpy(staging.data() + q.size(), kv.data(), kv.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

// The same through a flat string: ByteBuffer -> std::string -> ParseFromString.
void BM_ParseRequestGeneratedString(benchmark::State& state) {
  const grpc::ByteBuffer buffer = RequestBuffer(SliceBytes(state));
  for (auto _ : state) {
    std::vector<grpc::Slice> slices;
    (void)buffer.Dump(&slices);
    std::string wire;
    wire.reserve(buffer.Length());
    for (const grpc::Slice& slice : slices) {
      wire.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    AttendRequest request;
    if (!request.ParseFromString(wire)) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(request.q().data().data());
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

void BM_ParseRequestCodec(benchmark::State& state) {
  const grpc::ByteBuffer buffer = RequestBuffer(SliceBytes(state));
  for (auto _ : state) {
    absl::StatusOr<AttendRequestView> request =
        ParseAttendRequest(buffer, ~size_t{0});
    if (!request.ok()) state.SkipWithError("parse failed");
    benchmark::DoNotOptimize(request->q->pieces.data());
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

// The codec's parse plus the one copy it leaves: q and kv into staging.
void BM_ParseRequestCodecAndCopy(benchmark::State& state) {
  const grpc::ByteBuffer buffer = RequestBuffer(SliceBytes(state));
  std::vector<uint8_t> staging(buffer.Length());
  for (auto _ : state) {
    absl::StatusOr<AttendRequestView> request =
        ParseAttendRequest(buffer, ~size_t{0});
    if (!request.ok()) state.SkipWithError("parse failed");
    request->q->CopyTo(staging.data());
    request->kv->CopyTo(staging.data() + request->q->size_bytes());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * buffer.Length());
}

// The output as the engine leaves it, in memory the response may reference.
struct ResponseOutput {
  std::shared_ptr<std::string> out;
  std::shared_ptr<std::string> lse;
};

ResponseOutput BenchOutput() {
  Rng rng(2);
  return {std::make_shared<std::string>(RandomBytes(kOutBytes, rng)),
          std::make_shared<std::string>(RandomBytes(kLseBytes, rng))};
}

void FillTiming(mla_offload::v1::Timing* timing) {
  timing->set_queue_us(12.5);
  timing->set_prologue_us(30.25);
  timing->set_decode_us(80.0);
  timing->set_total_us(140.0);
  timing->set_batch_tokens(512);
}

// A plain service: copy the output into the generated message, then its
// SerializationTraits copy it again into the ByteBuffer.
void BM_SerializeResponseGenerated(benchmark::State& state) {
  const ResponseOutput output = BenchOutput();
  size_t bytes = 0;
  for (auto _ : state) {
    AttendResponse response;
    response.set_request_id(123456789);
    response.mutable_out()->set_dtype(mla_offload::v1::DTYPE_BF16);
    for (int64_t d : {kTokens, kHeads, kHeadDim}) {
      response.mutable_out()->add_shape(d);
    }
    response.mutable_out()->set_data(*output.out);
    response.mutable_lse()->set_dtype(mla_offload::v1::DTYPE_F32);
    for (int64_t d : {kTokens, kHeads}) response.mutable_lse()->add_shape(d);
    response.mutable_lse()->set_data(*output.lse);
    FillTiming(response.mutable_timing());
    grpc::ByteBuffer buffer;
    bool own_buffer = false;
    grpc::Status status = grpc::SerializationTraits<AttendResponse>::Serialize(
        response, &buffer, &own_buffer);
    if (!status.ok()) state.SkipWithError("serialize failed");
    bytes = buffer.Length();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// Only the SerializationTraits copy, the message already built.
void BM_SerializeResponseGeneratedPrebuilt(benchmark::State& state) {
  const ResponseOutput output = BenchOutput();
  AttendResponse response;
  response.set_request_id(123456789);
  response.mutable_out()->set_data(*output.out);
  response.mutable_lse()->set_data(*output.lse);
  FillTiming(response.mutable_timing());
  size_t bytes = 0;
  for (auto _ : state) {
    grpc::ByteBuffer buffer;
    bool own_buffer = false;
    grpc::Status status = grpc::SerializationTraits<AttendResponse>::Serialize(
        response, &buffer, &own_buffer);
    if (!status.ok()) state.SkipWithError("serialize failed");
    bytes = buffer.Length();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

void BM_SerializeResponseCodec(benchmark::State& state) {
  const ResponseOutput output = BenchOutput();
  size_t bytes = 0;
  for (auto _ : state) {
    AttendResponseView response;
    response.request_id = 123456789;
    response.out =
        MakeTensorView(DType::kBf16, {kTokens, kHeads, kHeadDim},
                       output.out->data(), output.out->size(), output.out);
    response.lse =
        MakeTensorView(DType::kF32, {kTokens, kHeads}, output.lse->data(),
                       output.lse->size(), output.lse);
    response.timing = TimingView{12.5, 30.25, 80.0, 140.0, 512};
    grpc::ByteBuffer buffer = SerializeAttendResponse(response);
    bytes = buffer.Length();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_ParseRequestGeneratedTraits)->Arg(0)->Arg(16384);
BENCHMARK(BM_ParseRequestGeneratedTraitsAndCopy)->Arg(0)->Arg(16384);
BENCHMARK(BM_ParseRequestGeneratedString)->Arg(0)->Arg(16384);
BENCHMARK(BM_ParseRequestCodec)->Arg(0)->Arg(16384);
BENCHMARK(BM_ParseRequestCodecAndCopy)->Arg(0)->Arg(16384);
BENCHMARK(BM_SerializeResponseGenerated);
BENCHMARK(BM_SerializeResponseGeneratedPrebuilt);
BENCHMARK(BM_SerializeResponseCodec);

}  // namespace
}  // namespace mla::wire

BENCHMARK_MAIN();
