// End-to-end tests of the real mla_offload_server process over loopback gRPC.
//
// Each test starts the server binary (a child process, found in the test's
// runfiles) on 127.0.0.1 with a free port, learns its gRPC and metrics ports
// from the first line it prints, and talks to it with the generated protobuf
// stubs only (no project client code), which also shows that plain protobuf
// clients interoperate with the server's raw zero-copy Attend. The server is
// stopped with SIGTERM (SIGKILL if that does not end it) when the test ends.
//
// Expected answers come from the test's own model of each session: every KV
// row, query and top-k list is a pure function of the session's salt, the
// layer and the position (or compressed row), so the test can build any row
// again. A Mirror inserts the rows an answer needs into its own cache pool
// through kernels::CpuBackend (at slots it chooses) and decodes with the key
// lists of spec section 1 in the server's order (SWA window ascending, then
// compressed rows in top-k or row order): the server's output must be
// bit-identical to it, and within the section 7 tolerances of the float64
// reference (kernels/reference) run on the same cache bytes and queries.
//
// With MLA_OFFLOAD_BACKEND=cuda (on a GPU machine) the server runs its CUDA
// backend: answers are then held to the float64 reference's tolerances only,
// not to the CPU mirror's bits, and ServerInfo names the CUDA backend.
//
// What the server does is checked only through what a client sees: answers,
// status codes and messages, ServerInfo, ListSessions, the health service,
// /metrics and the process's exit; for the same-host regions also the
// shared memory itself and what the server process maps (/proc/PID/maps),
// with region_holder as a client that dies holding a region.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/test_processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cache_format.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/reference/tolerance.h"
#include "kernels/rope.h"
#include "proto/mla_offload.grpc.pb.h"
#include "tests/integration/health.grpc.pb.h"
#ifdef MLA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "client/cuda_region.h"
#endif
#include "server/regions/testing/regions.h"
#include "tests/support/test_rows.h"

extern char** environ;

namespace mla {
namespace {

// The server's --backend for this run: $MLA_OFFLOAD_BACKEND, "cpu" when unset.
std::string ServerBackend() {
  const char* backend = std::getenv("MLA_OFFLOAD_BACKEND");
  return backend == nullptr ? "cpu" : backend;
}

// Whether answers must equal the CPU mirror's bits (the CPU backend is
// deterministic and the mirror runs the same code).
bool ExpectMirrorBits() { return ServerBackend() == "cpu"; }


namespace pb = ::mla_offload::v1;
using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using reference::ComparisonReport;
using ::testing::HasSubstr;

constexpr int32_t kMaxPosition = 8192;
constexpr char kFlash[] = "deepseek-v4-flash";
constexpr char kPro[] = "deepseek-v4-pro";
// The health name a readiness probe asks ("" is liveness).
constexpr char kReadiness[] = "mla_offload.v1.MlaOffload";
constexpr int kRingBlocks = 4;  // blocks of a session's SWA ring, per layer
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- The server process (client/test_processes.h).

using ServerProcess = ::mla::client::TestServer;

// Starts the server with the flags every test uses, then `flags` (a later
// flag overrides an earlier one). The binary is the one in the test's
// runfiles, or $MLA_OFFLOAD_SERVER (to hold another build, e.g. a CUDA one,
// to the same tests).
absl::StatusOr<std::unique_ptr<ServerProcess>> StartServerProcess(
    const std::vector<std::string>& flags) {
  std::vector<std::string> all = {"--metrics_listen=127.0.0.1:0", absl::StrCat("--max_position=", kMaxPosition),
                                  absl::StrCat("--backend=", ServerBackend())};
  all.insert(all.end(), flags.begin(), flags.end());
  return ServerProcess::Start(all);
}

std::shared_ptr<grpc::Channel> NewChannel(const ServerProcess& server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(server.target(), grpc::InsecureChannelCredentials(), args);
}

// ---- /metrics over a plain socket.

// GET `path` from 127.0.0.1:port (or [::1]:port), with `headers` ("Name:
// value\r\n" lines); the body of a 200 answer, else an error with the start
// of the answer.
absl::StatusOr<std::string> HttpGet(int port, absl::string_view path,
                                    absl::string_view headers = "", bool ipv6 = false) {
  const int fd = socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_storage storage{};
  socklen_t length = sizeof(sockaddr_in);
  if (ipv6) {
    auto* address = reinterpret_cast<sockaddr_in6*>(&storage);
    address->sin6_family = AF_INET6;
    address->sin6_port = htons(static_cast<uint16_t>(port));
    address->sin6_addr = in6addr_loopback;
    length = sizeof(sockaddr_in6);
  } else {
    auto* address = reinterpret_cast<sockaddr_in*>(&storage);
    address->sin_family = AF_INET;
    address->sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &address->sin_addr);
  }
  if (connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to metrics port ", port, " failed"));
  }
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n", headers,
                   "\r\n");
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    close(fd);
    return absl::UnavailableError("send failed");
  }
  std::string response;
  char buffer[8192];
  ssize_t got;
  while ((got = recv(fd, buffer, sizeof(buffer), 0)) > 0) response.append(buffer, got);
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos ||
      response.substr(0, response.find("\r\n")).find(" 200") == std::string::npos) {
    return absl::InternalError(absl::StrCat("bad HTTP response: ", response.substr(0, 200)));
  }
  return response.substr(body + 4);
}

// Samples of the Prometheus text format, looked up by name and labels.
class Metrics {
 public:
  explicit Metrics(absl::string_view text) {
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (line.empty() || line[0] == '#') continue;
      Sample sample;
      const size_t name_end = line.find_first_of("{ ");
      sample.name = std::string(line.substr(0, name_end));
      size_t value_start = name_end;
      if (name_end != absl::string_view::npos && line[name_end] == '{') {
        const size_t close = line.find('}', name_end);
        for (absl::string_view pair : absl::StrSplit(
                 line.substr(name_end + 1, close - name_end - 1), ',', absl::SkipEmpty())) {
          const size_t eq = pair.find('=');
          std::string value(pair.substr(eq + 1));
          if (value.size() >= 2 && value.front() == '"') value = value.substr(1, value.size() - 2);
          sample.labels[std::string(pair.substr(0, eq))] = value;
        }
        value_start = close + 1;
      }
      if (!absl::SimpleAtod(line.substr(value_start), &sample.value)) continue;
      samples_.push_back(std::move(sample));
    }
  }

  // The value of the sample with this name whose labels include `labels`;
  // nullopt when there is none.
  std::optional<double> Get(absl::string_view name,
                            const std::map<std::string, std::string>& labels = {}) const {
    for (const Sample& sample : samples_) {
      if (sample.name != name) continue;
      bool match = true;
      for (const auto& [key, value] : labels) {
        auto it = sample.labels.find(key);
        match &= it != sample.labels.end() && it->second == value;
      }
      if (match) return sample.value;
    }
    return std::nullopt;
  }

  // requests_total of one method and code; 0 when never counted.
  double Requests(absl::string_view method, absl::string_view code) const {
    return Get("mla_requests_total", {{"method", std::string(method)}, {"code", std::string(code)}})
        .value_or(0.0);
  }

 private:
  struct Sample {
    std::string name;
    std::map<std::string, std::string> labels;
    double value = 0;
  };
  std::vector<Sample> samples_;
};

// ---- Random data, a pure function of its seed.

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t Mix(uint64_t a, uint64_t b) { return SplitMix(a ^ SplitMix(b ^ 0x5851f42d4c957f2dull)); }

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

void SetTensor(pb::Tensor* tensor, pb::DType dtype, std::vector<int64_t> shape, std::string data) {
  tensor->Clear();
  tensor->set_dtype(dtype);
  for (int64_t dim : shape) tensor->add_shape(dim);
  tensor->set_data(std::move(data));
}

// ---- The test's model of a session.

struct Seq {
  const ModelProfile* profile = nullptr;
  std::string id;
  int heads = 0;
  int padded = 0;
  uint64_t salt = 0;
  std::vector<float> sinks;   // [layers, h_total] as sent; empty: none
  std::vector<int32_t> next;  // per layer: the next position the server expects

  int layers() const { return profile->num_attention_layers(); }
  int ratio(int layer) const { return profile->compress_ratio(layer); }

  std::vector<uint16_t> SwaRow(int layer, int32_t position) const {
    return TestRows(Mix(Mix(salt, 4 * layer), position), 1);
  }
  std::vector<uint16_t> CompressedRow(int layer, int32_t row) const {
    return TestRows(Mix(Mix(salt, 4 * layer + 1), row), 1);
  }
  // q [H, 512] of one token of the rank whose first head is `head_offset`.
  std::vector<uint16_t> Query(int layer, int32_t position, int head_offset) const {
    return TestRows(Mix(Mix(salt, 4 * layer + 2), int64_t{position} * 1024 + head_offset), heads);
  }
  // The indexer's top-k of one token: `width` entries, of which up to
  // width - 3 are distinct rows below (p+1)/4 (the newest and row 0 always
  // among them, the rest random, in random order), -1 elsewhere, one pad
  // moved into the middle.
  std::vector<int32_t> TopK(int layer, int32_t position, int width) const {
    std::mt19937_64 rng(Mix(Mix(salt, 4 * layer + 3), position));
    const int32_t rows = (position + 1) / 4;
    std::vector<int32_t> pool(rows);
    for (int32_t j = 0; j < rows; ++j) pool[j] = j;
    const int32_t valid = std::max(0, std::min(rows, width - 3));
    std::vector<int32_t> chosen;
    if (valid > 0) chosen.push_back(rows - 1);
    if (valid > 1) chosen.push_back(0);
    for (int32_t i = 1; i < rows - 1 && static_cast<int32_t>(chosen.size()) < valid; ++i) {
      std::swap(pool[i], pool[i + rng() % (rows - 1 - i)]);
      chosen.push_back(pool[i]);
    }
    std::shuffle(chosen.begin(), chosen.end(), rng);
    std::vector<int32_t> topk(width, -1);
    std::copy(chosen.begin(), chosen.end(), topk.begin());
    if (valid > 2) std::swap(topk[valid / 2], topk[valid]);
    return topk;
  }
  float Sink(int layer, int head_offset, int h) const {
    if (sinks.empty()) return -kInf;
    return sinks[static_cast<size_t>(layer) * profile->num_query_heads + head_offset + h];
  }

  // Blocks the server must hold for the session: a 4-block SWA ring per
  // layer and 64-row pages of compressed rows.
  int64_t Blocks() const {
    int64_t blocks = 0;
    for (int layer = 0; layer < layers(); ++layer) {
      blocks += kRingBlocks;
      if (ratio(layer) != 0)
        blocks += (next[layer] / ratio(layer) + kBlockTokens - 1) / kBlockTokens;
    }
    return blocks;
  }
  int32_t NextPosition() const { return *std::min_element(next.begin(), next.end()); }
};

// Sinks [layers, h_total]: logits around the size of a token's lse (so they
// change the output noticeably), one in thirteen -inf.
std::vector<float> RandomSinks(const ModelProfile& profile, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(2.0f, 7.0f);
  std::vector<float> sinks(static_cast<size_t>(profile.num_attention_layers()) *
                           profile.num_query_heads);
  for (size_t i = 0; i < sinks.size(); ++i) sinks[i] = i % 13 == 5 ? -kInf : uniform(rng);
  return sinks;
}

// ---- The host-side model of the server's cache and its answers.

// One token's expected answer: what CpuBackend gives on the test's own copy
// of the rows (`out`, or with the FP8 output `e4m3` and `scales`; `lse`),
// and the float64 reference of the same decode.
struct TokenAnswer {
  std::vector<uint16_t> out;     // [H, 512]
  std::vector<uint8_t> e4m3;     // [H, 512]
  std::vector<uint8_t> scales;   // [H, 4]
  std::vector<float> lse;        // [H]
  reference::DecodeReference ref;
};

class Mirror {
 public:
  Mirror()
      : backend_(2),
        pool_(static_cast<size_t>(kBlocks) * kBlockBytes, 0),
        plain_(RopeKind::kPlain, kMaxPosition),
        yarn_(RopeKind::kYarn, kMaxPosition) {}

  // The answer to one token at `position` of `seq`'s layer, for the rank
  // whose first head is `head_offset`; `topk` is its C4A top-k (may be
  // empty); `fp8`: the FP8 output.
  TokenAnswer Decode(const Seq& seq, int layer, int32_t position, int head_offset,
                     absl::Span<const int32_t> topk, bool derotate, bool fp8) {
    std::lock_guard<std::mutex> lock(mutex_);
    const RopeTable& table = Table(seq, layer);
    const int heads = seq.heads;
    const int padded = seq.padded;
    const std::vector<uint16_t> q = seq.Query(layer, position, head_offset);

    std::vector<uint16_t> q_out(static_cast<size_t>(padded) * kHeadDim, 0xffff);
    PrologueParams prologue;
    prologue.num_tokens = 1;
    prologue.num_heads = heads;
    prologue.padded_heads = padded;
    prologue.q = q.data();
    prologue.positions = &position;
    prologue.q_out = q_out.data();
    prologue.rms_norm_eps = seq.profile->rms_norm_eps;
    prologue.rope = View(table);
    const absl::Status prologue_status = backend_.Prologue(prologue);
    EXPECT_TRUE(prologue_status.ok()) << prologue_status;
    absl::StatusOr<reference::QueryReference> q_ref = reference::ReferenceQuery(
        q, absl::MakeConstSpan(&position, 1), heads, padded, seq.profile->rms_norm_eps, table);
    EXPECT_TRUE(q_ref.ok()) << q_ref.status();
    // The server's q_out is its own prologue's (a CUDA server's may differ
    // from the mirror's by one ulp at a rounding tie): the reference decode
    // carries spec section 7's composition clause.
    std::vector<double> q_slack;
    if (q_ref.ok()) {
      const ComparisonReport report = reference::CompareQueryOut(q_out, *q_ref);
      EXPECT_TRUE(report.ok()) << "mirror prologue: " << report.ToString();
      q_slack = reference::TieQuerySlack(*q_ref);
    }

    // Spec section 1: SWA rows of positions max(0, p-127)..p, ascending.
    std::vector<int32_t> main_indices(kSwaWindow, -1);
    const int32_t first = std::max(0, position - kSwaWindow + 1);
    for (int32_t w = first; w <= position; ++w)
      main_indices[w - first] = Slot(seq, layer, false, w);
    const int32_t main_length = position - first + 1;
    // C4A: the top-k in its order, -1 kept; C128A: rows j < (p+1)/128.
    std::vector<int32_t> extra_indices;
    if (seq.ratio(layer) == 4) {
      for (int32_t row : topk) extra_indices.push_back(row < 0 ? -1 : Slot(seq, layer, true, row));
    } else if (seq.ratio(layer) == 128) {
      for (int32_t j = 0; j < (position + 1) / 128; ++j) {
        extra_indices.push_back(Slot(seq, layer, true, j));
      }
    }
    const int32_t extra_length = static_cast<int32_t>(extra_indices.size());
    std::vector<float> sinks;
    if (!seq.sinks.empty()) {
      for (int h = 0; h < heads; ++h) sinks.push_back(seq.Sink(layer, head_offset, h));
    }

    TokenAnswer answer;
    answer.lse.assign(heads, std::numeric_limits<float>::quiet_NaN());
    const CachePoolView pool{pool_.data(), kBlocks};
    DecodeParams decode;
    decode.num_tokens = 1;
    decode.num_heads = heads;
    decode.padded_heads = padded;
    decode.q = q_out.data();
    decode.softmax_scale = seq.profile->softmax_scale;
    decode.sinks = sinks.empty() ? nullptr : sinks.data();
    decode.main = {kSwaWindow, main_indices.data(), &main_length, pool};
    decode.extra = {extra_length, extra_length > 0 ? extra_indices.data() : nullptr,
                    extra_length > 0 ? &extra_length : nullptr, pool};
    decode.derotate = derotate;
    decode.positions = &position;
    decode.rope = View(table);
    if (fp8) {
      answer.e4m3.assign(static_cast<size_t>(heads) * kFp8RowBytes, 0x7f);
      answer.scales.assign(static_cast<size_t>(heads) * kFp8ScaleRowBytes, 0xff);
      decode.out_e4m3 = answer.e4m3.data();
      decode.out_scales = answer.scales.data();
    } else {
      answer.out.assign(static_cast<size_t>(heads) * kHeadDim, 0xffff);
      decode.out = answer.out.data();
    }
    decode.lse = answer.lse.data();
    const absl::Status decode_status = backend_.Decode(decode);
    EXPECT_TRUE(decode_status.ok()) << decode_status;

    reference::DecodeInputs inputs;
    inputs.num_tokens = 1;
    inputs.num_heads = heads;
    inputs.padded_heads = padded;
    inputs.q = q_out;
    inputs.softmax_scale = 1.0 / std::sqrt(512.0);
    inputs.sinks = sinks;
    inputs.main = {kSwaWindow, main_indices, absl::MakeConstSpan(&main_length, 1), pool_};
    inputs.extra = {extra_length, extra_indices, absl::MakeConstSpan(&extra_length, 1), pool_};
    inputs.derotate = derotate;
    inputs.positions = absl::MakeConstSpan(&position, 1);
    inputs.rope = &table;
    inputs.q_slack = q_slack;
    absl::StatusOr<reference::DecodeReference> ref = reference::ReferenceDecode(inputs);
    EXPECT_TRUE(ref.ok()) << ref.status();
    if (ref.ok()) answer.ref = *std::move(ref);
    return answer;
  }

 private:
  static constexpr int64_t kBlocks = 128;

  const RopeTable& Table(const Seq& seq, int layer) const {
    return seq.profile->rope_kind(layer) == RopeKind::kYarn ? yarn_ : plain_;
  }
  static RopeTableView View(const RopeTable& table) {
    return {table.data(), table.num_positions()};
  }

  // The mirror's slot of a row, inserted through the CpuBackend prologue on
  // first use and checked against the reference's bytes.
  int32_t Slot(const Seq& seq, int layer, bool compressed, int32_t index) {
    const auto key = std::make_tuple(seq.salt, layer, compressed, index);
    auto it = slots_.find(key);
    if (it != slots_.end()) return it->second;
    const int32_t slot = static_cast<int32_t>(slots_.size());
    EXPECT_LT(slot, kBlocks * kBlockTokens) << "the mirror's pool is full";
    const std::vector<uint16_t> row =
        compressed ? seq.CompressedRow(layer, index) : seq.SwaRow(layer, index);
    const int32_t position = compressed ? index * seq.ratio(layer) : index;
    const RopeTable& table = Table(seq, layer);
    PrologueParams insert;
    insert.num_heads = 8;
    insert.padded_heads = 8;
    insert.rope = View(table);
    insert.swa = {1, row.data(), &position, &slot, {pool_.data(), kBlocks}};
    const absl::Status status = backend_.Prologue(insert);
    EXPECT_TRUE(status.ok()) << status;
    absl::StatusOr<reference::KvRowReference> expected =
        reference::ReferenceKvRow(row, position, table);
    EXPECT_TRUE(expected.ok()) << expected.status();
    if (expected.ok()) {
      ComparisonReport report("mirror cache row");
      reference::CompareCacheRow(pool_, slot, *expected, absl::StrCat("slot ", slot), report);
      EXPECT_TRUE(report.ok()) << report.ToString();
    }
    slots_.emplace(key, slot);
    return slot;
  }

  std::mutex mutex_;
  CpuBackend backend_;
  std::vector<uint8_t> pool_;
  const RopeTable plain_;
  const RopeTable yarn_;
  std::map<std::tuple<uint64_t, int, bool, int32_t>, int32_t> slots_;
};

// ---- Attend messages and their expected answers.

struct SegmentSpec {
  Seq* seq = nullptr;
  int32_t position = 0;
  int32_t num_tokens = 1;
};

struct StepSpec {
  uint64_t request_id = 0;
  int layer = 0;
  int head_offset = 0;
  std::vector<SegmentSpec> segments;
  bool lse = false;
  bool derotate = false;
  // false: a tensor-parallel rank that leaves the rows to another (no kv, no
  // compressed rows).
  bool send_kv = true;
  int topk_width = 40;  // C4A layers
  bool fp8 = false;     // the FP8 output
};

struct Step {
  StepSpec spec;
  pb::AttendRequest request;
  std::vector<TokenAnswer> answers;  // per token, in message order
  int heads = 0;
};

Step BuildStep(Mirror& mirror, const StepSpec& spec) {
  Step step;
  step.spec = spec;
  pb::AttendRequest& request = step.request;
  request.set_request_id(spec.request_id);
  request.set_layer(spec.layer);
  request.set_head_offset(spec.head_offset);
  request.set_return_lse(spec.lse);
  request.set_derotate_output(spec.derotate);
  request.set_fp8_output(spec.fp8);
  std::vector<uint16_t> q, kv, compressed;
  std::vector<int32_t> topk;
  int64_t tokens = 0;
  int64_t compressed_rows = 0;
  bool c4a = false;
  for (const SegmentSpec& segment : spec.segments) {
    const Seq& seq = *segment.seq;
    step.heads = seq.heads;
    const int ratio = seq.ratio(spec.layer);
    c4a = ratio == 4;
    pb::Segment* wire = request.add_segments();
    wire->set_session_id(seq.id);
    wire->set_position(segment.position);
    wire->set_num_tokens(segment.num_tokens);
    const int32_t end = segment.position + segment.num_tokens;
    if (ratio != 0 && spec.send_kv) {
      wire->set_first_compressed_row(segment.position / ratio);
      wire->set_num_compressed_rows(end / ratio - segment.position / ratio);
      for (int32_t j = segment.position / ratio; j < end / ratio; ++j) {
        const std::vector<uint16_t> row = seq.CompressedRow(spec.layer, j);
        compressed.insert(compressed.end(), row.begin(), row.end());
        ++compressed_rows;
      }
    }
    for (int32_t p = segment.position; p < end; ++p, ++tokens) {
      const std::vector<uint16_t> token_q = seq.Query(spec.layer, p, spec.head_offset);
      q.insert(q.end(), token_q.begin(), token_q.end());
      const std::vector<uint16_t> row = seq.SwaRow(spec.layer, p);
      kv.insert(kv.end(), row.begin(), row.end());
      std::vector<int32_t> token_topk;
      if (c4a) token_topk = seq.TopK(spec.layer, p, spec.topk_width);
      topk.insert(topk.end(), token_topk.begin(), token_topk.end());
      step.answers.push_back(mirror.Decode(seq, spec.layer, p, spec.head_offset, token_topk,
                                           spec.derotate, spec.fp8));
    }
  }
  SetTensor(request.mutable_q(), pb::DTYPE_BF16, {tokens, step.heads, kHeadDim}, Bytes(q));
  if (spec.send_kv) SetTensor(request.mutable_kv(), pb::DTYPE_BF16, {tokens, kHeadDim}, Bytes(kv));
  if (compressed_rows > 0) {
    SetTensor(request.mutable_compressed_kv(), pb::DTYPE_BF16, {compressed_rows, kHeadDim},
              Bytes(compressed));
  }
  if (c4a && spec.topk_width > 0) {
    SetTensor(request.mutable_topk(), pb::DTYPE_I32, {tokens, spec.topk_width}, Bytes(topk));
  }
  return step;
}

// What the server changed, in the test's model, once `step` succeeded.
void Applied(const Step& step) {
  for (const SegmentSpec& segment : step.spec.segments) {
    int32_t& next = segment.seq->next[step.spec.layer];
    next = std::max(next, segment.position + segment.num_tokens);
  }
}

// Replaces a tensor's bytes with other random bytes of the same size, so that
// a message that wrongly wrote them would show in later answers.
void Scramble(pb::Tensor* tensor, uint64_t seed) {
  std::string data = tensor->data();
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 1 < data.size(); i += 2) {
    const uint16_t value = FloatToBf16(
        static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 250.0f + 0.001f);
    std::memcpy(&data[i], &value, 2);
  }
  tensor->set_data(std::move(data));
}

// The FP8 answer of `step`: e4m3 out [T, H, 512] and UE8M0 out_scales
// [T, H, 4], with the mirror's bytes and within the FP8 tolerance of the
// float64 reference, token by token.
void ExpectFp8Out(const pb::Tensor& out, const pb::Tensor& scales, const Step& step,
                  absl::string_view what) {
  const int64_t tokens = static_cast<int64_t>(step.answers.size());
  const int heads = step.heads;
  ASSERT_EQ(out.dtype(), pb::DTYPE_E4M3FN) << what;
  ASSERT_THAT(out.shape(), ::testing::ElementsAre(tokens, heads, kHeadDim)) << what;
  ASSERT_EQ(static_cast<int64_t>(out.data().size()), tokens * heads * kFp8RowBytes) << what;
  ASSERT_EQ(scales.dtype(), pb::DTYPE_UE8M0) << what;
  ASSERT_THAT(scales.shape(), ::testing::ElementsAre(tokens, heads, kOutputQuantBlocks)) << what;
  ASSERT_EQ(static_cast<int64_t>(scales.data().size()), tokens * heads * kFp8ScaleRowBytes)
      << what;
  const auto* codes = reinterpret_cast<const uint8_t*>(out.data().data());
  const auto* bytes = reinterpret_cast<const uint8_t*>(scales.data().data());
  for (int64_t t = 0; t < tokens; ++t) {
    const std::vector<uint8_t> token_codes(codes + t * heads * kFp8RowBytes,
                                           codes + (t + 1) * heads * kFp8RowBytes);
    const std::vector<uint8_t> token_scales(bytes + t * heads * kFp8ScaleRowBytes,
                                            bytes + (t + 1) * heads * kFp8ScaleRowBytes);
    const ComparisonReport report =
        reference::CompareDecodeOutFp8(token_codes, token_scales, step.answers[t].ref);
    EXPECT_TRUE(report.ok()) << what << ", token " << t << ": " << report.ToString();
    if (ExpectMirrorBits()) {
      EXPECT_EQ(token_codes, step.answers[t].e4m3)
          << what << ", token " << t << ": e4m3 out differs from CpuBackend on the same rows";
      EXPECT_EQ(token_scales, step.answers[t].scales)
          << what << ", token " << t << ": scales differ from CpuBackend on the same rows";
    }
  }
}

// The bf16 answer of `step`: out [T, H, 512] with the mirror's bits and
// within tolerance of the float64 reference, token by token.
void ExpectBf16Out(const pb::Tensor& tensor, const Step& step, absl::string_view what) {
  const int64_t tokens = static_cast<int64_t>(step.answers.size());
  const int heads = step.heads;
  ASSERT_EQ(tensor.dtype(), pb::DTYPE_BF16) << what;
  ASSERT_THAT(tensor.shape(), ::testing::ElementsAre(tokens, heads, kHeadDim)) << what;
  ASSERT_EQ(static_cast<int64_t>(tensor.data().size()), tokens * heads * kRowBytes) << what;
  std::vector<uint16_t> out(tokens * heads * kHeadDim);
  std::memcpy(out.data(), tensor.data().data(), out.size() * 2);
  int64_t mismatches = 0;
  double max_difference = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const absl::Span<const uint16_t> token_out =
        absl::MakeConstSpan(out).subspan(t * heads * kHeadDim, heads * kHeadDim);
    for (int64_t i = 0; i < heads * kHeadDim; ++i) {
      if (token_out[i] != step.answers[t].out[i]) {
        ++mismatches;
        max_difference = std::max<double>(
            max_difference,
            std::fabs(Bf16ToFloat(token_out[i]) - Bf16ToFloat(step.answers[t].out[i])));
      }
    }
    const ComparisonReport report = reference::CompareDecodeOut(token_out, step.answers[t].ref);
    EXPECT_TRUE(report.ok()) << what << ", token " << t << ": " << report.ToString();
  }
  if (ExpectMirrorBits()) {
    EXPECT_EQ(mismatches, 0) << what << ": out differs from CpuBackend on the same rows in "
                             << mismatches << " of " << out.size()
                             << " elements; max |difference| " << max_difference;
  }
}

// `response` answers `step` with the mirror's bits and within tolerance of
// the float64 reference, in the format it asked for.
void ExpectAnswer(const pb::AttendResponse& response, const Step& step, absl::string_view what) {
  const pb::AttendRequest& request = step.request;
  EXPECT_EQ(response.request_id(), request.request_id()) << what;
  ASSERT_EQ(response.status().code(), 0) << what << ": " << response.status().message();
  const int64_t tokens = static_cast<int64_t>(step.answers.size());
  const int heads = step.heads;
  if (request.fp8_output()) {
    ExpectFp8Out(response.out(), response.out_scales(), step, what);
  } else {
    EXPECT_FALSE(response.has_out_scales()) << what << ": scales of a bf16 answer";
    ExpectBf16Out(response.out(), step, what);
  }
  if (!request.return_lse()) {
    EXPECT_FALSE(response.has_lse()) << what << ": lse was not asked for";
  } else {
    ASSERT_TRUE(response.has_lse()) << what;
    ASSERT_EQ(response.lse().dtype(), pb::DTYPE_F32) << what;
    ASSERT_THAT(response.lse().shape(), ::testing::ElementsAre(tokens, heads)) << what;
    ASSERT_EQ(static_cast<int64_t>(response.lse().data().size()), tokens * heads * 4) << what;
    std::vector<float> lse(tokens * heads);
    std::memcpy(lse.data(), response.lse().data().data(), lse.size() * 4);
    for (int64_t t = 0; t < tokens; ++t) {
      const absl::Span<const float> token_lse = absl::MakeConstSpan(lse).subspan(t * heads, heads);
      if (ExpectMirrorBits()) {
        EXPECT_EQ(std::memcmp(token_lse.data(), step.answers[t].lse.data(), heads * 4), 0)
            << what << ", token " << t << ": lse differs from CpuBackend's";
      }
      const ComparisonReport report = reference::CompareLse(token_lse, step.answers[t].ref);
      EXPECT_TRUE(report.ok()) << what << ", token " << t << ": " << report.ToString();
    }
  }
  EXPECT_GE(response.timing().batch_tokens(), tokens) << what;
  EXPECT_GT(response.timing().total_us(), 0) << what;
  EXPECT_GT(response.timing().serialize_us(), 0) << what;
}

// `response` is the error `code`, its message naming `field`, for the
// message of `request_id` (nullopt: not checked).
void ExpectError(const pb::AttendResponse& response, std::optional<uint64_t> request_id,
                 grpc::StatusCode code, absl::string_view field, absl::string_view what) {
  if (request_id.has_value()) {
    EXPECT_EQ(response.request_id(), *request_id) << what;
  }
  EXPECT_EQ(response.status().code(), static_cast<int>(code))
      << what << ": " << response.status().message();
  EXPECT_THAT(response.status().message(), HasSubstr(std::string(field))) << what;
  EXPECT_FALSE(response.has_out()) << what;
  EXPECT_FALSE(response.has_out_scales()) << what;
  EXPECT_FALSE(response.has_lse()) << what;
}

void ExpectStatus(const grpc::Status& status, grpc::StatusCode code, absl::string_view field,
                  absl::string_view what) {
  EXPECT_EQ(status.error_code(), code) << what << ": " << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(std::string(field))) << what;
}

// ---- Calls.

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
}

template <typename Request, typename Response>
grpc::Status Call(pb::MlaOffload::Stub& stub,
                  grpc::Status (pb::MlaOffload::Stub::*method)(grpc::ClientContext*, const Request&,
                                                               Response*),
                  const Request& request, Response* response) {
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(60));
  return (stub.*method)(&context, request, response);
}

// One Attend stream of the typed stub.
class AttendStream {
 public:
  explicit AttendStream(pb::MlaOffload::Stub& stub) {
    SetDeadline(context_, absl::Seconds(120));
    stream_ = stub.Attend(&context_);
  }
  ~AttendStream() {
    if (!finished_) {
      context_.TryCancel();
      stream_->Finish();
    }
  }

  bool Write(const pb::AttendRequest& request) { return stream_->Write(request); }
  bool Read(pb::AttendResponse* response) { return stream_->Read(response); }

  pb::AttendResponse RoundTrip(const pb::AttendRequest& request) {
    pb::AttendResponse response;
    EXPECT_TRUE(Write(request)) << "the stream broke";
    EXPECT_TRUE(Read(&response)) << "the stream ended without an answer";
    return response;
  }

  // Ends the stream: no answer may be left; the call's status.
  grpc::Status Close() {
    stream_->WritesDone();
    pb::AttendResponse extra;
    while (stream_->Read(&extra)) ADD_FAILURE() << "an answer nobody asked for";
    finished_ = true;
    return stream_->Finish();
  }
  grpc::Status Finish() {
    finished_ = true;
    return stream_->Finish();
  }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::AttendRequest, pb::AttendResponse>> stream_;
  bool finished_ = false;
};

// ---- The fixture.

class ServerE2eTest : public ::testing::Test {
 protected:
  void StartServer(const std::vector<std::string>& flags = {}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> started = StartServerProcess(flags);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    channel_ = NewChannel(*server_);
    stub_ = pb::MlaOffload::NewStub(channel_);
  }

  void TearDown() override {
    stub_.reset();
    channel_.reset();
    if (server_ != nullptr && !server_->WaitExit(absl::ZeroDuration()).has_value()) {
      EXPECT_TRUE(server_->Stop()) << "the server did not stop within 8 s of SIGTERM; killed it";
    }
    server_.reset();
  }

  // A session of `model` with H heads and, unless `with_sinks` is false,
  // sinks [layers, h_total].
  void Create(Seq* seq, const std::string& model, int heads, uint64_t salt, bool with_sinks = true,
              int idle_ttl_seconds = 0) {
    absl::StatusOr<const ModelProfile*> profile = FindModelProfile(model);
    ASSERT_TRUE(profile.ok()) << profile.status();
    seq->profile = *profile;
    seq->heads = heads;
    seq->salt = salt;
    seq->next.assign(seq->layers(), 0);
    pb::CreateSessionRequest request;
    request.set_model(model);
    request.set_num_heads(heads);
    request.set_idle_ttl_seconds(idle_ttl_seconds);
    if (with_sinks) {
      seq->sinks = RandomSinks(**profile, Mix(salt, 99));
      SetTensor(request.mutable_sinks(), pb::DTYPE_F32,
                {seq->layers(), (*profile)->num_query_heads}, Bytes(seq->sinks));
    }
    pb::CreateSessionResponse response;
    const grpc::Status status =
        Call(*stub_, &pb::MlaOffload::Stub::CreateSession, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(response.session_id(), ::testing::MatchesRegex("[0-9a-f]{32}"));
    EXPECT_EQ(response.num_heads(), heads);
    seq->id = response.session_id();
    seq->padded = response.padded_heads();
  }

  // The AppendKV request of positions [first, first + count) of every layer.
  static pb::AppendKVRequest PromptRequest(const Seq& seq, int32_t first, int32_t count) {
    pb::AppendKVRequest request;
    request.set_session_id(seq.id);
    request.set_first_position(first);
    request.set_num_positions(count);
    for (int layer = 0; layer < seq.layers(); ++layer) {
      pb::LayerRows* rows = request.add_layers();
      rows->set_layer(layer);
      std::vector<uint16_t> swa;
      for (int32_t p = first; p < first + count; ++p) {
        const std::vector<uint16_t> row = seq.SwaRow(layer, p);
        swa.insert(swa.end(), row.begin(), row.end());
      }
      SetTensor(rows->mutable_swa_kv(), pb::DTYPE_BF16, {count, kHeadDim}, Bytes(swa));
      const int ratio = seq.ratio(layer);
      if (ratio == 0) continue;
      rows->set_first_compressed_row(first / ratio);
      const int32_t new_rows = (first + count) / ratio - first / ratio;
      if (new_rows == 0) continue;
      std::vector<uint16_t> compressed;
      for (int32_t j = first / ratio; j < (first + count) / ratio; ++j) {
        const std::vector<uint16_t> row = seq.CompressedRow(layer, j);
        compressed.insert(compressed.end(), row.begin(), row.end());
      }
      SetTensor(rows->mutable_compressed_kv(), pb::DTYPE_BF16, {new_rows, kHeadDim},
                Bytes(compressed));
    }
    return request;
  }

  // Appends positions [next, next + count) of every layer and checks the answer.
  void Append(Seq* seq, int32_t count) {
    const int32_t first = seq->NextPosition();
    pb::AppendKVResponse response;
    const grpc::Status status =
        Call(*stub_, &pb::MlaOffload::Stub::AppendKV, PromptRequest(*seq, first, count), &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    for (int32_t& next : seq->next) next = first + count;
    EXPECT_EQ(response.next_position(), first + count);
    EXPECT_EQ(response.kv_blocks_used(), seq->Blocks());
  }

  pb::ServerInfo Info() {
    pb::ServerInfo info;
    const grpc::Status status =
        Call(*stub_, &pb::MlaOffload::Stub::GetServerInfo, pb::GetServerInfoRequest(), &info);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return info;
  }

  std::map<std::string, pb::SessionInfo> Sessions() {
    pb::ListSessionsResponse response;
    const grpc::Status status =
        Call(*stub_, &pb::MlaOffload::Stub::ListSessions, pb::ListSessionsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::map<std::string, pb::SessionInfo> sessions;
    for (const pb::SessionInfo& info : response.sessions()) sessions[info.session_id()] = info;
    return sessions;
  }

  // ListSessions shows `seq` as the test's model has it.
  void ExpectListed(const Seq& seq, absl::string_view what) {
    const std::map<std::string, pb::SessionInfo> sessions = Sessions();
    auto it = sessions.find(seq.id);
    ASSERT_NE(it, sessions.end()) << what << ": session " << seq.id << " is not listed";
    EXPECT_EQ(it->second.model(), seq.profile->name) << what;
    EXPECT_EQ(it->second.num_heads(), seq.heads) << what;
    EXPECT_EQ(it->second.next_position(), seq.NextPosition()) << what;
    EXPECT_EQ(it->second.kv_blocks(), seq.Blocks()) << what;
  }

  Metrics ScrapeMetrics() {
    absl::StatusOr<std::string> body = HttpGet(server_->metrics_port(), "/metrics");
    EXPECT_TRUE(body.ok()) << body.status();
    return Metrics(body.ok() ? *body : "");
  }

  // Asks about `service`: "" is the whole server (liveness), kReadiness the
  // service's own name (readiness).
  grpc::Status HealthCheck(HealthCheckResponse* response, const std::string& service = "") {
    std::unique_ptr<Health::Stub> health = Health::NewStub(channel_);
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(5));
    HealthCheckRequest request;
    request.set_service(service);
    return health->Check(&context, request, response);
  }

  // Two streams stepping two sessions at once (section 2).
  void StepTwoStreams(const std::vector<std::string>& flags, bool all_in_flight);

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::MlaOffload::Stub> stub_;
  Mirror mirror_;
};

// ---- 1. End to end, per model.

struct ModelCase {
  const char* model;
  int heads;                // one rank's heads
  int head_offset;          // the first of the range that ends at the model's last head
  std::vector<int> layers;  // at least one of each kind, the MTP layer included
};

void PrintTo(const ModelCase& param, std::ostream* os) {
  *os << param.model << " H=" << param.heads;
}

class EndToEndTest : public ServerE2eTest, public ::testing::WithParamInterface<ModelCase> {};

// Server info, a session with sinks, a prompt, then decode steps over every
// layer kind with compressed rows arriving as the model emits them, a
// 2-token segment, top-k at the model's full width, lse, de-rotation and
// the FP8 output (a third of the steps, with and without de-rotation).
TEST_P(EndToEndTest, DecodeStepsMatchCpuBackendAndReference) {
  const ModelCase& param = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const ModelProfile& profile = **FindModelProfile(param.model);

  const pb::ServerInfo info = Info();
  EXPECT_THAT(info.version(), HasSubstr("mla_offload.v1"));
  if (ServerBackend() == "cpu") {
    EXPECT_EQ(info.backend(), "cpu (2 threads)");
  } else {
    EXPECT_THAT(info.backend(), HasSubstr(ServerBackend()));
  }
  ASSERT_EQ(info.models_size(), 2);
  const pb::ModelInfo* model = nullptr;
  for (const pb::ModelInfo& candidate : info.models()) {
    if (candidate.name() == param.model) model = &candidate;
  }
  ASSERT_NE(model, nullptr) << param.model << " is not in ServerInfo.models";
  EXPECT_EQ(model->num_layers(), profile.num_layers);
  EXPECT_EQ(model->num_attention_layers(), profile.num_layers + 1);
  EXPECT_EQ(model->num_query_heads(), profile.num_query_heads);
  EXPECT_EQ(model->head_dim(), 512);
  EXPECT_EQ(model->swa_window(), 128);
  EXPECT_EQ(model->indexer_topk(), profile.indexer_topk);
  EXPECT_THAT(model->compress_ratios(), ::testing::ElementsAreArray(profile.compress_ratios));
  EXPECT_FLOAT_EQ(model->softmax_scale(), 0.04419417382415922f);
  EXPECT_THAT(info.supported_head_counts(),
              ::testing::ElementsAre(8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128));
  EXPECT_FALSE(info.head_padding().empty());
  EXPECT_EQ(info.kv_blocks_total(), static_cast<int64_t>(0.05e9 / kBlockBytes));
  EXPECT_EQ(info.kv_blocks_used(), 0);
  EXPECT_EQ(info.kv_block_tokens(), 64);
  EXPECT_EQ(info.kv_bytes_per_token(), 584);
  EXPECT_EQ(info.max_tokens_per_message(), 1024);
  EXPECT_EQ(info.max_message_bytes(), int64_t{256} << 20);
  EXPECT_EQ(info.max_position(), kMaxPosition);
  EXPECT_EQ(info.sessions(), 0);

  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, param.model, param.heads, 1));
  EXPECT_EQ(seq.padded, param.heads);
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks());
  EXPECT_EQ(Info().sessions(), 1);
  // 254 positions: C4A layers hold rows 0..62, C128A layers row 0; the
  // steps below add C4A row 63 (p = 255) and 64 (a new page, p = 259) and
  // C128A row 1 (p = 255); the SWA ring of 256 rows wraps at p = 256.
  constexpr int32_t kPrompt = 254;
  ASSERT_NO_FATAL_FAILURE(Append(&seq, kPrompt));
  ExpectListed(seq, "after the prompt");
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks());

  AttendStream stream(*stub_);
  uint64_t request_id = 100;
  auto run = [&](int32_t position, int32_t num_tokens) {
    for (int layer : param.layers) {
      StepSpec spec;
      spec.request_id = request_id++;
      spec.layer = layer;
      spec.head_offset = param.head_offset;
      spec.segments = {{&seq, position, num_tokens}};
      spec.lse = position % 2 == 1;
      spec.derotate = (position + layer) % 2 == 0;
      spec.fp8 = (position + layer) % 3 == 0;
      spec.topk_width = position == kPrompt ? profile.indexer_topk : 40;
      const Step step = BuildStep(mirror_, spec);
      ExpectAnswer(stream.RoundTrip(step.request), step,
                   absl::StrCat(param.model, " layer ", layer, " position ", position));
      Applied(step);
    }
  };
  for (int32_t p = kPrompt; p < kPrompt + 4; ++p) run(p, 1);
  run(kPrompt + 4, 2);  // positions 258 and 259 in one segment
  run(kPrompt + 6, 1);
  EXPECT_TRUE(stream.Close().ok());

  // Layers that were not stepped still expect position 254: the session's
  // next position is the lowest over its layers.
  ExpectListed(seq, "after the decode steps");
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks());
}

INSTANTIATE_TEST_SUITE_P(Models, EndToEndTest,
                         ::testing::Values(
                             // Flash: 0 SWA, 2 C4A, 3 C128A, 43 the MTP layer (SWA).
                             ModelCase{kFlash, 8, 56, {0, 2, 3, 43}},
                             // Pro: 0 C128A, 2 C4A, 60 the last C4A, 61 the MTP layer (SWA).
                             ModelCase{kPro, 16, 112, {0, 2, 60, 61}},
                             // Multiples of 8 that are not powers of two (spec section 6):
                             // served as they are, not padded.
                             ModelCase{kFlash, 24, 40, {0, 2, 3, 43}},
                             ModelCase{kPro, 48, 80, {0, 2, 60, 61}}),
                         [](const ::testing::TestParamInfo<ModelCase>& info) {
                           return absl::StrCat(
                               info.param.model == std::string(kFlash) ? "Flash" : "Pro",
                               info.param.heads);
                         });

// ---- 2. Concurrency and tensor-parallel ranks.

// Two streams, each stepping its own session from its own thread at the
// same time (the scheduler may batch them into one launch), each get their
// own session's answers: one message at a time, or (`all_in_flight`) every
// message written before the first answer is read, so that batches of a
// stream follow each other through the engine while the one before still
// runs, the next position of a layer among them. Half the messages ask for
// the FP8 output, so batches mix both formats; the bf16 answers keep the
// mirror's bits.
void ServerE2eTest::StepTwoStreams(const std::vector<std::string>& flags, bool all_in_flight) {
  ASSERT_NO_FATAL_FAILURE(StartServer(flags));
  Seq a, b;
  ASSERT_NO_FATAL_FAILURE(Create(&a, kFlash, 8, 11));
  ASSERT_NO_FATAL_FAILURE(Create(&b, kFlash, 8, 12));
  ASSERT_NO_FATAL_FAILURE(Append(&a, 130));
  ASSERT_NO_FATAL_FAILURE(Append(&b, 300));  // more than the 256-row SWA ring

  std::vector<Step> steps[2];
  Seq* seqs[2] = {&a, &b};
  for (int s = 0; s < 2; ++s) {
    for (int32_t p = seqs[s]->NextPosition(); p < seqs[s]->NextPosition() + 8; ++p) {
      for (int layer : {0, 2, 3}) {
        StepSpec spec;
        spec.request_id = s * 1000 + p * 10 + layer;
        spec.layer = layer;
        spec.head_offset = 8 * s;
        spec.segments = {{seqs[s], p}};
        spec.lse = true;
        spec.fp8 = (s + p + layer) % 2 == 0;
        steps[s].push_back(BuildStep(mirror_, spec));
      }
    }
  }
  std::vector<pb::AttendResponse> responses[2];
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      AttendStream stream(*stub_);
      if (all_in_flight) {
        for (const Step& step : steps[s]) EXPECT_TRUE(stream.Write(step.request));
        for (size_t i = 0; i < steps[s].size(); ++i) {
          pb::AttendResponse response;
          EXPECT_TRUE(stream.Read(&response)) << "stream " << s << ": no answer " << i;
          responses[s].push_back(std::move(response));
        }
      } else {
        for (const Step& step : steps[s]) responses[s].push_back(stream.RoundTrip(step.request));
      }
      EXPECT_TRUE(stream.Close().ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(responses[s].size(), steps[s].size());
    for (size_t i = 0; i < steps[s].size(); ++i) {
      ExpectAnswer(
          responses[s][i], steps[s][i],
          absl::StrCat("stream ", s, " message ", i, " (layer ", steps[s][i].spec.layer, ")"));
      Applied(steps[s][i]);
    }
  }
  ExpectListed(a, "session a");
  ExpectListed(b, "session b");
  EXPECT_EQ(Info().kv_blocks_used(), a.Blocks() + b.Blocks());
}

TEST_F(ServerE2eTest, ConcurrentStreamsGetTheirOwnSessionsAnswers) {
  StepTwoStreams({"--batch_wait_us=2000"}, false);
}

// The same with batches pipelined on the CPU backend (--batches_in_flight=1,
// the CUDA backend's default) and every message of a stream in flight.
TEST_F(ServerE2eTest, PipelinedBatchesAnswerEveryMessageInOrder) {
  StepTwoStreams({"--batches_in_flight=1", "--max_messages_in_flight=32"}, true);
}

// Two ranks with different head ranges attend one session on two streams:
// each gets its own heads (its q, its sinks); the KV is written once, by
// whichever rank comes first, and a later rank's rows are not written again.
TEST_F(ServerE2eTest, TensorParallelRanksShareOneSessionsKv) {
  // Messages written together wait for each other and run as one batch.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--batch_wait_us=20000"}));
  Seq seq;  // Flash TP16: 4 heads a rank, run at 8
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 4, 21));
  EXPECT_EQ(seq.padded, 8);
  ASSERT_NO_FATAL_FAILURE(Append(&seq, 126));
  const int64_t blocks_before = Info().kv_blocks_used();
  EXPECT_EQ(blocks_before, seq.Blocks());

  AttendStream rank0(*stub_), rank1(*stub_);
  AttendStream* streams[2] = {&rank0, &rank1};
  const int offsets[2] = {0, 60};
  enum Order { kAFirst, kBFirst, kTogether, kBGarbage };
  // p = 127 brings C4A row 31 and C128A row 0, p = 131 C4A row 32.
  const std::vector<std::pair<int32_t, Order>> schedule = {
      {126, kAFirst},   {127, kTogether}, {128, kBFirst}, {129, kAFirst},
      {130, kTogether}, {131, kBGarbage}, {132, kAFirst}};
  uint64_t request_id = 1;
  for (const auto& [position, order] : schedule) {
    for (int layer : {0, 2, 3}) {
      Step steps[2];
      for (int rank = 0; rank < 2; ++rank) {
        StepSpec spec;
        spec.request_id = request_id++;
        spec.layer = layer;
        spec.head_offset = offsets[rank];
        spec.segments = {{&seq, position}};
        spec.lse = rank == 1;
        // Ranks of one model ask for the same output form (for ranks that
        // differ, see RanksThatDifferInDerotateShareOneBatch).
        spec.derotate = position % 2 == 0;
        const bool second = (order == kAFirst || order == kBGarbage) ? rank == 1
                            : order == kBFirst                       ? rank == 0
                                                                     : false;
        spec.send_kv = !second || order == kBGarbage;
        steps[rank] = BuildStep(mirror_, spec);
        if (order == kBGarbage && rank == 1) {
          // Rows that differ from the first rank's: they must not be written.
          Scramble(steps[rank].request.mutable_kv(), request_id);
          if (steps[rank].request.has_compressed_kv()) {
            Scramble(steps[rank].request.mutable_compressed_kv(), request_id + 1);
          }
        }
      }
      const std::string what = absl::StrCat("position ", position, " layer ", layer);
      pb::AttendResponse responses[2];
      if (order == kTogether) {
        ASSERT_TRUE(streams[0]->Write(steps[0].request));
        ASSERT_TRUE(streams[1]->Write(steps[1].request));
        ASSERT_TRUE(streams[0]->Read(&responses[0]));
        ASSERT_TRUE(streams[1]->Read(&responses[1]));
      } else {
        const int first = order == kBFirst ? 1 : 0;
        responses[first] = streams[first]->RoundTrip(steps[first].request);
        responses[1 - first] = streams[1 - first]->RoundTrip(steps[1 - first].request);
      }
      ExpectAnswer(responses[0], steps[0], absl::StrCat(what, ", rank 0"));
      ExpectAnswer(responses[1], steps[1], absl::StrCat(what, ", rank 1 (heads 60..63)"));
      Applied(steps[0]);
    }
  }
  EXPECT_TRUE(rank0.Close().ok());
  EXPECT_TRUE(rank1.Close().ok());
  ExpectListed(seq, "after both ranks' steps");
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks()) << "the KV of one session is stored once";
}

// Two ranks of one session whose messages land in one batch, the first
// (which writes the rows) asking for de-rotated output and the second not,
// so that they run in different launches: the second must still see the
// rows of its own step. (Server 3174da9 launched the second first and read
// the step's SWA row before it was written.)
TEST_F(ServerE2eTest, RanksThatDifferInDerotateShareOneBatch) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--batch_wait_us=20000"}));
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 4, 22));
  ASSERT_NO_FATAL_FAILURE(Append(&seq, 127));
  AttendStream stream(*stub_);  // one stream keeps the two messages in order
  uint64_t request_id = 1;
  for (int layer : {0, 2, 3}) {  // p = 127 brings C4A row 31 and C128A row 0
    Step steps[2];
    for (int rank = 0; rank < 2; ++rank) {
      StepSpec spec;
      spec.request_id = request_id++;
      spec.layer = layer;
      spec.head_offset = 60 * rank;
      spec.segments = {{&seq, 127}};
      spec.derotate = rank == 0;
      spec.send_kv = rank == 0;
      steps[rank] = BuildStep(mirror_, spec);
    }
    ASSERT_TRUE(stream.Write(steps[0].request));
    ASSERT_TRUE(stream.Write(steps[1].request));
    for (int rank = 0; rank < 2; ++rank) {
      pb::AttendResponse response;
      ASSERT_TRUE(stream.Read(&response));
      ExpectAnswer(response, steps[rank],
                   absl::StrCat("layer ", layer, ", rank ", rank,
                                rank == 0 ? " (writes the rows, de-rotated)" : " (plain output)"));
    }
    Applied(steps[0]);
  }
  EXPECT_TRUE(stream.Close().ok());
}

// ---- 3. Bad inputs.

// Each bad Attend message is answered with its code and a message naming the
// field, on a stream that stays open; afterwards the session is as it was:
// ListSessions and the block count are unchanged and the correct step gives
// the answer it would have given without the failures.
TEST_F(ServerE2eTest, BadAttendMessagesFailAloneAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq seq, pro;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 31));
  ASSERT_NO_FATAL_FAILURE(Create(&pro, kPro, 8, 32));
  constexpr int32_t kP = 131;  // the step at 131 brings C4A row 32
  ASSERT_NO_FATAL_FAILURE(Append(&seq, kP));
  const int64_t blocks = Info().kv_blocks_used();

  auto good = [&](int layer, uint64_t request_id) {
    StepSpec spec;
    spec.request_id = request_id;
    spec.layer = layer;
    spec.head_offset = 8;
    spec.segments = {{&seq, kP}};
    spec.lse = true;
    return BuildStep(mirror_, spec);
  };
  const Step c4a = good(2, 1);
  const Step swa = good(0, 2);
  const uint64_t kBadId = 777;

  struct Bad {
    std::string what;
    pb::AttendRequest request;
    grpc::StatusCode code;
    std::string field;
  };
  // The parser's refusals are checked for their request id by
  // MessagesRefusedByTheParserEchoTheirRequestId.
  const std::string kParser = "(refused by the parser)";
  std::vector<Bad> bad;
  auto add = [&](std::string what, const Step& base, grpc::StatusCode code, std::string field,
                 const std::function<void(pb::AttendRequest&)>& change) {
    pb::AttendRequest request = base.request;
    request.set_request_id(kBadId + bad.size());
    // Rows other than the session's: anything a failed message wrote would
    // show in the answers that follow.
    if (request.has_kv()) Scramble(request.mutable_kv(), bad.size() + 1);
    if (request.has_compressed_kv()) Scramble(request.mutable_compressed_kv(), bad.size() + 2);
    change(request);
    bad.push_back({std::move(what), std::move(request), code, std::move(field)});
  };
  using grpc::StatusCode;
  add("unknown session", c4a, StatusCode::NOT_FOUND, "segments[0]", [](pb::AttendRequest& r) {
    r.mutable_segments(0)->set_session_id("00000000000000000000000000000000");
  });
  add("q for 16 heads on an 8-head session", c4a, StatusCode::INVALID_ARGUMENT, "q",
      [](pb::AttendRequest& r) {
        SetTensor(r.mutable_q(), pb::DTYPE_BF16, {1, 16, kHeadDim},
                  std::string(16 * kRowBytes, '\x3f'));
      });
  add("heads 60..67 of a 64-head model", c4a, StatusCode::INVALID_ARGUMENT, "head_offset",
      [](pb::AttendRequest& r) { r.set_head_offset(60); });
  add("negative head offset", c4a, StatusCode::INVALID_ARGUMENT, "head_offset",
      [](pb::AttendRequest& r) { r.set_head_offset(-8); });
  add("layer 44 of 44", c4a, StatusCode::INVALID_ARGUMENT, "layer",
      [](pb::AttendRequest& r) { r.set_layer(44); });
  add("layer -1", c4a, StatusCode::INVALID_ARGUMENT, "layer",
      [](pb::AttendRequest& r) { r.set_layer(-1); });
  add("q as f32", c4a, StatusCode::INVALID_ARGUMENT, "q", [](pb::AttendRequest& r) {
    SetTensor(r.mutable_q(), pb::DTYPE_F32, {1, 8, kHeadDim}, std::string(8 * kHeadDim * 4, 0));
  });
  add("q of 256 dims", c4a, StatusCode::INVALID_ARGUMENT, "q", [](pb::AttendRequest& r) {
    SetTensor(r.mutable_q(), pb::DTYPE_BF16, {1, 8, 256}, std::string(8 * 256 * 2, '\x3f'));
  });
  add("q data shorter than its shape", c4a, StatusCode::INVALID_ARGUMENT, "q",
      [](pb::AttendRequest& r) { r.mutable_q()->mutable_data()->resize(8 * kRowBytes - 2); });
  add("q without dtype", c4a, StatusCode::INVALID_ARGUMENT, "q",
      [](pb::AttendRequest& r) { r.mutable_q()->set_dtype(pb::DTYPE_UNSPECIFIED); });
  add("position one ahead", c4a, StatusCode::FAILED_PRECONDITION, "position",
      [](pb::AttendRequest& r) { r.mutable_segments(0)->set_position(kP + 1); });
  add("position three back", c4a, StatusCode::FAILED_PRECONDITION, "position",
      [](pb::AttendRequest& r) { r.mutable_segments(0)->set_position(kP - 3); });
  add("position beyond --max_position", c4a, StatusCode::INVALID_ARGUMENT, "position",
      [](pb::AttendRequest& r) { r.mutable_segments(0)->set_position(kMaxPosition); });
  add("top-k row 33 of 33 rows", c4a, StatusCode::INVALID_ARGUMENT, "topk",
      [](pb::AttendRequest& r) {
        int32_t row = (kP + 1) / 4;
        std::memcpy(&(*r.mutable_topk()->mutable_data())[4 * 5], &row, 4);
      });
  add("top-k row -2", c4a, StatusCode::INVALID_ARGUMENT, "topk", [](pb::AttendRequest& r) {
    int32_t row = -2;
    std::memcpy(&(*r.mutable_topk()->mutable_data())[0], &row, 4);
  });
  add("top-k wider than the model's 512", c4a, StatusCode::INVALID_ARGUMENT, "topk",
      [](pb::AttendRequest& r) {
        SetTensor(r.mutable_topk(), pb::DTYPE_I32, {1, 513}, Bytes(std::vector<int32_t>(513, -1)));
      });
  add("top-k as f32", c4a, StatusCode::INVALID_ARGUMENT, "topk",
      [](pb::AttendRequest& r) { r.mutable_topk()->set_dtype(pb::DTYPE_F32); });
  add("top-k on an SWA-only layer", swa, StatusCode::INVALID_ARGUMENT, "topk",
      [&](pb::AttendRequest& r) { *r.mutable_topk() = c4a.request.topk(); });
  add("the due compressed row missing", c4a, StatusCode::INVALID_ARGUMENT, "num_compressed_rows",
      [](pb::AttendRequest& r) {
        r.mutable_segments(0)->set_num_compressed_rows(0);
        r.clear_compressed_kv();
      });
  add("compressed_kv of 2 rows for 1", c4a, StatusCode::INVALID_ARGUMENT, "compressed_kv",
      [](pb::AttendRequest& r) {
        SetTensor(r.mutable_compressed_kv(), pb::DTYPE_BF16, {2, kHeadDim},
                  std::string(2 * kRowBytes, '\x3f'));
      });
  add("compressed rows on an SWA-only layer", swa, StatusCode::INVALID_ARGUMENT,
      "num_compressed_rows", [&](pb::AttendRequest& r) {
        r.mutable_segments(0)->set_first_compressed_row(32);
        r.mutable_segments(0)->set_num_compressed_rows(1);
        *r.mutable_compressed_kv() = c4a.request.compressed_kv();
      });
  add("a C4A step without top-k", c4a, StatusCode::INVALID_ARGUMENT, "topk",
      [](pb::AttendRequest& r) { r.clear_topk(); });
  add("negative num_compressed_rows", c4a, StatusCode::INVALID_ARGUMENT, "num_compressed_rows",
      [](pb::AttendRequest& r) { r.mutable_segments(0)->set_num_compressed_rows(-1); });
  add("negative first_compressed_row", swa, StatusCode::INVALID_ARGUMENT, "first_compressed_row",
      [](pb::AttendRequest& r) { r.mutable_segments(0)->set_first_compressed_row(-5); });
  add("kv missing", c4a, StatusCode::INVALID_ARGUMENT, "kv",
      [](pb::AttendRequest& r) { r.clear_kv(); });
  add("kv of 256 dims", c4a, StatusCode::INVALID_ARGUMENT, "kv", [](pb::AttendRequest& r) {
    SetTensor(r.mutable_kv(), pb::DTYPE_BF16, {1, 256}, std::string(512, '\x3f'));
  });
  add("no segments", c4a, StatusCode::INVALID_ARGUMENT, "segments",
      [](pb::AttendRequest& r) { r.clear_segments(); });
  add("a segment of 0 tokens", c4a, StatusCode::INVALID_ARGUMENT, "num_tokens",
      [](pb::AttendRequest& r) { r.mutable_segments(0)->set_num_tokens(0); });
  add("one session in two segments", c4a, StatusCode::INVALID_ARGUMENT, "segments[1]",
      [](pb::AttendRequest& r) { *r.add_segments() = r.segments(0); });
  add("sessions of two models in one message", c4a, StatusCode::INVALID_ARGUMENT, "segments[1]",
      [&](pb::AttendRequest& r) {
        pb::Segment* other = r.add_segments();
        other->set_session_id(pro.id);
        other->set_position(0);
        other->set_num_tokens(1);
      });
  add("a negative shape dimension " + kParser, c4a, StatusCode::INVALID_ARGUMENT, "q.shape",
      [](pb::AttendRequest& r) { r.mutable_q()->set_shape(1, -8); });

  AttendStream stream(*stub_);
  for (const Bad& b : bad) {
    const pb::AttendResponse response = stream.RoundTrip(b.request);
    const bool parser = b.what.find(kParser) != std::string::npos;
    ExpectError(response, parser ? std::nullopt : std::optional<uint64_t>(b.request.request_id()),
                b.code, b.field, b.what);
  }
  EXPECT_EQ(Info().kv_blocks_used(), blocks);
  ExpectListed(seq, "after the bad messages");

  // The correct steps, on the same stream: the same answers as if nothing
  // had failed, and the positions advance once.
  ExpectAnswer(stream.RoundTrip(c4a.request), c4a, "C4A step after the failures");
  ExpectAnswer(stream.RoundTrip(swa.request), swa, "SWA step after the failures");
  Applied(c4a);
  Applied(swa);
  for (int layer : {0, 2}) {
    StepSpec spec;
    spec.request_id = 10 + layer;
    spec.layer = layer;
    spec.head_offset = 8;
    spec.segments = {{&seq, kP + 1}};
    const Step next = BuildStep(mirror_, spec);
    ExpectAnswer(stream.RoundTrip(next.request), next, absl::StrCat("layer ", layer, " next step"));
    Applied(next);
  }
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(seq, "after the correct steps");
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks() + pro.Blocks());
}

// A message the parser refuses (a negative shape dimension) is answered
// with its error and, like every answer, the request id it was sent with.
TEST_F(ServerE2eTest, MessagesRefusedByTheParserEchoTheirRequestId) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 35));
  ASSERT_NO_FATAL_FAILURE(Append(&seq, 10));
  StepSpec spec;
  spec.request_id = 4711;
  spec.layer = 0;
  spec.segments = {{&seq, 10}};
  Step step = BuildStep(mirror_, spec);
  step.request.mutable_q()->set_shape(2, -512);
  AttendStream stream(*stub_);
  ExpectError(stream.RoundTrip(step.request), 4711, grpc::StatusCode::INVALID_ARGUMENT, "q.shape",
              "q of shape [1, 8, -512]");
  EXPECT_TRUE(stream.Close().ok());
}

// Bad CreateSession, AppendKV and CloseSession calls fail with their code
// and a message naming the field, and take or change nothing.
TEST_F(ServerE2eTest, BadUnaryRequestsFailWithTheirCodeAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  using grpc::StatusCode;
  auto create = [&](const std::string& model, int heads, std::optional<pb::Tensor> sinks, int ttl) {
    pb::CreateSessionRequest request;
    request.set_model(model);
    request.set_num_heads(heads);
    if (sinks.has_value()) *request.mutable_sinks() = *sinks;
    request.set_idle_ttl_seconds(ttl);
    pb::CreateSessionResponse response;
    return Call(*stub_, &pb::MlaOffload::Stub::CreateSession, request, &response);
  };
  pb::Tensor sinks_short, sinks_bf16;
  SetTensor(&sinks_short, pb::DTYPE_F32, {44, 7}, std::string(44 * 7 * 4, 0));
  SetTensor(&sinks_bf16, pb::DTYPE_BF16, {44, 64}, std::string(44 * 64 * 2, 0));
  ExpectStatus(create("deepseek-v5", 8, std::nullopt, 0), StatusCode::INVALID_ARGUMENT, "model",
               "unknown model");
  ExpectStatus(create("", 8, std::nullopt, 0), StatusCode::INVALID_ARGUMENT, "model", "no model");
  ExpectStatus(create(kFlash, 0, std::nullopt, 0), StatusCode::INVALID_ARGUMENT, "num_heads",
               "0 heads");
  ExpectStatus(create(kFlash, 65, std::nullopt, 0), StatusCode::INVALID_ARGUMENT, "num_heads",
               "65 heads of Flash's 64");
  ExpectStatus(create(kPro, 129, std::nullopt, 0), StatusCode::INVALID_ARGUMENT, "num_heads",
               "129 heads of Pro's 128");
  ExpectStatus(create(kFlash, -4, std::nullopt, 0), StatusCode::INVALID_ARGUMENT, "num_heads",
               "-4 heads");
  ExpectStatus(create(kFlash, 8, sinks_short, 0), StatusCode::INVALID_ARGUMENT, "sinks",
               "sinks [44, 7] for 8 heads");
  ExpectStatus(create(kFlash, 8, sinks_bf16, 0), StatusCode::INVALID_ARGUMENT, "sinks",
               "bf16 sinks");
  ExpectStatus(create(kFlash, 8, std::nullopt, -1), StatusCode::INVALID_ARGUMENT,
               "idle_ttl_seconds", "negative TTL");
  pb::ServerInfo info = Info();
  EXPECT_EQ(info.sessions(), 0);
  EXPECT_EQ(info.kv_blocks_used(), 0);

  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 41, /*with_sinks=*/false));
  auto append = [&](const pb::AppendKVRequest& request) {
    pb::AppendKVResponse response;
    return Call(*stub_, &pb::MlaOffload::Stub::AppendKV, request, &response);
  };
  const pb::AppendKVRequest prompt = PromptRequest(seq, 0, 20);
  {
    pb::AppendKVRequest request = prompt;
    request.set_session_id("ffffffffffffffffffffffffffffffff");
    ExpectStatus(append(request), StatusCode::NOT_FOUND, "does not exist", "unknown session");
  }
  {
    pb::AppendKVRequest request = PromptRequest(seq, 5, 20);
    ExpectStatus(append(request), StatusCode::FAILED_PRECONDITION, "first_position",
                 "first position 5 of a new session");
  }
  {
    pb::AppendKVRequest request = prompt;
    request.set_num_positions(0);
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "num_positions", "0 positions");
  }
  {
    pb::AppendKVRequest request;
    request.set_session_id(seq.id);
    request.set_num_positions(kMaxPosition + 1);
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "num_positions",
                 "positions beyond --max_position");
  }
  {
    pb::AppendKVRequest request = prompt;
    request.mutable_layers()->RemoveLast();
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "layers", "43 layers of 44");
  }
  {
    pb::AppendKVRequest request = prompt;
    request.mutable_layers(7)->set_layer(6);
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "layers[layer=6]", "layer 6 twice");
  }
  {
    pb::AppendKVRequest request = prompt;
    SetTensor(request.mutable_layers(5)->mutable_swa_kv(), pb::DTYPE_BF16, {19, kHeadDim},
              std::string(19 * kRowBytes, '\x3f'));
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "layers[layer=5].swa_kv",
                 "19 SWA rows for 20 positions");
  }
  {
    pb::AppendKVRequest request = prompt;  // layer 2 is C4A: 20 positions make 5 rows
    SetTensor(request.mutable_layers(2)->mutable_compressed_kv(), pb::DTYPE_BF16, {4, kHeadDim},
              std::string(4 * kRowBytes, '\x3f'));
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "layers[layer=2].compressed_kv",
                 "4 compressed rows for 5");
  }
  {
    pb::AppendKVRequest request = prompt;
    request.mutable_layers(2)->set_first_compressed_row(1);
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "layers[layer=2].compressed_kv",
                 "compressed rows from row 1");
  }
  {
    pb::AppendKVRequest request = prompt;
    SetTensor(request.mutable_layers(0)->mutable_compressed_kv(), pb::DTYPE_BF16, {5, kHeadDim},
              std::string(5 * kRowBytes, '\x3f'));
    ExpectStatus(append(request), StatusCode::INVALID_ARGUMENT, "layers[layer=0].compressed_kv",
                 "compressed rows on an SWA-only layer");
  }
  ExpectListed(seq, "after the bad AppendKV calls");
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks());

  pb::CloseSessionResponse closed;
  pb::CloseSessionRequest close;
  close.set_session_id("not-a-session");
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::CloseSession, close, &closed),
               StatusCode::NOT_FOUND, "not-a-session", "closing an unknown session");

  // The prompt still goes in from position 0, and decodes as it should.
  ASSERT_NO_FATAL_FAILURE(Append(&seq, 20));
  AttendStream stream(*stub_);
  for (int layer : {0, 2, 3}) {
    StepSpec spec;
    spec.request_id = layer;
    spec.layer = layer;
    spec.segments = {{&seq, 20}};
    spec.lse = true;
    const Step step = BuildStep(mirror_, spec);
    ExpectAnswer(stream.RoundTrip(step.request), step, absl::StrCat("layer ", layer));
  }
  EXPECT_TRUE(stream.Close().ok());
}

// With --max_message_mb=1, a bigger message is refused by gRPC before the
// service sees it: an AppendKV call fails with RESOURCE_EXHAUSTED, and an
// Attend message ends its whole stream with RESOURCE_EXHAUSTED (not just the
// message). Nothing changes; a prompt goes in as several smaller AppendKV
// calls, and a new stream is served.
TEST_F(ServerE2eTest, MessagesOverMaxMessageMbAreRefusedAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_mb=1"}));
  EXPECT_EQ(Info().max_message_bytes(), int64_t{1} << 20);
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 51));

  // 44 layers x 48 positions x 1 KiB = 2.1 MiB: answered by the server's
  // own limit (gRPC's transport limit, 3 MiB, is above it), naming the flag.
  pb::AppendKVResponse appended;
  const grpc::Status too_big =
      Call(*stub_, &pb::MlaOffload::Stub::AppendKV, PromptRequest(seq, 0, 48), &appended);
  ExpectStatus(too_big, grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_message_mb",
               "an oversized AppendKV");
  ExpectListed(seq, "after the oversized AppendKV");
  for (int chunk = 0; chunk < 4; ++chunk) ASSERT_NO_FATAL_FAILURE(Append(&seq, 16));
  ExpectListed(seq, "after four AppendKV calls of 16 positions");

  auto step_at = [&](int layer, int32_t position) {
    StepSpec spec;
    spec.request_id = position * 100 + layer;
    spec.layer = layer;
    spec.segments = {{&seq, position}};
    spec.lse = true;
    return BuildStep(mirror_, spec);
  };
  {
    AttendStream stream(*stub_);
    for (int layer : {0, 2, 3}) {
      const Step step = step_at(layer, 64);
      ExpectAnswer(stream.RoundTrip(step.request), step, absl::StrCat("layer ", layer, " at 64"));
      Applied(step);
    }
    // In flight together: a good step, the next step of layer 0 with 1.2 MB
    // of extra (unused) top-k bytes, and a good step of another layer. The
    // oversized one is answered in-band, in its place, and changes nothing;
    // the stream goes on.
    const Step before = step_at(2, 65);
    Step oversized = step_at(0, 65);
    SetTensor(oversized.request.mutable_topk(), pb::DTYPE_I32, {1, 300000},
              std::string(1200000, '\xff'));
    const Step after = step_at(3, 65);
    for (const Step* step : {&before, static_cast<const Step*>(&oversized), &after}) ASSERT_TRUE(stream.Write(step->request));
    pb::AttendResponse response;
    ASSERT_TRUE(stream.Read(&response));
    ExpectAnswer(response, before, "the step before the oversized one");
    Applied(before);
    ASSERT_TRUE(stream.Read(&response));
    ExpectError(response, oversized.request.request_id(), grpc::StatusCode::RESOURCE_EXHAUSTED,
                "--max_message_mb", "the oversized message");
    ASSERT_TRUE(stream.Read(&response));
    ExpectAnswer(response, after, "the step after the oversized one");
    Applied(after);
    const Step retried = step_at(0, 65);
    ExpectAnswer(stream.RoundTrip(retried.request), retried, "layer 0 at 65 on the same stream");
    Applied(retried);
    EXPECT_TRUE(stream.Close().ok());
  }
  ExpectListed(seq, "after the oversized Attend message");
  {
    // Above gRPC's own limit (twice the server's and 1 MiB more) the
    // transport ends the stream: the one case that is not answered in-band.
    AttendStream stream(*stub_);
    Step huge = step_at(0, 66);
    SetTensor(huge.request.mutable_topk(), pb::DTYPE_I32, {1, 1 << 20},
              std::string(4 << 20, '\xff'));
    EXPECT_TRUE(stream.Write(huge.request));
    pb::AttendResponse response;
    EXPECT_FALSE(stream.Read(&response)) << "answered: " << response.status().message();
    EXPECT_EQ(stream.Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  ExpectListed(seq, "after the message above the transport's limit");
  AttendStream stream(*stub_);
  const Step step = step_at(0, 66);
  ExpectAnswer(stream.RoundTrip(step.request), step, "layer 0 at 66 on a new stream");
  Applied(step);
  EXPECT_TRUE(stream.Close().ok());
}

// A request that fits whose answer would not: 85 tokens x 12 heads of q
// (1,044,480 bytes) with no kv (the step repeats an AppendKV'd position, as
// another rank would) fits in 1 MiB; out plus lse (1,048,560 bytes and the
// framing) does not. It is refused before anything runs; without lse it is
// answered.
TEST_F(ServerE2eTest, AnAnswerOverMaxMessageMbIsRefusedBeforeItRuns) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_mb=1"}));
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 12, 52));
  for (int chunk = 0; chunk < 5; ++chunk) ASSERT_NO_FATAL_FAILURE(Append(&seq, 17));
  ASSERT_EQ(seq.NextPosition(), 85);
  StepSpec spec;
  spec.request_id = 7;
  spec.layer = 0;
  spec.segments = {{&seq, 0, 85}};
  spec.send_kv = false;
  spec.lse = true;
  Step with_lse = BuildStep(mirror_, spec);
  ASSERT_LT(with_lse.request.ByteSizeLong(), size_t{1} << 20);
  AttendStream stream(*stub_);
  ExpectError(stream.RoundTrip(with_lse.request), 7, grpc::StatusCode::RESOURCE_EXHAUSTED,
              "--max_message_mb", "an answer over the limit");
  ExpectListed(seq, "after the refused step");
  spec.lse = false;
  spec.request_id = 8;
  const Step without_lse = BuildStep(mirror_, spec);
  ExpectAnswer(stream.RoundTrip(without_lse.request), without_lse, "the same step without lse");
  EXPECT_TRUE(stream.Close().ok());
}

// ---- 4. Pool exhaustion and metrics.

// A pool of 354 blocks: two Flash sessions (176 blocks of SWA rings each)
// and 2 blocks to spare. A third session, a prompt that needs 21 compressed
// pages and the third compressed page of a decode step are each refused with
// RESOURCE_EXHAUSTED and change nothing; CloseSession frees the blocks, as
// /metrics shows, and the refused step then succeeds with the same answer.
TEST_F(ServerE2eTest, ExhaustedPoolRefusesAndCloseSessionFrees) {
  constexpr int64_t kTotal = 354;
  ASSERT_NO_FATAL_FAILURE(
      StartServer({absl::StrCat("--kv_cache_gb=", (kTotal * kBlockBytes + 100) / 1e9)}));
  EXPECT_EQ(Info().kv_blocks_total(), kTotal);
  using grpc::StatusCode;

  Seq a, b;
  ASSERT_NO_FATAL_FAILURE(Create(&a, kFlash, 8, 61));
  ASSERT_NO_FATAL_FAILURE(Append(&a, 3));  // no compressed rows yet
  ASSERT_NO_FATAL_FAILURE(Create(&b, kFlash, 8, 62));
  EXPECT_EQ(Info().kv_blocks_used(), 352);

  pb::CreateSessionRequest create;
  create.set_model(kFlash);
  create.set_num_heads(8);
  pb::CreateSessionResponse created;
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::CreateSession, create, &created),
               StatusCode::RESOURCE_EXHAUSTED, "KV cache full", "a third session");
  // Position 3 makes row 0 of all 21 C4A layers: 21 pages, 2 free.
  pb::AppendKVResponse appended;
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::AppendKV, PromptRequest(a, 3, 1), &appended),
               StatusCode::RESOURCE_EXHAUSTED, "KV cache full", "a prompt needing 21 pages");
  pb::ServerInfo info = Info();
  EXPECT_EQ(info.kv_blocks_used(), 352);
  EXPECT_EQ(info.sessions(), 2);
  EXPECT_EQ(Sessions().size(), 2u);
  ExpectListed(a, "a after the refused prompt");

  AttendStream stream(*stub_);
  auto step_at = [&](int layer) {
    StepSpec spec;
    spec.request_id = layer;
    spec.layer = layer;
    spec.segments = {{&a, 3}};
    spec.lse = true;
    return BuildStep(mirror_, spec);
  };
  for (int layer : {2, 4}) {  // C4A: row 0 needs a page each
    const Step step = step_at(layer);
    ExpectAnswer(stream.RoundTrip(step.request), step, absl::StrCat("layer ", layer));
    Applied(step);
  }
  const Step refused = step_at(6);
  const pb::AttendResponse response = stream.RoundTrip(refused.request);
  ExpectError(response, refused.request.request_id(), StatusCode::RESOURCE_EXHAUSTED,
              "KV cache full", "layer 6 with the pool full");
  const Step swa = step_at(0);  // needs no page: still served
  ExpectAnswer(stream.RoundTrip(swa.request), swa, "SWA layer with the pool full");
  Applied(swa);

  // (MetricsFollowAttendPageAllocation checks /metrics right after Attend;
  // here GetServerInfo comes first.)
  EXPECT_EQ(Info().kv_blocks_used(), 354);
  const Metrics full = ScrapeMetrics();
  EXPECT_EQ(full.Get("mla_kv_blocks", {{"state", "used"}}), 354.0)
      << "mla_kv_blocks{state=\"used\"} after Attend took the last 2 blocks";
  EXPECT_EQ(full.Get("mla_kv_blocks", {{"state", "free"}}), 0.0);
  EXPECT_EQ(full.Get("mla_sessions"), 2.0);
  EXPECT_EQ(full.Requests("CreateSession", "OK"), 2.0);
  EXPECT_EQ(full.Requests("CreateSession", "RESOURCE_EXHAUSTED"), 1.0);
  EXPECT_EQ(full.Requests("AppendKV", "OK"), 1.0);
  EXPECT_EQ(full.Requests("AppendKV", "RESOURCE_EXHAUSTED"), 1.0);
  EXPECT_EQ(full.Requests("Attend", "OK"), 3.0);
  EXPECT_EQ(full.Requests("Attend", "RESOURCE_EXHAUSTED"), 1.0);
  EXPECT_EQ(full.Get("mla_attend_tokens_total"), 3.0);
  EXPECT_EQ(full.Requests("GetServerInfo", "OK"), 4.0);
  EXPECT_EQ(full.Get("mla_attend_streams"), 1.0);
  EXPECT_EQ(Info().kv_blocks_used(), a.Blocks() + b.Blocks());

  pb::CloseSessionRequest close;
  close.set_session_id(b.id);
  pb::CloseSessionResponse closed;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::CloseSession, close, &closed).ok());
  EXPECT_EQ(closed.kv_blocks_freed(), b.Blocks());
  const Metrics freed = ScrapeMetrics();
  EXPECT_EQ(freed.Get("mla_kv_blocks", {{"state", "used"}}), 178.0);
  EXPECT_EQ(freed.Get("mla_kv_blocks", {{"state", "free"}}), 176.0);
  EXPECT_EQ(freed.Get("mla_sessions"), 1.0);
  EXPECT_EQ(freed.Requests("CloseSession", "OK"), 1.0);
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::CloseSession, close, &closed),
               StatusCode::NOT_FOUND, b.id, "closing b twice");

  // The refused step, unchanged, now succeeds with the answer it would have
  // had: nothing of it was half-inserted.
  ExpectAnswer(stream.RoundTrip(refused.request), refused, "layer 6 after CloseSession");
  Applied(refused);
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(a, "a at the end");
  EXPECT_EQ(Info().kv_blocks_used(), a.Blocks());
}

// ---- 5. Idle sessions.

// A session with a 1 s TTL that nobody uses is closed after 1-3 s (the server
// looks once a second); one that keeps attending, and one with the server's
// default TTL, stay.
TEST_F(ServerE2eTest, IdleSessionsExpireAndBusyOnesStay) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq idle, busy, lasting;
  ASSERT_NO_FATAL_FAILURE(Create(&idle, kFlash, 8, 71, true, /*idle_ttl_seconds=*/1));
  ASSERT_NO_FATAL_FAILURE(Create(&busy, kFlash, 8, 72, true, /*idle_ttl_seconds=*/1));
  ASSERT_NO_FATAL_FAILURE(Create(&lasting, kFlash, 8, 73));
  ASSERT_NO_FATAL_FAILURE(Append(&idle, 10));
  const absl::Time idle_since = absl::Now();
  ASSERT_NO_FATAL_FAILURE(Append(&busy, 10));

  AttendStream stream(*stub_);
  std::optional<absl::Duration> gone_after;
  for (int32_t p = 10; absl::Now() - idle_since < absl::Seconds(3.2); ++p) {
    StepSpec spec;
    spec.request_id = p;
    spec.layer = 0;
    spec.segments = {{&busy, p}};
    const Step step = BuildStep(mirror_, spec);
    ExpectAnswer(stream.RoundTrip(step.request), step, absl::StrCat("busy session at ", p));
    Applied(step);
    if (!gone_after.has_value() && Sessions().count(idle.id) == 0) {
      gone_after = absl::Now() - idle_since;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_TRUE(gone_after.has_value()) << "the idle session was still listed after 3.2 s";
  EXPECT_GE(*gone_after, absl::Seconds(0.9)) << "closed before its TTL";
  EXPECT_LE(*gone_after, absl::Seconds(3)) << "closed late";

  // Gone for every method; the others stay.
  StepSpec spec;
  spec.request_id = 5;
  spec.layer = 0;
  spec.segments = {{&idle, 10}};
  const pb::AttendResponse response = stream.RoundTrip(BuildStep(mirror_, spec).request);
  ExpectError(response, 5, grpc::StatusCode::NOT_FOUND, idle.id, "attending the expired session");
  pb::CloseSessionRequest close;
  close.set_session_id(idle.id);
  pb::CloseSessionResponse closed;
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::CloseSession, close, &closed),
               grpc::StatusCode::NOT_FOUND, idle.id, "closing the expired session");
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(busy, "the busy session");
  ExpectListed(lasting, "the session with the default TTL");
  EXPECT_EQ(Info().sessions(), 2);
  EXPECT_EQ(Info().kv_blocks_used(), busy.Blocks() + lasting.Blocks());
  // The server's log says which it closed, and the refusals that followed.
  const std::string log = server_->Output();
  EXPECT_THAT(log, ::testing::ContainsRegex("Z I closed 1 session idle past their TTL: " + idle.id));
  EXPECT_THAT(log, HasSubstr("W refused CloseSession: NOT_FOUND: "));
  EXPECT_THAT(log, HasSubstr("W refused Attend: NOT_FOUND: "));
}

// The engine state on /metrics follows the pages an Attend step takes
// without any other request having to come first.
TEST_F(ServerE2eTest, MetricsFollowAttendPageAllocation) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 82, false));
  ASSERT_NO_FATAL_FAILURE(Append(&seq, 3));
  EXPECT_EQ(ScrapeMetrics().Get("mla_kv_blocks", {{"state", "used"}}), 176.0);
  StepSpec spec;
  spec.layer = 2;  // C4A: row 0 at p = 3 takes the layer's first page
  spec.segments = {{&seq, 3}};
  const Step step = BuildStep(mirror_, spec);
  AttendStream stream(*stub_);
  ExpectAnswer(stream.RoundTrip(step.request), step, "layer 2 at 3");
  Applied(step);
  EXPECT_TRUE(stream.Close().ok());
  const Metrics after = ScrapeMetrics();
  EXPECT_EQ(after.Get("mla_kv_blocks", {{"state", "used"}}), 177.0)
      << "mla_kv_blocks{state=\"used\"} after an Attend step took a page";
  EXPECT_EQ(after.Get("mla_kv_bytes", {{"state", "used"}}), 177.0 * kBlockBytes);
  EXPECT_EQ(Info().kv_blocks_used(), seq.Blocks());
  // The message's own latency histogram, apart from the stages' (which no
  // longer hold a "total" to double-count); the unary calls' latencies.
  EXPECT_EQ(after.Get("mla_attend_seconds_count"), 1.0);
  EXPECT_EQ(after.Get("mla_attend_stage_seconds_count", {{"stage", "total"}}), std::nullopt);
  EXPECT_EQ(after.Get("mla_attend_stage_seconds_count", {{"stage", "queue"}}), 1.0);
  EXPECT_EQ(after.Get("mla_request_seconds_count", {{"method", "CreateSession"}}), 1.0);
  EXPECT_GE(after.Get("mla_request_seconds_count", {{"method", "AppendKV"}}).value_or(0), 1.0);
}

// The engine state on /metrics follows an expiry without any other request
// having to come first.
TEST_F(ServerE2eTest, MetricsFollowAnExpiry) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 81, false, /*idle_ttl_seconds=*/1));
  EXPECT_EQ(ScrapeMetrics().Get("mla_sessions"), 1.0);
  absl::SleepFor(absl::Seconds(3));
  const Metrics metrics = ScrapeMetrics();
  EXPECT_EQ(metrics.Get("mla_sessions"), 0.0) << "mla_sessions 3 s after a 1 s TTL";
  EXPECT_EQ(metrics.Get("mla_kv_blocks", {{"state", "used"}}), 0.0);
  EXPECT_EQ(Info().sessions(), 0);
}

// /metrics shows the pool before the first request.
TEST_F(ServerE2eTest, MetricsShowThePoolAtStart) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const Metrics metrics = ScrapeMetrics();
  const int64_t total = static_cast<int64_t>(0.05e9 / kBlockBytes);
  EXPECT_EQ(metrics.Get("mla_kv_blocks", {{"state", "free"}}), static_cast<double>(total));
  EXPECT_EQ(metrics.Get("mla_kv_blocks", {{"state", "used"}}), 0.0);
  EXPECT_EQ(metrics.Get("mla_sessions"), 0.0);
  EXPECT_EQ(metrics.Get("mla_draining"), 0.0);
  EXPECT_EQ(metrics.Get("mla_kv_bytes", {{"state", "free"}}),
            static_cast<double>(total) * kBlockBytes);
  EXPECT_GT(metrics.Get("process_resident_memory_bytes").value_or(0), 1 << 20);
  EXPECT_GT(metrics.Get("process_open_fds").value_or(0), 0);
  EXPECT_GT(metrics.Get("process_start_time_seconds").value_or(0), 1.7e9);
  // The GPU's memory where there is one (the CUDA backend); none on the CPU.
  const std::optional<double> gpu_used = metrics.Get("mla_device_memory_bytes", {{"state", "used"}});
  const std::optional<double> gpu_free = metrics.Get("mla_device_memory_bytes", {{"state", "free"}});
  if (ServerBackend() == "cpu") {
    EXPECT_EQ(gpu_used, std::nullopt);
    EXPECT_EQ(gpu_free, std::nullopt);
  } else {
    // At least the KV cache this server allocated.
    EXPECT_GE(gpu_used.value_or(0), static_cast<double>(total) * kBlockBytes);
    EXPECT_GT(gpu_free.value_or(0), 0);
  }
  // The build: its version, and the commit ServerInfo names too.
  const std::string version = Info().version();
  const std::string commit = version.substr(version.rfind(' ') + 1);
  EXPECT_THAT(version, HasSubstr(", commit ")) << version;
  EXPECT_EQ(metrics.Get("mla_build_info", {{"version", "0.1.0"}, {"commit", commit}}), 1.0)
      << "commit " << commit;
}

// ---- 6. Drain.

// A server that got SIGTERM while an Attend message was in flight (it waits
// 1 s for a batch, so the signal comes while it is queued); the stream
// stays open.
class DrainTest : public ServerE2eTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer({"--drain_seconds=5", "--batch_wait_us=1000000"}));
    ASSERT_NO_FATAL_FAILURE(Create(&seq_, kFlash, 8, 91));
    ASSERT_NO_FATAL_FAILURE(Append(&seq_, 40));
    for (const std::string service : {"", kReadiness}) {
      HealthCheckResponse health;
      ASSERT_TRUE(HealthCheck(&health, service).ok()) << "service '" << service << "'";
      EXPECT_EQ(health.status(), HealthCheckResponse::SERVING) << "service '" << service << "'";
    }
    stream_ = std::make_unique<AttendStream>(*stub_);
    in_flight_ = StepAt(40);
    ASSERT_TRUE(stream_->Write(in_flight_.request));
    absl::SleepFor(absl::Milliseconds(200));
    signalled_ = absl::Now();
    server_->Signal(SIGTERM);
    ASSERT_TRUE(server_->WaitForLine("draining", absl::Seconds(2)).has_value());
  }
  void TearDown() override {
    stream_.reset();
    ServerE2eTest::TearDown();
  }

  Step StepAt(int32_t position) {
    StepSpec spec;
    spec.request_id = position;
    spec.layer = 2;
    spec.segments = {{&seq_, position}};
    spec.lse = true;
    return BuildStep(mirror_, spec);
  }

  // Reads the answer to the message in flight and closes the stream.
  void FinishStream() {
    pb::AttendResponse response;
    ASSERT_TRUE(stream_->Read(&response));
    ExpectAnswer(response, in_flight_, "the message in flight at SIGTERM");
    Applied(in_flight_);
    EXPECT_TRUE(stream_->Close().ok());
  }

  Seq seq_;
  std::unique_ptr<AttendStream> stream_;
  Step in_flight_;
  absl::Time signalled_;
};

// The message in flight and one sent after the signal are answered
// correctly; once the stream closes the process exits 0, well within
// --drain_seconds.
TEST_F(DrainTest, OpenStreamsAreServedThenTheServerExits) {
  pb::AttendResponse response;
  ASSERT_TRUE(stream_->Read(&response));
  ExpectAnswer(response, in_flight_, "the message in flight at SIGTERM");
  Applied(in_flight_);
  const Step after = StepAt(41);
  ExpectAnswer(stream_->RoundTrip(after.request), after, "a message sent while draining");
  EXPECT_TRUE(stream_->Close().ok());
  const absl::Time closed = absl::Now();

  const std::optional<int> exit_status = server_->WaitExit(absl::Seconds(6));
  ASSERT_TRUE(exit_status.has_value()) << "still running 6 s after the stream closed";
  const absl::Time exited = absl::Now();
  EXPECT_TRUE(WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) == 0)
      << "wait status " << *exit_status;
  EXPECT_LT(exited - signalled_, absl::Seconds(5)) << "exited after the drain deadline";
  EXPECT_LT(exited - closed, absl::Seconds(1.5)) << "lingered after its last stream closed";
  EXPECT_TRUE(server_->WaitForLine("stopped", absl::Seconds(1)).has_value()) << server_->Output();
}

// While draining, the service's own health name says NOT_SERVING (what a
// readiness probe or load balancer acts on) while "" stays SERVING (a
// liveness probe must not kill a draining pod), CreateSession is
// UNAVAILABLE with the server's message, and /metrics shows the drain.
TEST_F(DrainTest, HealthTurnsNotServingAndNewSessionsAreUnavailable) {
  // The signal handler's flag is polled every 50 ms: allow it a moment.
  HealthCheckResponse health;
  grpc::Status health_status;
  const absl::Time deadline = absl::Now() + absl::Seconds(1);
  do {
    health_status = HealthCheck(&health, kReadiness);
  } while (health_status.ok() && health.status() == HealthCheckResponse::SERVING &&
           absl::Now() < deadline);
  EXPECT_TRUE(health_status.ok()) << "health Check while draining failed: code "
                                  << health_status.error_code() << ", "
                                  << health_status.error_message();
  if (health_status.ok()) {
    EXPECT_EQ(health.status(), HealthCheckResponse::NOT_SERVING);
  }
  HealthCheckResponse liveness;
  ASSERT_TRUE(HealthCheck(&liveness, "").ok());
  EXPECT_EQ(liveness.status(), HealthCheckResponse::SERVING) << "\"\" while draining";
  pb::CreateSessionRequest create;
  create.set_model(kFlash);
  create.set_num_heads(8);
  pb::CreateSessionResponse created;
  const grpc::Status refused = Call(*stub_, &pb::MlaOffload::Stub::CreateSession, create, &created);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE)
      << "CreateSession while draining: " << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("draining"));
  absl::StatusOr<std::string> metrics = HttpGet(server_->metrics_port(), "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(Metrics(*metrics).Get("mla_draining"), 1.0);
  FinishStream();
}

// ---- 7. Ordering.

// Echo, the transport baseline, sends every message back unchanged, in order.
// Numeric flags outside what the server can run with are refused at start,
// naming the flag and its range (a negative --max_message_mb used to mean
// no limit at all; a NaN --kv_cache_gb was undefined behaviour).
TEST(ServerFlagsTest, OutOfRangeFlagsAreRefusedByName) {
  absl::StatusOr<std::string> binary = client::ServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--max_message_mb=0", "--max_message_mb=0 is outside 1..1023"},
      {"--max_message_mb=-1", "--max_message_mb=-1 is outside"},
      {"--kv_cache_gb=nan", "--kv_cache_gb=nan"},
      {"--kv_cache_gb=0", "--kv_cache_gb=0"},
      {"--max_position=0", "--max_position=0 is outside"},
      {"--batch_wait_us=-1", "--batch_wait_us=-1 is outside"},
      {"--batches_in_flight=2", "--batches_in_flight=2 is outside -1..1"},
      {"--max_messages_in_flight=0", "--max_messages_in_flight=0 is outside"},
      {"--max_unanswered_mb=0", "--max_unanswered_mb=0 is outside 1..65536"},
      {"--max_transport_memory_mb=-1", "--max_transport_memory_mb=-1 is outside 0.."},
      {"--session_idle_ttl_s=0", "--session_idle_ttl_s=0 is outside"},
      {"--session_idle_ttl_s=7200", "--session_idle_ttl_s=7200 is above --max_session_idle_ttl_s=3600"},
      {"--max_session_idle_ttl_s=0", "--max_session_idle_ttl_s=0 is outside"},
      {"--listen=127.0.0.1:0,127.0.0.1:0", "give exactly one HOST:PORT"},
      // Without TLS and authentication an address other hosts reach needs
      // --allow_insecure (auth_e2e_test covers the server with them).
      {"--listen=0.0.0.0:0", "--listen=0.0.0.0:0 can be reached from other hosts"},
      {"--listen=[::]:0", "pass --allow_insecure on a network you control"},
      {"--listen=127.0.0.1.5:0", "can be reached from other hosts"},
      {"--listen=unix-abstract:mla", "give the TCP address as HOST:PORT"},
      {"--listen=dns:///localhost:0", "give the TCP address as HOST:PORT"},
      {"--listen=unix:/tmp/mla_e2e_only.sock", "give exactly one HOST:PORT"},
  };
  for (const auto& [flag, message] : cases) {
    absl::StatusOr<client::CommandResult> result =
        client::RunCommand({*binary, "--listen=127.0.0.1:0", "--metrics_port=-1", flag});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 1) << flag;
    EXPECT_THAT(result->err, HasSubstr(message)) << flag;
    EXPECT_THAT(result->out, ::testing::Not(HasSubstr("serving on"))) << flag;
  }
}

// With --allow_insecure the server serves on an address other hosts reach
// (here every interface, reached through loopback).
TEST(ServerFlagsTest, AllowInsecureServesOnEveryInterface) {
  absl::StatusOr<std::unique_ptr<client::TestServer>> server =
      client::TestServer::Start({"--listen=0.0.0.0:0", "--allow_insecure"});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<pb::MlaOffload::Stub> stub = pb::MlaOffload::NewStub(NewChannel(**server));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::GetServerInfoRequest request;
  pb::ServerInfo info;
  const grpc::Status status = stub->GetServerInfo(&context, request, &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(info.kv_blocks_total(), 0);
}

// Whether this machine can listen on and reach ::1 (containers may lack it).
bool HasIpv6Loopback() {
  const int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return ok;
}

// gRPC and metrics both on IPv6 loopback (metrics have an address of their
// own; they used to follow --listen's host, which civetweb could not bind).
TEST(ServerFlagsTest, ServesGrpcAndMetricsOnIpv6Loopback) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  absl::StatusOr<std::unique_ptr<client::TestServer>> server =
      client::TestServer::Start({"--listen=[::1]:0", "--metrics_listen=[::1]:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->target(), absl::StrCat("[::1]:", (*server)->port()));
  std::unique_ptr<pb::MlaOffload::Stub> stub = pb::MlaOffload::NewStub(NewChannel(**server));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::ServerInfo info;
  const grpc::Status status = stub->GetServerInfo(&context, pb::GetServerInfoRequest(), &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  ASSERT_GT((*server)->metrics_port(), 0) << (*server)->Output();
  absl::StatusOr<std::string> metrics =
      HttpGet((*server)->metrics_port(), "/metrics", "", /*ipv6=*/true);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_TRUE(Metrics(*metrics).Get("mla_build_info").has_value());
}

// --metrics_basic_auth_file: a scrape without the password is refused, one
// with it answered; --metrics_port, kept for older scripts, still moves the
// port.
TEST(ServerFlagsTest, MetricsTakeBasicAuthFromAFile) {
  const std::string file = ::testing::TempDir() + "/metrics_auth";
  {
    std::ofstream out(file);
    out << "prometheus:s3cret\n";
  }
  absl::StatusOr<std::unique_ptr<client::TestServer>> server = client::TestServer::Start(
      {"--metrics_listen=127.0.0.1:9", "--metrics_port=0", "--metrics_basic_auth_file=" + file});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->metrics_port(), 0) << (*server)->Output();
  EXPECT_NE((*server)->metrics_port(), 9);
  absl::StatusOr<std::string> refused = HttpGet((*server)->metrics_port(), "/metrics");
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(" 401 "));
  // base64("prometheus:s3cret")
  absl::StatusOr<std::string> metrics = HttpGet((*server)->metrics_port(), "/metrics",
                                                "Authorization: Basic cHJvbWV0aGV1czpzM2NyZXQ=\r\n");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_TRUE(Metrics(*metrics).Get("mla_build_info").has_value());
}

// --metrics_tls_cert_file and --metrics_tls_key_file: /metrics over HTTPS
// (curl checks the certificate, made here by openssl), and no plain HTTP
// answer on that port.
TEST(ServerFlagsTest, MetricsServeOverTls) {
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/e2e_metrics_cert.pem", key = dir + "/e2e_metrics_key.pem";
  absl::StatusOr<client::CommandResult> made = client::RunCommand(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
       "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert});
  ASSERT_TRUE(made.ok() && made->exit_code == 0) << (made.ok() ? made->err : made.status().ToString());
  absl::StatusOr<std::unique_ptr<client::TestServer>> server = client::TestServer::Start(
      {"--metrics_listen=127.0.0.1:0", "--metrics_tls_cert_file=" + cert,
       "--metrics_tls_key_file=" + key});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->metrics_port();
  ASSERT_GT(port, 0) << (*server)->Output();
  EXPECT_THAT((*server)->Output(), HasSubstr(absl::StrCat("https://127.0.0.1:", port, "/metrics")));
  absl::StatusOr<client::CommandResult> scraped = client::RunCommand(
      {"/usr/bin/curl", "--silent", "--show-error", "--fail", "--max-time", "10", "--cacert", cert,
       absl::StrCat("https://127.0.0.1:", port, "/metrics")});
  ASSERT_TRUE(scraped.ok()) << scraped.status();
  EXPECT_EQ(scraped->exit_code, 0) << scraped->err;
  EXPECT_TRUE(Metrics(scraped->out).Get("mla_build_info").has_value()) << scraped->out;
  EXPECT_FALSE(HttpGet(port, "/metrics").ok()) << "plain HTTP on the HTTPS port";
}

// Metrics settings that cannot work are refused at start, naming the flag.
TEST(ServerFlagsTest, BadMetricsFlagsAreRefusedByName) {
  absl::StatusOr<std::string> binary = client::ServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--metrics_listen=localhost:0", "--metrics_listen: metrics address 'localhost:0'"},
      {"--metrics_listen=::1:0", "an IPv6 one goes in brackets"},
      {"--metrics_tls_cert_file=/nonexistent.pem", "give both or neither"},
      {"--metrics_basic_auth_file=/nonexistent", "--metrics_basic_auth_file: cannot read"},
      {"--metrics_port=x", "--metrics_port=x is not -1 (off) or a port"},
      {"--metrics_idle_timeout_s=0", "--metrics_idle_timeout_s=0 is outside 1..3600"},
  };
  for (const auto& [flag, message] : cases) {
    absl::StatusOr<client::CommandResult> result = client::RunCommand(
        {*binary, "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", flag});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 1) << flag;
    EXPECT_THAT(result->err, HasSubstr(message)) << flag;
    EXPECT_THAT(result->out, ::testing::Not(HasSubstr("serving on"))) << flag;
  }
}

// --version prints the version and the commit and exits 0; --help, which
// explains every flag (the metrics port not Prometheus's own 9090), exits 0
// too (Abseil's own handling exits 1); an unknown flag exits 1.
TEST(ServerFlagsTest, VersionAndHelpAnswerAndExitZero) {
  absl::StatusOr<std::string> binary = client::ServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  absl::StatusOr<client::CommandResult> version = client::RunCommand({*binary, "--version"});
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(version->exit_code, 0);
  EXPECT_THAT(version->out, ::testing::MatchesRegex(
                                "mla-offload [0-9.]+ \\(mla_offload.v1\\), commit [0-9a-f]+(-dirty)?\n|"
                                "mla-offload [0-9.]+ \\(mla_offload.v1\\), commit unknown\n"));
  absl::StatusOr<client::CommandResult> help = client::RunCommand({*binary, "--help"});
  ASSERT_TRUE(help.ok()) << help.status();
  EXPECT_EQ(help->exit_code, 0);
  EXPECT_THAT(help->out, HasSubstr("--batches_in_flight"));
  // Metrics listen on loopback unless asked, and not on Prometheus's own port.
  const size_t metrics = help->out.find("--metrics_listen (");
  ASSERT_NE(metrics, std::string::npos);
  const size_t at = help->out.find("default: ", metrics);
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(help->out.substr(at + 9, 16), "\"127.0.0.1:9464\"");
  absl::StatusOr<client::CommandResult> bad = client::RunCommand({*binary, "--no_such_flag"});
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->exit_code, 1);
  EXPECT_THAT(bad->err, HasSubstr("no_such_flag"));
}

// The drain's default ends before Kubernetes' default grace period (30 s)
// would kill the process: a pod without a grace period of its own drains
// fully.
TEST(ServerFlagsTest, TheDrainDefaultEndsBeforeKubernetesDefaultGrace) {
  absl::StatusOr<std::string> binary = client::ServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  absl::StatusOr<client::CommandResult> result = client::RunCommand({*binary, "--help"});
  ASSERT_TRUE(result.ok()) << result.status();
  const std::string help = result->out + result->err;
  const size_t flag = help.find("--drain_seconds");
  ASSERT_NE(flag, std::string::npos) << help;
  const size_t at = help.find("default: ", flag);
  ASSERT_NE(at, std::string::npos) << help.substr(flag);
  const int drain = std::atoi(help.c_str() + at + 9);
  EXPECT_GT(drain, 0);
  EXPECT_LT(drain, 30) << "--drain_seconds defaults to " << drain << " s";
}

// --backend=cuda on a machine without an NVIDIA driver says that, and what
// to use instead (the CUDA runtime alone would blame the driver's version).
TEST(ServerFlagsTest, BackendCudaWithoutADriverSaysSo) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver != nullptr) {
    ::dlclose(driver);
    GTEST_SKIP() << "this machine has an NVIDIA driver";
  }
  absl::StatusOr<std::string> binary = client::ServerBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  absl::StatusOr<client::CommandResult> result = client::RunCommand(
      {*binary, "--listen=127.0.0.1:0", "--metrics_port=-1", "--backend=cuda"});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1);
  if (result->err.find("this build has no CUDA") != std::string::npos) {
    GTEST_SKIP() << "built without CUDA: " << result->err;
  }
  EXPECT_THAT(result->err, HasSubstr("no NVIDIA driver on this machine"));
  EXPECT_THAT(result->err, HasSubstr("use --backend=cpu"));
  EXPECT_THAT(result->err, ::testing::Not(HasSubstr("insufficient")));
}

// --max_unanswered_mb reaches the streams: a client that sends 100 steps of
// 64 tokens (512 KiB each way) and reads no answer finds the stream waiting
// for it (mla_stream_read_pauses_total) long before the server could have
// taken them all; once it reads, every answer comes, in order and OK.
// --max_connections: while one connection holds a stream, a call from
// another is RESOURCE_EXHAUSTED naming the flag and creates nothing; once
// the stream ends the other connection is served.
TEST_F(ServerE2eTest, ConnectionsPastMaxConnectionsAreRefusedWhileOthersWork) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_connections=1"}));
  grpc::ClientContext held_context;
  SetDeadline(held_context, absl::Seconds(30));
  auto held = stub_->Echo(&held_context);
  pb::EchoMessage message, back;
  message.set_payload("holding");
  ASSERT_TRUE(held->Write(message));
  ASSERT_TRUE(held->Read(&back));
  // Another connection (NewChannel does not share subchannels).
  std::unique_ptr<pb::MlaOffload::Stub> other = pb::MlaOffload::NewStub(NewChannel(*server_));
  pb::CreateSessionRequest request;
  request.set_model(kFlash);
  request.set_num_heads(8);
  pb::CreateSessionResponse response;
  ExpectStatus(Call(*other, &pb::MlaOffload::Stub::CreateSession, request, &response),
               grpc::StatusCode::RESOURCE_EXHAUSTED, "--max_connections",
               "a second connection while the first holds a stream");
  EXPECT_EQ(Info().sessions(), 0) << "the refused call created a session";
  held->WritesDone();
  EXPECT_TRUE(held->Finish().ok());
  grpc::Status status;
  for (int attempt = 0; attempt < 50; ++attempt) {
    grpc::ClientContext context;
    SetDeadline(context, absl::Seconds(5));
    status = other->CreateSession(&context, request, &response);
    if (status.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));  // the stream's end reaches the server
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(ServerE2eTest, AStreamNotReadWaitsAtMaxUnansweredMb) {
  StartServer({"--max_unanswered_mb=1"});
  constexpr int kHeads = 8, kTokens = 64, kMessages = 100;
  pb::CreateSessionRequest create;
  create.set_model(kFlash);
  create.set_num_heads(kHeads);
  pb::CreateSessionResponse created;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::CreateSession, create, &created).ok());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(120));
  auto stream = stub_->Attend(&context);
  std::thread writer([&] {
    for (int m = 0; m < kMessages; ++m) {
      pb::AttendRequest request;
      request.set_request_id(m);
      request.set_layer(0);  // V4-Flash layer 0: sliding window only
      pb::Segment* segment = request.add_segments();
      segment->set_session_id(created.session_id());
      segment->set_position(m * kTokens);
      segment->set_num_tokens(kTokens);
      SetTensor(request.mutable_q(), pb::DTYPE_BF16, {kTokens, kHeads, kHeadDim},
                Bytes(TestRows(Mix(m, 1), kTokens * kHeads)));
      SetTensor(request.mutable_kv(), pb::DTYPE_BF16, {kTokens, kHeadDim},
                Bytes(TestRows(Mix(m, 2), kTokens)));
      if (!stream->Write(request)) return;
    }
    stream->WritesDone();
  });
  double pauses = 0;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);
       pauses < 1 && absl::Now() < give_up; absl::SleepFor(absl::Milliseconds(20))) {
    absl::StatusOr<std::string> text = HttpGet(server_->metrics_port(), "/metrics");
    ASSERT_TRUE(text.ok()) << text.status();
    pauses = Metrics(*text).Get("mla_stream_read_pauses_total").value_or(0);
  }
  EXPECT_GE(pauses, 1) << "the stream never waited for its client";
  for (int m = 0; m < kMessages; ++m) {
    pb::AttendResponse response;
    ASSERT_TRUE(stream->Read(&response)) << "answer " << m;
    EXPECT_EQ(response.request_id(), static_cast<uint64_t>(m));
    EXPECT_EQ(response.status().code(), 0) << "message " << m << ": " << response.status().message();
  }
  writer.join();
  const grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Whether gRPC server reflection answers: one ServerReflectionInfo exchange
// asking for the list of services (list_services, field 7, empty); the
// call's status, and in `answered` whether a response came.
grpc::Status AskReflection(const std::shared_ptr<grpc::Channel>& channel, bool* answered) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(5));
  grpc::CompletionQueue queue;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  void* tag = nullptr;
  bool ok = false;
  const auto step = [&](int id) {
    queue.Next(&tag, &ok);
    EXPECT_EQ(tag, reinterpret_cast<void*>(id));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  step(1);
  const std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1), in;
  call->Write(out, reinterpret_cast<void*>(2));
  step(2);
  call->Read(&in, reinterpret_cast<void*>(3));
  *answered = step(3);
  call->WritesDone(reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(5);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  return status;
}

// Health and reflection answer without a token by default, and
// --nohealth / --noreflection leave each out (UNIMPLEMENTED), the
// service itself unchanged.
TEST_F(ServerE2eTest, HealthAndReflectionCanBeLeftOut) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  HealthCheckResponse response;
  EXPECT_TRUE(HealthCheck(&response).ok());
  bool answered = false;
  EXPECT_TRUE(AskReflection(channel_, &answered).ok());
  EXPECT_TRUE(answered) << "reflection did not list the services";
  server_.reset();
  ASSERT_NO_FATAL_FAILURE(StartServer({"--nohealth", "--noreflection"}));
  EXPECT_EQ(HealthCheck(&response).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(AskReflection(channel_, &answered).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_FALSE(answered);
  EXPECT_NO_FATAL_FAILURE(Info());
}

TEST_F(ServerE2eTest, EchoReturnsEveryMessageUnchanged) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  grpc::ClientContext context;
  SetDeadline(context, absl::Seconds(30));
  std::unique_ptr<grpc::ClientReaderWriter<pb::EchoMessage, pb::EchoMessage>> stream =
      stub_->Echo(&context);
  std::vector<std::string> payloads = {"", "x", Bytes(TestRows(5, 2048))};  // 2 MiB last
  for (const std::string& payload : payloads) {
    pb::EchoMessage message;
    message.set_payload(payload);
    ASSERT_TRUE(stream->Write(message));
  }
  stream->WritesDone();
  for (const std::string& payload : payloads) {
    pb::EchoMessage message;
    ASSERT_TRUE(stream->Read(&message));
    EXPECT_TRUE(message.payload() == payload) << "a payload of " << payload.size() << " bytes";
  }
  pb::EchoMessage extra;
  EXPECT_FALSE(stream->Read(&extra));
  EXPECT_TRUE(stream->Finish().ok());
  // Each message echoed counts as a request (docs/operations.md).
  EXPECT_EQ(ScrapeMetrics().Requests("Echo", "OK"), 3.0);
}

// Eight messages written without waiting (consecutive layers of one step,
// two positions of one layer, two sessions, one message of two sessions,
// one that the parser refuses at once while earlier ones are still in the
// engine) are answered in the order sent, each with its request id and its
// own correct contents (the refused one with its error).
TEST_F(ServerE2eTest, PipelinedMessagesAreAnsweredInOrder) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--batch_wait_us=20000"}));
  Seq a, b;
  ASSERT_NO_FATAL_FAILURE(Create(&a, kFlash, 8, 101));
  // Without sinks: launches of b alone must use none, launches with a use
  // -inf for b's tokens. (Server 3174da9 read a stale sink buffer.)
  ASSERT_NO_FATAL_FAILURE(Create(&b, kFlash, 8, 102, /*with_sinks=*/false));
  ASSERT_NO_FATAL_FAILURE(Append(&a, 127));  // the step at 127 brings C4A row 31, C128A row 0
  ASSERT_NO_FATAL_FAILURE(Append(&b, 127));

  auto spec_of = [](uint64_t id, int layer, std::vector<SegmentSpec> segments) {
    StepSpec spec;
    spec.request_id = id;
    spec.layer = layer;
    spec.segments = std::move(segments);
    spec.lse = id % 2 == 0;
    spec.derotate = id % 3 == 0;
    spec.fp8 = id % 4 == 1;
    return spec;
  };
  std::vector<Step> steps;
  steps.push_back(BuildStep(mirror_, spec_of(9001, 0, {{&a, 127}})));
  steps.push_back(BuildStep(mirror_, spec_of(17, 2, {{&b, 127}})));
  steps.push_back(BuildStep(mirror_, spec_of(4242, 2, {{&a, 127}})));
  steps.push_back(BuildStep(mirror_, spec_of(5, 0, {{&a, 128}})));
  Step refused = BuildStep(mirror_, spec_of(77, 1, {{&a, 127}}));
  refused.request.mutable_q()->set_shape(0, -1);
  steps.push_back(refused);
  steps.push_back(BuildStep(mirror_, spec_of(123456789012, 3, {{&a, 127}, {&b, 127}})));
  steps.push_back(BuildStep(mirror_, spec_of(3, 0, {{&b, 127}})));
  steps.push_back(BuildStep(mirror_, spec_of(8, 2, {{&a, 128}})));

  AttendStream stream(*stub_);
  for (const Step& step : steps) ASSERT_TRUE(stream.Write(step.request));
  for (size_t i = 0; i < steps.size(); ++i) {
    pb::AttendResponse response;
    ASSERT_TRUE(stream.Read(&response)) << "answer " << i << " missing";
    const std::string what =
        absl::StrCat("answer ", i, " (request ", steps[i].request.request_id(), ")");
    if (i == 4) {
      // Its request id: MessagesRefusedByTheParserEchoTheirRequestId.
      ExpectError(response, std::nullopt, grpc::StatusCode::INVALID_ARGUMENT, "q.shape", what);
    } else {
      ExpectAnswer(response, steps[i], what);
      Applied(steps[i]);
    }
  }
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(a, "session a");
  ExpectListed(b, "session b");
}

// ---- 8. Same-host regions (shared memory): the server on this host maps a
// region the test made, as a client would.

uint64_t RegisterRegion(pb::MlaOffload::Stub& stub, const SharedMemory& memory) {
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_SYSTEM_SHM);
  request.set_name(memory.name());
  request.set_byte_size(memory.bytes());
  pb::RegisterRegionResponse response;
  const grpc::Status status = Call(stub, &pb::MlaOffload::Stub::RegisterRegion, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.region_id();
}

void SetRegion(pb::RegionRef* ref, uint64_t id, int64_t offset, int64_t bytes) {
  ref->set_region_id(id);
  ref->set_offset(offset);
  ref->set_byte_size(bytes);
}

// A step whose tensors (but the top-k) lie in region `id` from offset `at`,
// copied there, and whose answer is written after them: out, the FP8
// output's scales (when asked), lse (when asked).
struct RegionStep {
  pb::AttendRequest request;
  int64_t out_at = 0;
  int64_t scales_at = 0;
  int64_t lse_at = 0;
  int64_t out_bytes = 0;
  int64_t scales_bytes = 0;
  int64_t lse_bytes = 0;
};

// Writes `bytes` at `at` into a region's memory.
using RegionWriter = std::function<void(int64_t at, const std::string& bytes)>;
// Reads `size` bytes at `at` of a region's memory.
using RegionReader = std::function<std::string(int64_t at, int64_t size)>;

RegionWriter WriterOf(SharedMemory& memory) {
  return [&memory](int64_t at, const std::string& bytes) {
    std::memcpy(memory.data() + at, bytes.data(), bytes.size());
  };
}

RegionReader ReaderOf(const SharedMemory& memory) {
  return [&memory](int64_t at, int64_t size) {
    return std::string(reinterpret_cast<const char*>(memory.data() + at), size);
  };
}

RegionStep IntoRegion(const Step& step, uint64_t id, const RegionWriter& write, int64_t at) {
  RegionStep moved;
  moved.request = step.request;
  pb::AttendRequest& request = moved.request;
  for (pb::Tensor* tensor : {request.mutable_q(), request.mutable_kv(),
                             request.mutable_compressed_kv()}) {
    if (tensor->data().empty()) continue;
    write(at, tensor->data());
    SetRegion(tensor->mutable_region(), id, at, tensor->data().size());
    at += tensor->data().size();
    tensor->clear_data();
  }
  if (!step.request.has_compressed_kv()) request.clear_compressed_kv();
  const int64_t values = static_cast<int64_t>(step.answers.size()) * step.heads;
  moved.out_at = at;
  moved.out_bytes = values * (request.fp8_output() ? kFp8RowBytes : kRowBytes);
  SetRegion(request.mutable_out_region(), id, moved.out_at, moved.out_bytes);
  at += moved.out_bytes;
  if (request.fp8_output()) {
    moved.scales_at = at;
    moved.scales_bytes = values * kFp8ScaleRowBytes;
    SetRegion(request.mutable_out_scales_region(), id, moved.scales_at, moved.scales_bytes);
    at += moved.scales_bytes;
  }
  if (request.return_lse()) {
    moved.lse_at = at;
    moved.lse_bytes = values * 4;
    SetRegion(request.mutable_lse_region(), id, moved.lse_at, moved.lse_bytes);
  }
  return moved;
}

// The response to a region step as if the answer had come inline: out (and
// the FP8 output's scales) and lse read from the region, for ExpectAnswer.
pb::AttendResponse AsInline(const pb::AttendResponse& response, const RegionStep& moved,
                            const RegionReader& bytes, const Step& step) {
  pb::AttendResponse inline_response = response;
  const int64_t tokens = static_cast<int64_t>(step.answers.size());
  const bool fp8 = moved.request.fp8_output();
  SetTensor(inline_response.mutable_out(), fp8 ? pb::DTYPE_E4M3FN : pb::DTYPE_BF16,
            {tokens, step.heads, kHeadDim}, bytes(moved.out_at, moved.out_bytes));
  if (fp8) {
    SetTensor(inline_response.mutable_out_scales(), pb::DTYPE_UE8M0,
              {tokens, step.heads, kOutputQuantBlocks}, bytes(moved.scales_at, moved.scales_bytes));
  }
  if (moved.lse_bytes > 0) {
    SetTensor(inline_response.mutable_lse(), pb::DTYPE_F32, {tokens, step.heads},
              bytes(moved.lse_at, moved.lse_bytes));
  }
  return inline_response;
}

// Steps of every layer kind with q, kv and compressed rows in a region and
// the answer written there give, bit for bit, the inline answers of a twin
// session fed the same rows (and both are the mirror's); the answers carry
// no tensors. A third of the steps ask for the FP8 output (its scales in a
// region of their own).
TEST_F(ServerE2eTest, SharedMemoryStepsAreBitIdenticalToInlineOnes) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  const ModelProfile& profile = **FindModelProfile(kPro);
  Seq plain, shared;
  ASSERT_NO_FATAL_FAILURE(Create(&plain, kPro, 16, 61));
  ASSERT_NO_FATAL_FAILURE(Create(&shared, kPro, 16, 61));
  ASSERT_NO_FATAL_FAILURE(Append(&plain, 254));
  ASSERT_NO_FATAL_FAILURE(Append(&shared, 254));
  SharedMemory memory(4 << 20);
  const uint64_t id = RegisterRegion(*stub_, memory);
  AttendStream stream(*stub_);
  uint64_t request_id = 1;
  for (int32_t p = 254; p < 258; ++p) {
    for (int layer : {0, 2, 60, 61}) {
      StepSpec spec;
      spec.layer = layer;
      spec.head_offset = 16;
      spec.lse = p % 2 == 0;
      spec.derotate = (p + layer) % 2 == 1;
      spec.fp8 = (p + layer) % 3 == 1;
      spec.topk_width = p == 254 ? profile.indexer_topk : 40;
      spec.request_id = request_id++;
      spec.segments = {{&plain, p}};
      const Step inline_step = BuildStep(mirror_, spec);
      spec.request_id = request_id++;
      spec.segments = {{&shared, p}};
      const Step region_step = BuildStep(mirror_, spec);
      const std::string what = absl::StrCat("layer ", layer, " position ", p);
      const pb::AttendResponse inline_response = stream.RoundTrip(inline_step.request);
      ExpectAnswer(inline_response, inline_step, what);
      const RegionStep moved = IntoRegion(region_step, id, WriterOf(memory), 0);
      const pb::AttendResponse response = stream.RoundTrip(moved.request);
      ASSERT_EQ(response.status().code(), 0) << what << ": " << response.status().message();
      EXPECT_FALSE(response.has_out() || response.has_lse() || response.has_out_scales())
          << what << ": tensors in the answer";
      EXPECT_EQ(std::memcmp(memory.data() + moved.out_at, inline_response.out().data().data(),
                            moved.out_bytes),
                0)
          << what << ": out differs from the inline answer";
      if (spec.fp8) {
        EXPECT_EQ(std::memcmp(memory.data() + moved.scales_at,
                              inline_response.out_scales().data().data(), moved.scales_bytes),
                  0)
            << what << ": the scales differ from the inline answer";
      }
      if (spec.lse) {
        EXPECT_EQ(std::memcmp(memory.data() + moved.lse_at, inline_response.lse().data().data(),
                              moved.lse_bytes),
                  0)
            << what << ": lse differs from the inline answer";
      }
      ExpectAnswer(AsInline(response, moved, ReaderOf(memory), region_step), region_step, what);
      Applied(inline_step);
      Applied(region_step);
    }
  }
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(plain, "the inline session");
  ExpectListed(shared, "the session stepped through the region");
}

// Each bad region reference is answered with its error naming the field,
// writes nothing into the answer's region and changes no session; the good
// step after them runs as if they had not been sent. The unary calls take
// no references.
TEST_F(ServerE2eTest, BadRegionReferencesFailAloneAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 71));
  constexpr int32_t kP = 131;  // the step at 131 brings C4A row 32
  ASSERT_NO_FATAL_FAILURE(Append(&seq, kP));
  const int64_t blocks = Info().kv_blocks_used();
  SharedMemory memory(1 << 20), theirs(1 << 20), dropped(1 << 20);
  const uint64_t id = RegisterRegion(*stub_, memory);
  // Another client: a connection of its own.
  std::unique_ptr<pb::MlaOffload::Stub> other = pb::MlaOffload::NewStub(NewChannel(*server_));
  const uint64_t foreign = RegisterRegion(*other, theirs);
  const uint64_t gone = RegisterRegion(*stub_, dropped);
  pb::UnregisterRegionRequest unregister;
  unregister.set_region_id(gone);
  pb::UnregisterRegionResponse unregistered;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::UnregisterRegion, unregister, &unregistered).ok());

  StepSpec spec;
  spec.request_id = 1;
  spec.layer = 2;  // C4A: compressed rows and a top-k
  spec.segments = {{&seq, kP}};
  spec.lse = true;
  const Step step = BuildStep(mirror_, spec);
  const RegionStep good = IntoRegion(step, id, WriterOf(memory), 0);
  spec.fp8 = true;
  const Step fp8_step = BuildStep(mirror_, spec);
  const RegionStep fp8 = IntoRegion(fp8_step, id, WriterOf(memory), 0);
  const int64_t size = memory.bytes();
  struct Bad {
    std::string what;
    grpc::StatusCode code;
    std::string field;
    std::function<void(pb::AttendRequest&)> change;
    const RegionStep* of = nullptr;  // the step it breaks; null: the bf16 one
  };
  using grpc::StatusCode;
  const std::vector<Bad> bad = {
      {"q past the region's end", StatusCode::INVALID_ARGUMENT, "AttendRequest.q.region: bytes",
       [&](pb::AttendRequest& r) { r.mutable_q()->mutable_region()->set_offset(size - 2); }},
      {"an unregistered region", StatusCode::NOT_FOUND,
       absl::StrCat("AttendRequest.q.region: region ", gone, " is not registered"),
       [&](pb::AttendRequest& r) { r.mutable_q()->mutable_region()->set_region_id(gone); }},
      {"another client's region", StatusCode::NOT_FOUND,
       absl::StrCat("AttendRequest.kv.region: region ", foreign, " is not registered"),
       [&](pb::AttendRequest& r) { r.mutable_kv()->mutable_region()->set_region_id(foreign); }},
      {"an out region too small for the answer", StatusCode::INVALID_ARGUMENT,
       "out_region.byte_size: the answer's out [T, H, 512] bf16 is 8192 bytes",
       [&](pb::AttendRequest& r) { r.mutable_out_region()->set_byte_size(good.out_bytes - 2); }},
      {"an out region past the region's end", StatusCode::INVALID_ARGUMENT,
       "AttendRequest.out_region: bytes",
       [&](pb::AttendRequest& r) { r.mutable_out_region()->set_offset(size - good.out_bytes / 2); }},
      {"a top-k in a region", StatusCode::INVALID_ARGUMENT, "AttendRequest.topk.region",
       [&](pb::AttendRequest& r) {
         SetRegion(r.mutable_topk()->mutable_region(), id, size - 4096, r.topk().data().size());
         r.mutable_topk()->clear_data();
       }},
      {"lse asked for without an lse region", StatusCode::INVALID_ARGUMENT,
       "return_lse needs an lse_region", [](pb::AttendRequest& r) { r.clear_lse_region(); }},
      {"q in data and in a region", StatusCode::INVALID_ARGUMENT,
       "AttendRequest.q: it carries both data and a region",
       [&](pb::AttendRequest& r) { r.mutable_q()->set_data(step.request.q().data()); }},
      {"a scales region without fp8_output", StatusCode::INVALID_ARGUMENT,
       "AttendRequest.out_scales_region: only with out_region and fp8_output",
       [&](pb::AttendRequest& r) { r.set_fp8_output(false); }, &fp8},
      {"fp8_output into out_region without a scales region", StatusCode::INVALID_ARGUMENT,
       "fp8_output needs an out_scales_region too",
       [&](pb::AttendRequest& r) { r.clear_out_scales_region(); }, &fp8},
      {"a bf16-sized out region for an FP8 answer", StatusCode::INVALID_ARGUMENT,
       "out_region.byte_size: the answer's out [T, H, 512] e4m3fn is 4096 bytes",
       [&](pb::AttendRequest& r) { r.mutable_out_region()->set_byte_size(2 * fp8.out_bytes); },
       &fp8},
      {"a scales region too small", StatusCode::INVALID_ARGUMENT,
       "out_scales_region.byte_size: the answer's out_scales [T, H, 4] UE8M0 is 32 bytes",
       [&](pb::AttendRequest& r) { r.mutable_out_scales_region()->set_byte_size(28); }, &fp8},
      {"a scales region at an offset not a multiple of 4", StatusCode::INVALID_ARGUMENT,
       "AttendRequest.out_scales_region.offset",
       [&](pb::AttendRequest& r) {
         r.mutable_out_scales_region()->set_offset(fp8.scales_at + 1);
       },
       &fp8},
      {"a scales region past the region's end", StatusCode::INVALID_ARGUMENT,
       "AttendRequest.out_scales_region: bytes",
       [&](pb::AttendRequest& r) {
         r.mutable_out_scales_region()->set_offset(std::numeric_limits<int64_t>::max() - 31);
       },
       &fp8},
  };
  const std::vector<uint8_t> before(memory.data(), memory.data() + size);
  AttendStream stream(*stub_);
  for (const Bad& b : bad) {
    pb::AttendRequest request = (b.of != nullptr ? *b.of : good).request;
    b.change(request);
    ExpectError(stream.RoundTrip(request), request.request_id(), b.code, b.field, b.what);
    EXPECT_EQ(std::memcmp(memory.data(), before.data(), size), 0) << b.what << " wrote the region";
  }
  EXPECT_EQ(Info().kv_blocks_used(), blocks);
  ExpectListed(seq, "after the bad references");

  const pb::AttendResponse response = stream.RoundTrip(good.request);
  ASSERT_EQ(response.status().code(), 0) << response.status().message();
  ExpectAnswer(AsInline(response, good, ReaderOf(memory), step), step, "the good step after them");
  Applied(step);
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(seq, "after the good step");

  Seq fresh;
  ASSERT_NO_FATAL_FAILURE(Create(&fresh, kFlash, 8, 72));
  pb::AppendKVRequest append = PromptRequest(fresh, 0, 1);
  SetRegion(append.mutable_layers(0)->mutable_swa_kv()->mutable_region(), id, 0, kRowBytes);
  append.mutable_layers(0)->mutable_swa_kv()->clear_data();
  pb::AppendKVResponse appended;
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::AppendKV, append, &appended),
               StatusCode::INVALID_ARGUMENT, "swa_kv.region: this tensor's bytes must travel inline",
               "AppendKV from a region");
  ExpectListed(fresh, "after the AppendKV from a region");
}

// Whether the process `pid` maps the shared-memory object `name`.
bool Maps(pid_t pid, const std::string& name) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(absl::StrCat("/dev/shm", name)) != std::string::npos) return true;
  }
  return false;
}

// A client that dies holding a region (SIGKILL: nothing unregistered) leaves
// none behind: once it has held no stream and no session for the grace
// period, the server unmaps the region.
TEST_F(ServerE2eTest, AClientThatDiesLeavesNoRegionBehind) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--region_grace_s=1"}));
  // Outside Bazel (the GPU host's run), MLA_OFFLOAD_REGION_HOLDER names it.
  const char* holder_override = std::getenv("MLA_OFFLOAD_REGION_HOLDER");
  absl::StatusOr<std::string> holder =
      holder_override != nullptr
          ? absl::StatusOr<std::string>(holder_override)
          : ::mla::client::RunfilePath("tests/integration/region_holder");
  ASSERT_TRUE(holder.ok()) << holder.status();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string name_file = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/region_name");
  std::vector<std::string> args = {*holder, server_->target(), name_file};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  std::string name;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (name.empty() && absl::Now() < give_up) {
    std::getline(std::ifstream(name_file), name);
    if (name.empty()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(name.empty()) << "the holder did not register a region; the server said:\n"
                             << server_->Output();
  EXPECT_TRUE(Maps(server_->pid(), name)) << "the server does not map " << name;
  absl::SleepFor(absl::Seconds(2));
  EXPECT_TRUE(Maps(server_->pid(), name)) << "a client holding a stream lost its region";
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Maps(server_->pid(), name) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(Maps(server_->pid(), name)) << "the dead client's region is still mapped";
  EXPECT_THAT(server_->Output(), HasSubstr("unregistered 1 region whose client held no stream"));
  shm_unlink(name.c_str());  // the client's to remove; it died
}

// A server without a GPU refuses CUDA IPC regions, saying what to use
// instead, and registers nothing.
TEST_F(ServerE2eTest, CudaIpcRegionsNeedAGpuServer) {
  if (ServerBackend() != "cpu") GTEST_SKIP() << "the server runs --backend=" << ServerBackend();
  ASSERT_NO_FATAL_FAILURE(StartServer());
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_CUDA_IPC);
  request.set_cuda_ipc_handle(std::string(64, '\1'));
  request.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
  request.set_byte_size(1 << 20);
  pb::RegisterRegionResponse response;
  ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::RegisterRegion, request, &response),
               grpc::StatusCode::UNIMPLEMENTED, "register host memory (REGION_KIND_SYSTEM_SHM)",
               "a CUDA IPC region on the CPU backend");
  pb::ListRegionsResponse listed;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::ListRegions, pb::ListRegionsRequest(), &listed).ok());
  EXPECT_EQ(listed.regions_size(), 0);
}

#ifdef MLA_HAVE_CUDA
// ---- 9. CUDA IPC regions (a GPU host, --backend=cuda): device memory of
// this test process, exported as a client would, that the server process
// opens; its kernels read the inputs there and write the answers there.

bool CudaIpcRun() {
  int devices = 0;
  return ServerBackend() == "cuda" && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

// Device memory of this process on GPU `device`, zero-filled.
class DeviceMemory {
 public:
  explicit DeviceMemory(int64_t bytes, int device = 0) : bytes_(bytes) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, 0, bytes), cudaSuccess);
  }
  ~DeviceMemory() { cudaFree(data_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  int64_t bytes() const { return bytes_; }
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  RegionWriter Writer() {
    return [this](int64_t at, const std::string& bytes) {
      EXPECT_EQ(cudaMemcpy(data() + at, bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
    };
  }
  RegionReader Reader() const {
    return [this](int64_t at, int64_t size) {
      std::string bytes(size, '\0');
      EXPECT_EQ(cudaMemcpy(bytes.data(), data() + at, size, cudaMemcpyDeviceToHost), cudaSuccess);
      return bytes;
    };
  }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

pb::RegisterRegionRequest CudaRegionRequest(const DeviceMemory& memory, int64_t bytes) {
  absl::StatusOr<client::CudaExport> exported = client::ExportCudaAllocation(memory.data());
  EXPECT_TRUE(exported.ok()) << exported.status();
  pb::RegisterRegionRequest request;
  request.set_kind(pb::REGION_KIND_CUDA_IPC);
  if (exported.ok()) {
    request.set_cuda_ipc_handle(exported->handle);
    request.set_device_uuid(exported->device_uuid);
  }
  request.set_byte_size(bytes);
  return request;
}

uint64_t RegisterDeviceRegion(pb::MlaOffload::Stub& stub, const DeviceMemory& memory,
                              int64_t bytes) {
  pb::RegisterRegionResponse response;
  const grpc::Status status = Call(stub, &pb::MlaOffload::Stub::RegisterRegion,
                                   CudaRegionRequest(memory, bytes), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.region_id();
}

// Steps of every layer kind with q, kv and compressed rows in device memory
// of another process and the answer written there give, bit for bit, the
// inline answers of a twin session fed the same rows: one message at a
// time (the kernels read and write the region) and many in flight on
// several sessions (launches that batch them copy on the device), where some
// launch must have batched more than one message.
TEST_F(ServerE2eTest, CudaIpcStepsAreBitIdenticalToInlineOnes) {
  if (!CudaIpcRun()) GTEST_SKIP() << "needs --backend=cuda and a GPU in this process";
  // Room for the twelve sessions' KV.
  ASSERT_NO_FATAL_FAILURE(StartServer({"--kv_cache_gb=12"}));
  const ModelProfile& profile = **FindModelProfile(kPro);
  constexpr int kPairs = 6;
  std::vector<Seq> plain(kPairs), device(kPairs);
  for (int i = 0; i < kPairs; ++i) {
    ASSERT_NO_FATAL_FAILURE(Create(&plain[i], kPro, 16, 81 + i));
    ASSERT_NO_FATAL_FAILURE(Create(&device[i], kPro, 16, 81 + i));
    ASSERT_NO_FATAL_FAILURE(Append(&plain[i], 254));
    ASSERT_NO_FATAL_FAILURE(Append(&device[i], 254));
  }
  constexpr int64_t kSlot = 1 << 20;  // one message's tensors and answer
  DeviceMemory memory(kPairs * kSlot);
  const uint64_t id = RegisterDeviceRegion(*stub_, memory, memory.bytes());
  pb::ListRegionsResponse listed;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::ListRegions, pb::ListRegionsRequest(), &listed).ok());
  ASSERT_EQ(listed.regions_size(), 1);
  EXPECT_EQ(listed.regions(0).kind(), pb::REGION_KIND_CUDA_IPC);
  EXPECT_THAT(listed.regions(0).device_uuid(), ::testing::StartsWith("GPU-"));
  AttendStream stream(*stub_);
  uint64_t request_id = 1;
  bool batched = false;
  for (int32_t p = 254; p < 258; ++p) {
    for (int layer : {0, 2, 60, 61}) {
      // At 254 and 256 one message at a time, at 255 and 257 all at once.
      const bool at_once = p % 2 == 1;
      const int pairs = kPairs;
      std::vector<Step> inline_steps, region_steps;
      std::vector<RegionStep> moved;
      for (int i = 0; i < pairs; ++i) {
        StepSpec spec;
        spec.layer = layer;
        spec.head_offset = 16;
        spec.lse = (p + i) % 2 == 0;
        spec.derotate = (p + layer) % 2 == 1;
        spec.topk_width = p == 254 ? profile.indexer_topk : 40;
        spec.request_id = request_id++;
        spec.segments = {{&plain[i], p}};
        inline_steps.push_back(BuildStep(mirror_, spec));
        spec.request_id = request_id++;
        spec.segments = {{&device[i], p}};
        region_steps.push_back(BuildStep(mirror_, spec));
        moved.push_back(IntoRegion(region_steps.back(), id, memory.Writer(), i * kSlot));
      }
      std::vector<pb::AttendResponse> inline_responses(pairs), responses(pairs);
      if (at_once) {
        for (int i = 0; i < pairs; ++i) ASSERT_TRUE(stream.Write(inline_steps[i].request));
        for (int i = 0; i < pairs; ++i) ASSERT_TRUE(stream.Write(moved[i].request));
        for (int i = 0; i < pairs; ++i) ASSERT_TRUE(stream.Read(&inline_responses[i]));
        for (int i = 0; i < pairs; ++i) ASSERT_TRUE(stream.Read(&responses[i]));
      } else {
        for (int i = 0; i < pairs; ++i) {
          inline_responses[i] = stream.RoundTrip(inline_steps[i].request);
          responses[i] = stream.RoundTrip(moved[i].request);
        }
      }
      for (int i = 0; i < pairs; ++i) {
        const std::string what = absl::StrCat("layer ", layer, " position ", p, " pair ", i);
        ExpectAnswer(inline_responses[i], inline_steps[i], what);
        const pb::AttendResponse& response = responses[i];
        ASSERT_EQ(response.status().code(), 0) << what << ": " << response.status().message();
        EXPECT_FALSE(response.has_out() || response.has_lse()) << what << ": tensors in the answer";
        batched |= at_once && response.timing().batch_tokens() > 1;
        const RegionReader read = memory.Reader();
        EXPECT_EQ(read(moved[i].out_at, moved[i].out_bytes), inline_responses[i].out().data())
            << what << ": out differs from the inline answer";
        if (moved[i].lse_bytes > 0) {
          EXPECT_EQ(read(moved[i].lse_at, moved[i].lse_bytes), inline_responses[i].lse().data())
              << what << ": lse differs from the inline answer";
        }
        ExpectAnswer(AsInline(response, moved[i], read, region_steps[i]), region_steps[i], what);
        Applied(inline_steps[i]);
        Applied(region_steps[i]);
      }
    }
  }
  EXPECT_TRUE(batched) << "no launch batched two messages from the region: the copies on the "
                          "device went untested";
  EXPECT_TRUE(stream.Close().ok());
  for (int i = 0; i < kPairs; ++i) {
    ExpectListed(plain[i], "an inline session");
    ExpectListed(device[i], "a session stepped through the CUDA IPC region");
  }
}

// Memory of another GPU of the host (the server runs on GPU 0): opened with
// peer access, read and written by the server's kernels over the link, the
// answers bit for bit those of a twin session inline. Needs two GPUs.
TEST_F(ServerE2eTest, CudaIpcRegionsOnAPeerGpuAreTheInlineAnswers) {
  if (!CudaIpcRun()) GTEST_SKIP() << "needs --backend=cuda and a GPU in this process";
  int devices = 0, reaches = 0;
  cudaGetDeviceCount(&devices);
  if (devices < 2) GTEST_SKIP() << "needs a second GPU";
  cudaDeviceCanAccessPeer(&reaches, 0, 1);
  if (!reaches) GTEST_SKIP() << "GPU 0 cannot reach GPU 1";
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Seq plain, peer;
  ASSERT_NO_FATAL_FAILURE(Create(&plain, kPro, 16, 97));
  ASSERT_NO_FATAL_FAILURE(Create(&peer, kPro, 16, 97));
  ASSERT_NO_FATAL_FAILURE(Append(&plain, 254));
  ASSERT_NO_FATAL_FAILURE(Append(&peer, 254));
  DeviceMemory memory(1 << 20, /*device=*/1);
  const uint64_t id = RegisterDeviceRegion(*stub_, memory, memory.bytes());
  AttendStream stream(*stub_);
  uint64_t request_id = 1;
  for (int layer : {0, 2, 61}) {
    StepSpec spec;
    spec.layer = layer;
    spec.lse = true;
    spec.request_id = request_id++;
    spec.segments = {{&plain, 254}};
    const Step inline_step = BuildStep(mirror_, spec);
    spec.request_id = request_id++;
    spec.segments = {{&peer, 254}};
    const Step region_step = BuildStep(mirror_, spec);
    const std::string what = absl::StrCat("layer ", layer);
    const pb::AttendResponse inline_response = stream.RoundTrip(inline_step.request);
    ExpectAnswer(inline_response, inline_step, what);
    const RegionStep moved = IntoRegion(region_step, id, memory.Writer(), 0);
    const pb::AttendResponse response = stream.RoundTrip(moved.request);
    ASSERT_EQ(response.status().code(), 0) << what << ": " << response.status().message();
    const RegionReader read = memory.Reader();
    EXPECT_EQ(read(moved.out_at, moved.out_bytes), inline_response.out().data()) << what;
    EXPECT_EQ(read(moved.lse_at, moved.lse_bytes), inline_response.lse().data()) << what;
    Applied(inline_step);
    Applied(region_step);
  }
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(peer, "the session stepped through the peer GPU's memory");
}

// Each bad registration and reference of a CUDA IPC region gets its error
// naming the field and changes nothing: no region, nothing written, no
// session moved; a region unregistered while its step runs still serves
// that step, and later references to it are NOT_FOUND.
TEST_F(ServerE2eTest, BadCudaIpcRegionsFailAndChangeNothing) {
  if (!CudaIpcRun()) GTEST_SKIP() << "needs --backend=cuda and a GPU in this process";
  ASSERT_NO_FATAL_FAILURE(StartServer());
  DeviceMemory memory(1 << 20);
  using grpc::StatusCode;
  struct BadRegistration {
    std::string what;
    StatusCode code;
    std::string field;
    std::function<void(pb::RegisterRegionRequest&)> change;
  };
  const std::vector<BadRegistration> bad_registrations = {
      {"a size past the allocation", StatusCode::INVALID_ARGUMENT,
       "bytes of the allocation the handle exports",
       [&](pb::RegisterRegionRequest& r) { r.set_byte_size(memory.bytes() + 1); }},
      {"a short handle", StatusCode::INVALID_ARGUMENT, "cuda_ipc_handle: 63 bytes",
       [](pb::RegisterRegionRequest& r) { r.mutable_cuda_ipc_handle()->resize(63); }},
      {"a handle of nothing", StatusCode::INVALID_ARGUMENT, "cuda_ipc_handle: the driver cannot open",
       [](pb::RegisterRegionRequest& r) { r.set_cuda_ipc_handle(std::string(64, '\x5a')); }},
      {"a GPU of no host", StatusCode::NOT_FOUND, "is no GPU of this host",
       [](pb::RegisterRegionRequest& r) {
         r.set_device_uuid("GPU-00000000-0000-0000-0000-000000000000");
       }},
      {"no size", StatusCode::INVALID_ARGUMENT, "byte_size is 0",
       [](pb::RegisterRegionRequest& r) { r.set_byte_size(0); }},
  };
  for (const BadRegistration& b : bad_registrations) {
    pb::RegisterRegionRequest request = CudaRegionRequest(memory, memory.bytes());
    b.change(request);
    pb::RegisterRegionResponse response;
    ExpectStatus(Call(*stub_, &pb::MlaOffload::Stub::RegisterRegion, request, &response), b.code,
                 b.field, b.what);
  }
  // The client library's own checks: a pointer inside its allocation (the
  // server would map the allocation from its start) and a size past it.
  absl::StatusOr<std::unique_ptr<client::Client>> library = client::Client::Connect(server_->target());
  ASSERT_TRUE(library.ok()) << library.status();
  for (const auto& [what, at, bytes, field] :
       std::vector<std::tuple<std::string, int64_t, int64_t, std::string>>{
           {"a pointer inside the allocation", 256, 1024, "256 bytes into its allocation"},
           {"a size past the allocation", 0, memory.bytes() + 1, "more than the allocation's"}}) {
    absl::StatusOr<std::unique_ptr<client::CudaRegion>> region =
        client::CudaRegion::Register(**library, memory.data() + at, bytes);
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(std::string(region.status().message()), HasSubstr(field)) << what;
  }
  pb::ListRegionsResponse listed;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::ListRegions, pb::ListRegionsRequest(), &listed).ok());
  EXPECT_EQ(listed.regions_size(), 0) << "a refused registration left a region";

  Seq seq;
  ASSERT_NO_FATAL_FAILURE(Create(&seq, kFlash, 8, 91));
  constexpr int32_t kP = 131;
  ASSERT_NO_FATAL_FAILURE(Append(&seq, kP));
  const int64_t blocks = Info().kv_blocks_used();
  // Registered shorter than the allocation: a reference past byte_size is
  // refused although the memory exists.
  const int64_t size = memory.bytes() / 2;
  const uint64_t id = RegisterDeviceRegion(*stub_, memory, size);
  StepSpec spec;
  spec.request_id = 1;
  spec.layer = 2;
  spec.segments = {{&seq, kP}};
  spec.lse = true;
  const Step step = BuildStep(mirror_, spec);
  const RegionStep good = IntoRegion(step, id, memory.Writer(), 0);
  struct Bad {
    std::string what;
    std::string field;
    std::function<void(pb::AttendRequest&)> change;
  };
  const std::vector<Bad> bad = {
      {"q past the registered size", "AttendRequest.q.region: bytes",
       [&](pb::AttendRequest& r) { r.mutable_q()->mutable_region()->set_offset(size - 1024); }},
      {"kv at an offset not a multiple of 16", "AttendRequest.kv.region.offset",
       [&](pb::AttendRequest& r) {
         r.mutable_kv()->mutable_region()->set_offset(r.kv().region().offset() + 8);
       }},
      {"out at an offset not a multiple of 16", "AttendRequest.out_region.offset",
       [&](pb::AttendRequest& r) { r.mutable_out_region()->set_offset(good.out_at + 2); }},
      {"an out region too small for the answer", "out_region.byte_size",
       [&](pb::AttendRequest& r) { r.mutable_out_region()->set_byte_size(good.out_bytes - 16); }},
  };
  const std::string before = memory.Reader()(0, memory.bytes());
  AttendStream stream(*stub_);
  for (const Bad& b : bad) {
    pb::AttendRequest request = good.request;
    b.change(request);
    ExpectError(stream.RoundTrip(request), request.request_id(), StatusCode::INVALID_ARGUMENT,
                b.field, b.what);
    EXPECT_EQ(memory.Reader()(0, memory.bytes()), before) << b.what << " wrote the region";
  }
  EXPECT_EQ(Info().kv_blocks_used(), blocks);
  ExpectListed(seq, "after the bad references");

  // Unregistered right after the step is sent: the step still runs there.
  ASSERT_TRUE(stream.Write(good.request));
  pb::UnregisterRegionRequest unregister;
  unregister.set_region_id(id);
  pb::UnregisterRegionResponse unregistered;
  ASSERT_TRUE(Call(*stub_, &pb::MlaOffload::Stub::UnregisterRegion, unregister, &unregistered).ok());
  pb::AttendResponse response;
  ASSERT_TRUE(stream.Read(&response));
  ASSERT_EQ(response.status().code(), 0) << response.status().message();
  ExpectAnswer(AsInline(response, good, memory.Reader(), step), step, "the step whose region went");
  Applied(step);
  pb::AttendRequest later = good.request;
  later.set_request_id(2);
  ExpectError(stream.RoundTrip(later), 2, StatusCode::NOT_FOUND,
              absl::StrCat("region ", id, " is not registered"), "a reference after the unregister");
  EXPECT_TRUE(stream.Close().ok());
  ExpectListed(seq, "after the step");
}
#endif  // MLA_HAVE_CUDA

}  // namespace
}  // namespace mla
