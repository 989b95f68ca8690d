// mla_demo_client: drives a running mla_offload_server with a short decode
// load and prints what happens, step by step. It is the client half of
// README.md's run command; the load-test client measures properly.
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "proto/mla_offload.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "HOST:PORT of the server.");
ABSL_FLAG(std::string, model, "deepseek-v4-flash", "Model profile of the sessions.");
ABSL_FLAG(int, tp, 4, "Tensor-parallel degree: each request carries h_total / tp heads.");
ABSL_FLAG(int, sessions, 4, "Sequences decoded together (one token each per Attend message).");
ABSL_FLAG(int, prompt, 512, "Prompt tokens appended to each session before decoding.");
ABSL_FLAG(int, steps, 2, "Decode steps; each runs every attention layer once.");
ABSL_FLAG(int, seed, 1, "Random seed of the synthetic activations.");

namespace mla {
namespace {

namespace pb = ::mla_offload::v1;
constexpr int kDim = 512;

using Clock = std::chrono::steady_clock;

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Random bf16 values (normal, scale `sigma`) as a Tensor.
void FillBf16(std::mt19937& rng, float sigma, std::vector<int64_t> shape, pb::Tensor* tensor) {
  std::normal_distribution<float> normal(0.0f, sigma);
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  std::string data(count * 2, '\0');
  for (int64_t i = 0; i < count; ++i) {
    float value = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
    const uint16_t half = static_cast<uint16_t>(bits >> 16);
    std::memcpy(&data[i * 2], &half, 2);
  }
  tensor->set_dtype(pb::DTYPE_BF16);
  for (int64_t dim : shape) tensor->add_shape(dim);
  tensor->set_data(std::move(data));
}

int Fail(const std::string& what, const grpc::Status& status) {
  std::fprintf(stderr, "mla_demo_client: %s failed: %s (%d)\n", what.c_str(),
               status.error_message().c_str(), static_cast<int>(status.error_code()));
  return 1;
}

int Main() {
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_target),
                                           grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<pb::MlaOffload::Stub> stub = pb::MlaOffload::NewStub(channel);
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(60); };

  pb::ServerInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(deadline());
    grpc::Status status = stub->GetServerInfo(&context, pb::GetServerInfoRequest(), &info);
    if (!status.ok()) return Fail("GetServerInfo", status);
  }
  const pb::ModelInfo* model = nullptr;
  for (const pb::ModelInfo& candidate : info.models()) {
    if (candidate.name() == absl::GetFlag(FLAGS_model)) model = &candidate;
  }
  if (model == nullptr) {
    std::fprintf(stderr, "mla_demo_client: the server does not serve --model=%s\n",
                 absl::GetFlag(FLAGS_model).c_str());
    return 1;
  }
  // The sizes below multiply what the server said and what the flags say:
  // both are bounded first, so no product overflows.
  if (model->num_attention_layers() < 1 || model->num_attention_layers() > 1024 ||
      model->compress_ratios_size() != model->num_attention_layers() ||
      model->num_query_heads() < 1 || model->num_query_heads() > 1024 ||
      model->indexer_topk() < 1 || model->indexer_topk() > 65536) {
    std::fprintf(stderr, "mla_demo_client: the server's profile of %s is not a DeepSeek-V4 model "
                 "this client can drive (layers, ratios, heads or top-k out of range)\n",
                 model->name().c_str());
    return 1;
  }
  const int tp = absl::GetFlag(FLAGS_tp);
  const int num_sessions = absl::GetFlag(FLAGS_sessions);
  const int prompt = absl::GetFlag(FLAGS_prompt);
  if (tp < 1 || model->num_query_heads() % tp != 0 || num_sessions < 1 || num_sessions > 1024 ||
      prompt < 1 || prompt > (1 << 20)) {
    std::fprintf(stderr, "mla_demo_client: --tp must divide the model's %d heads, --sessions be in "
                 "1..1024 and --prompt in 1..%d\n", model->num_query_heads(), 1 << 20);
    return 2;
  }
  const int heads = model->num_query_heads() / tp;
  const int layers = model->num_attention_layers();
  std::printf("server   %s, backend %s, KV cache %lld blocks (%lld used)\n", info.version().c_str(),
              info.backend().c_str(), static_cast<long long>(info.kv_blocks_total()),
              static_cast<long long>(info.kv_blocks_used()));
  std::printf("load     %s, TP%d -> %d heads per request, %d sessions, prompt %d tokens, "
              "%d decode steps x %d layers\n",
              model->name().c_str(), tp, heads, num_sessions, prompt,
              absl::GetFlag(FLAGS_steps), layers);

  std::fflush(stdout);

  // Sessions and their prompts; a progress line when a person is watching.
  const bool progress = isatty(fileno(stderr));
  std::vector<std::string> ids;
  const auto append_start = Clock::now();
  for (int s = 0; s < num_sessions; ++s) {
    pb::CreateSessionRequest create;
    create.set_model(model->name());
    create.set_num_heads(heads);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    pb::Tensor* sinks = create.mutable_sinks();
    sinks->set_dtype(pb::DTYPE_F32);
    sinks->add_shape(layers);
    sinks->add_shape(model->num_query_heads());
    std::string sink_bytes(layers * model->num_query_heads() * 4, '\0');
    for (int i = 0; i < layers * model->num_query_heads(); ++i) {
      const float value = normal(rng);
      std::memcpy(&sink_bytes[i * 4], &value, 4);
    }
    sinks->set_data(std::move(sink_bytes));
    pb::CreateSessionResponse created;
    grpc::ClientContext context;
    context.set_deadline(deadline());
    grpc::Status status = stub->CreateSession(&context, create, &created);
    if (!status.ok()) return Fail("CreateSession", status);
    ids.push_back(created.session_id());

    pb::AppendKVRequest append;
    append.set_session_id(created.session_id());
    append.set_first_position(0);
    append.set_num_positions(prompt);
    for (int layer = 0; layer < layers; ++layer) {
      pb::LayerRows* rows = append.add_layers();
      rows->set_layer(layer);
      FillBf16(rng, 1.0f, {prompt, kDim}, rows->mutable_swa_kv());
      const int ratio = model->compress_ratios(layer);
      if (ratio > 0 && prompt / ratio > 0) {
        FillBf16(rng, 1.0f, {prompt / ratio, kDim}, rows->mutable_compressed_kv());
      }
    }
    pb::AppendKVResponse appended;
    grpc::ClientContext append_context;
    append_context.set_deadline(deadline());
    status = stub->AppendKV(&append_context, append, &appended);
    if (!status.ok()) return Fail("AppendKV", status);
    if (progress) {
      std::fprintf(stderr, "\rappend   session %d/%d (%lld KV blocks each)", s + 1, num_sessions,
                   static_cast<long long>(appended.kv_blocks_used()));
    }
  }
  if (progress) std::fprintf(stderr, "\n");
  std::printf("prompts  %d sessions x %d tokens appended in %.0f ms\n", num_sessions, prompt,
              MillisSince(append_start));

  // Decode: one Attend message per layer step carrying one token per session.
  grpc::ClientContext stream_context;
  auto stream = stub->Attend(&stream_context);
  uint64_t request_id = 0;
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    const int position = prompt + step;
    double sum_ms = 0, max_ms = 0, queue_us = 0, prologue_us = 0, decode_us = 0;
    double out_abs = 0;
    int64_t out_values = 0;
    for (int layer = 0; layer < layers; ++layer) {
      pb::AttendRequest request;
      request.set_request_id(++request_id);
      request.set_layer(layer);
      const int ratio = model->compress_ratios(layer);
      const bool new_row = ratio > 0 && (position + 1) % ratio == 0;
      for (const std::string& id : ids) {
        pb::Segment* segment = request.add_segments();
        segment->set_session_id(id);
        segment->set_position(position);
        segment->set_num_tokens(1);
        if (ratio > 0) {
          segment->set_first_compressed_row(position / ratio);
          segment->set_num_compressed_rows(new_row ? 1 : 0);
        }
      }
      FillBf16(rng, 1.0f, {num_sessions, heads, kDim}, request.mutable_q());
      FillBf16(rng, 1.0f, {num_sessions, kDim}, request.mutable_kv());
      if (new_row) FillBf16(rng, 1.0f, {num_sessions, kDim}, request.mutable_compressed_kv());
      if (ratio == 4) {
        // The indexer's top-k: random existing rows, -1 beyond them.
        const int rows = (position + 1) / 4;
        const int width = model->indexer_topk();
        std::uniform_int_distribution<int32_t> any_row(0, rows - 1);
        std::string topk(num_sessions * width * 4, '\0');
        for (int i = 0; i < num_sessions * width; ++i) {
          const int32_t row = i % width < rows ? any_row(rng) : -1;
          std::memcpy(&topk[i * 4], &row, 4);
        }
        pb::Tensor* tensor = request.mutable_topk();
        tensor->set_dtype(pb::DTYPE_I32);
        tensor->add_shape(num_sessions);
        tensor->add_shape(width);
        tensor->set_data(std::move(topk));
      }
      request.set_return_lse(true);
      const auto start = Clock::now();
      pb::AttendResponse response;
      if (!stream->Write(request) || !stream->Read(&response)) {
        return Fail("Attend", stream->Finish());
      }
      const double ms = MillisSince(start);
      if (response.status().code() != 0) {
        std::fprintf(stderr, "mla_demo_client: Attend layer %d: %s\n", layer,
                     response.status().message().c_str());
        return 1;
      }
      sum_ms += ms;
      max_ms = std::max(max_ms, ms);
      queue_us += response.timing().queue_us();
      prologue_us += response.timing().prologue_us();
      decode_us += response.timing().decode_us();
      const std::string& out = response.out().data();
      for (size_t i = 0; i + 1 < out.size(); i += 2) {
        uint32_t bits = static_cast<uint32_t>(static_cast<uint8_t>(out[i]) |
                                              (static_cast<uint8_t>(out[i + 1]) << 8))
                        << 16;
        float value;
        std::memcpy(&value, &bits, 4);
        out_abs += std::fabs(value);
        ++out_values;
      }
    }
    std::printf("step %-3d position %d: %d layers in %.1f ms (per layer step: mean %.2f ms, "
                "max %.2f ms; server: queue %.0f us, prologue %.0f us, decode %.0f us); "
                "mean |out| %.4f\n",
                step, position, layers, sum_ms, sum_ms / layers, max_ms, queue_us / layers,
                prologue_us / layers, decode_us / layers, out_abs / std::max<int64_t>(out_values, 1));
    std::fflush(stdout);
  }
  stream->WritesDone();
  grpc::Status finished = stream->Finish();
  if (!finished.ok()) return Fail("Attend stream", finished);

  int64_t freed = 0;
  for (const std::string& id : ids) {
    pb::CloseSessionRequest close;
    close.set_session_id(id);
    pb::CloseSessionResponse closed;
    grpc::ClientContext context;
    context.set_deadline(deadline());
    grpc::Status status = stub->CloseSession(&context, close, &closed);
    if (!status.ok()) return Fail("CloseSession", status);
    freed += closed.kv_blocks_freed();
  }
  std::printf("closed   %d sessions, %lld KV blocks freed\n", num_sessions,
              static_cast<long long>(freed));
  return 0;
}

}  // namespace
}  // namespace mla

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Drives a running mla_offload_server with a short DeepSeek-V4 decode load: creates\n"
      "sessions, appends a synthetic prompt, streams every layer of a few decode steps\n"
      "and prints latency, the server's time breakdown and the output per step.\n\n"
      "  mla_demo_client --target=127.0.0.1:50051 --model=deepseek-v4-flash --tp=4");
  absl::ParseCommandLine(argc, argv);
  return mla::Main();
}
