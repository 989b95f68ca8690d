// The client library against the real mla_offload_server process over
// loopback (started by client/test_processes.h): connecting, server info and
// health, the session lifecycle, AppendKV, pipelined Attend with answers in
// order and bit-identical to kernels::CpuBackend run here on the same rows,
// deadlines, how errors reach the caller, Echo, and a Cluster of two real
// servers of which one is lost.
//
// Answers are checked on the sliding-window layers 0 and 1 of
// deepseek-v4-flash: the test inserts every row it sends into its own cache
// pool through CpuBackend and decodes each token over the window of spec
// section 1 (positions max(0, p-127)..p, ascending), with the session's
// sinks of the rank's heads.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/host_region.h"
#include "client/mla_client.h"
#include "client/test_processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/bf16.h"
#include "kernels/cache_format.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "kernels/rope.h"
#include "proto/mla_offload.grpc.pb.h"
#include "tests/support/test_rows.h"

namespace mla::client {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr char kFlash[] = "deepseek-v4-flash";
constexpr int kHeads = 8;
constexpr int kMaxPosition = 8192;  // TestServer's --max_position

uint64_t Seed(uint64_t salt, int kind, int layer, int64_t index) {
  return salt * 1000003ull + static_cast<uint64_t>(kind) * 7919ull +
         static_cast<uint64_t>(layer) * 104729ull + static_cast<uint64_t>(index) * 15485863ull;
}

// One sequence of the test: what it sends, as pure functions of its salt.
struct Sequence {
  const ModelProfile* profile = nullptr;
  uint64_t salt = 0;
  std::vector<float> sinks;  // [layers, h_total]
  std::string id;
  int padded = 0;

  std::vector<uint16_t> SwaRow(int layer, int32_t position) const {
    return TestRows(Seed(salt, 0, layer, position), 1);
  }
  std::vector<uint16_t> CompressedRow(int layer, int32_t row) const {
    return TestRows(Seed(salt, 1, layer, row), 1);
  }
  std::vector<uint16_t> Query(int layer, int32_t position) const {
    return TestRows(Seed(salt, 2, layer, position), kHeads);
  }
};

Sequence MakeSequence(uint64_t salt) {
  Sequence seq;
  seq.profile = *FindModelProfile(kFlash);
  seq.salt = salt;
  std::mt19937_64 rng(salt);
  std::uniform_real_distribution<float> uniform(2.0f, 7.0f);
  seq.sinks.resize(static_cast<size_t>(seq.profile->num_attention_layers()) *
                   seq.profile->num_query_heads);
  for (float& sink : seq.sinks) sink = uniform(rng);
  return seq;
}

SessionOptions SessionOf(const Sequence& seq) {
  SessionOptions options;
  options.model = kFlash;
  options.num_heads = kHeads;
  options.sinks = seq.sinks;
  options.sinks_shape = {seq.profile->num_attention_layers(), seq.profile->num_query_heads};
  return options;
}

// The rows of positions [first, first + count) of every layer, and the
// LayerRowsInput views of them (valid while this lives).
struct Prompt {
  std::vector<std::vector<uint16_t>> swa, compressed;
  std::vector<LayerRowsInput> layers;
};

Prompt MakePrompt(const Sequence& seq, int32_t first, int32_t count) {
  Prompt prompt;
  const int layers = seq.profile->num_attention_layers();
  prompt.swa.resize(layers);
  prompt.compressed.resize(layers);
  for (int layer = 0; layer < layers; ++layer) {
    for (int32_t p = first; p < first + count; ++p) {
      const std::vector<uint16_t> row = seq.SwaRow(layer, p);
      prompt.swa[layer].insert(prompt.swa[layer].end(), row.begin(), row.end());
    }
    const int ratio = seq.profile->compress_ratio(layer);
    LayerRowsInput rows;
    rows.layer = layer;
    if (ratio != 0) {
      rows.first_compressed_row = first / ratio;
      for (int32_t j = first / ratio; j < (first + count) / ratio; ++j) {
        const std::vector<uint16_t> row = seq.CompressedRow(layer, j);
        prompt.compressed[layer].insert(prompt.compressed[layer].end(), row.begin(), row.end());
      }
    }
    prompt.layers.push_back(rows);
  }
  for (int layer = 0; layer < layers; ++layer) {
    prompt.layers[layer].swa_kv = prompt.swa[layer];
    prompt.layers[layer].compressed_kv = prompt.compressed[layer];
  }
  return prompt;
}

// An FP8 answer of one token: e4m3 [kHeads, 512] and scales [kHeads, 4].
struct Fp8Answer {
  std::vector<uint8_t> e4m3;
  std::vector<uint8_t> scales;
};

// CpuBackend on the test's own copy of the SWA rows of layers 0 and 1 of one
// sequence: slot = layer * 256 + position.
class SwaMirror {
 public:
  explicit SwaMirror(const Sequence& seq)
      : seq_(seq),
        backend_(2),
        pool_(static_cast<size_t>(kBlocks) * kBlockBytes, 0),
        plain_(RopeKind::kPlain, kMaxPosition),
        yarn_(RopeKind::kYarn, kMaxPosition) {}

  // Inserts the SWA rows of positions [0, end) of `layer`.
  void Insert(int layer, int32_t end) {
    std::vector<uint16_t> rows;
    std::vector<int32_t> positions, slots;
    for (int32_t p = 0; p < end; ++p) {
      const std::vector<uint16_t> row = seq_.SwaRow(layer, p);
      rows.insert(rows.end(), row.begin(), row.end());
      positions.push_back(p);
      slots.push_back(layer * kSlotsPerLayer + p);
    }
    PrologueParams insert;
    insert.num_heads = kHeads;
    insert.padded_heads = kHeads;
    insert.rope = View(layer);
    insert.swa = {end, rows.data(), positions.data(), slots.data(), {pool_.data(), kBlocks}};
    const absl::Status status = backend_.Prologue(insert);
    ASSERT_TRUE(status.ok()) << status;
  }

  // out [kHeads, 512] and lse [kHeads] of the token at `position` of
  // `layer`; with `fp8`, the FP8 output into it instead of out.
  void Decode(int layer, int32_t position, bool derotate, std::vector<uint16_t>* out,
              std::vector<float>* lse, Fp8Answer* fp8 = nullptr) {
    const std::vector<uint16_t> q = seq_.Query(layer, position);
    std::vector<uint16_t> q_out(static_cast<size_t>(seq_.padded) * kHeadDim);
    PrologueParams prologue;
    prologue.num_tokens = 1;
    prologue.num_heads = kHeads;
    prologue.padded_heads = seq_.padded;
    prologue.q = q.data();
    prologue.positions = &position;
    prologue.q_out = q_out.data();
    prologue.rms_norm_eps = seq_.profile->rms_norm_eps;
    prologue.rope = View(layer);
    ASSERT_TRUE(backend_.Prologue(prologue).ok());

    std::vector<int32_t> indices(kSwaWindow, -1);
    const int32_t first = std::max(0, position - kSwaWindow + 1);
    for (int32_t w = first; w <= position; ++w) indices[w - first] = layer * kSlotsPerLayer + w;
    const int32_t length = position - first + 1;
    std::vector<float> sinks(seq_.sinks.begin() + layer * seq_.profile->num_query_heads,
                             seq_.sinks.begin() + layer * seq_.profile->num_query_heads + kHeads);
    lse->assign(kHeads, 0.0f);
    const CachePoolView pool{pool_.data(), kBlocks};
    DecodeParams decode;
    decode.num_tokens = 1;
    decode.num_heads = kHeads;
    decode.padded_heads = seq_.padded;
    decode.q = q_out.data();
    decode.softmax_scale = seq_.profile->softmax_scale;
    decode.sinks = sinks.data();
    decode.main = {kSwaWindow, indices.data(), &length, pool};
    decode.extra = {0, nullptr, nullptr, pool};
    decode.derotate = derotate;
    decode.positions = &position;
    decode.rope = View(layer);
    if (fp8 != nullptr) {
      fp8->e4m3.assign(static_cast<size_t>(kHeads) * kHeadDim, 0);
      fp8->scales.assign(static_cast<size_t>(kHeads) * kOutputBlocks, 0);
      decode.out_e4m3 = fp8->e4m3.data();
      decode.out_scales = fp8->scales.data();
    } else {
      out->assign(static_cast<size_t>(kHeads) * kHeadDim, 0);
      decode.out = out->data();
    }
    decode.lse = lse->data();
    const absl::Status status = backend_.Decode(decode);
    ASSERT_TRUE(status.ok()) << status;
  }

 private:
  static constexpr int64_t kBlocks = 8;
  static constexpr int32_t kSlotsPerLayer = 256;

  RopeTableView View(int layer) const {
    const RopeTable& table = seq_.profile->rope_kind(layer) == RopeKind::kYarn ? yarn_ : plain_;
    return {table.data(), table.num_positions()};
  }

  const Sequence& seq_;
  CpuBackend backend_;
  std::vector<uint8_t> pool_;
  const RopeTable plain_;
  const RopeTable yarn_;
};

// One layer step of `seq` and what it must return.
struct Step {
  int layer = 0;
  int32_t position = 0;
  int32_t tokens = 1;
  bool lse = false;
  bool derotate = false;
  std::shared_ptr<std::vector<uint16_t>> q, kv;
};

Step MakeStep(const Sequence& seq, int layer, int32_t position, int32_t tokens, bool lse,
              bool derotate) {
  Step step{layer, position, tokens, lse, derotate,
            std::make_shared<std::vector<uint16_t>>(), std::make_shared<std::vector<uint16_t>>()};
  for (int32_t p = position; p < position + tokens; ++p) {
    const std::vector<uint16_t> q = seq.Query(layer, p);
    step.q->insert(step.q->end(), q.begin(), q.end());
    const std::vector<uint16_t> kv = seq.SwaRow(layer, p);
    step.kv->insert(step.kv->end(), kv.begin(), kv.end());
  }
  return step;
}

AttendInput InputOf(const Sequence& seq, const Step& step) {
  AttendInput input;
  input.layer = step.layer;
  input.segments = {{seq.id, step.position, step.tokens, 0, 0}};
  input.q = *step.q;
  input.kv = *step.kv;
  input.return_lse = step.lse;
  input.derotate_output = step.derotate;
  return input;
}

// `result` answers `step`: the mirror's bits for every token.
void ExpectAnswer(const AttendResult& result, const Step& step, SwaMirror& mirror,
                  const std::string& what) {
  ASSERT_EQ(result.num_tokens(), step.tokens) << what;
  ASSERT_EQ(result.num_heads(), kHeads) << what;
  const absl::Span<const uint16_t> out = result.out();
  ASSERT_EQ(out.size(), static_cast<size_t>(step.tokens) * kHeads * kHeadDim) << what;
  EXPECT_EQ(result.has_lse(), step.lse) << what;
  // The pieces hold the same bytes as the span.
  std::vector<uint16_t> copied(out.size());
  result.out_view().CopyTo(copied.data());
  EXPECT_TRUE(std::equal(copied.begin(), copied.end(), out.begin())) << what;
  for (int32_t t = 0; t < step.tokens; ++t) {
    std::vector<uint16_t> expected_out;
    std::vector<float> expected_lse;
    mirror.Decode(step.layer, step.position + t, step.derotate, &expected_out, &expected_lse);
    int mismatches = 0;
    for (int64_t i = 0; i < kHeads * kHeadDim; ++i) {
      mismatches += out[t * kHeads * kHeadDim + i] != expected_out[i];
    }
    EXPECT_EQ(mismatches, 0) << what << ", token " << t
                             << ": out differs from CpuBackend on the same rows";
    if (step.lse) {
      ASSERT_EQ(result.lse().size(), static_cast<size_t>(step.tokens) * kHeads) << what;
      EXPECT_EQ(std::memcmp(result.lse().data() + t * kHeads, expected_lse.data(), kHeads * 4), 0)
          << what << ", token " << t << ": lse differs from CpuBackend's";
    } else {
      EXPECT_TRUE(result.lse().empty()) << what;
    }
  }
  EXPECT_GE(result.timing().batch_tokens, step.tokens) << what;
  EXPECT_GT(result.timing().total_us, 0) << what;
}

// A loopback port with nothing listening.
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

class ClientTest : public ::testing::Test {
 protected:
  void StartServer(const std::vector<std::string>& flags = {}) {
    absl::StatusOr<std::unique_ptr<TestServer>> server = TestServer::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ConnectOptions options;
    options.connect_timeout = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server_->target(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // A server that holds every Attend message `batch_wait_us` for a batch: a
  // pacer stream that has sent one message (to no session) stays active for
  // --active_stream_ms, so every other stream's batch waits the whole
  // --batch_wait_us for the pacer's next message (a lone stream's batch
  // would not wait).
  void StartSlowServer(int batch_wait_us) {
    ASSERT_NO_FATAL_FAILURE(StartServer(
        {absl::StrCat("--batch_wait_us=", batch_wait_us), "--active_stream_ms=3600000"}));
    absl::StatusOr<std::unique_ptr<AttendStream>> pacer = client_->OpenAttendStream();
    ASSERT_TRUE(pacer.ok()) << pacer.status();
    pacer_ = *std::move(pacer);
    Sequence nobody = MakeSequence(1);
    nobody.id = "no such session";
    ASSERT_TRUE(pacer_->Send(InputOf(nobody, MakeStep(nobody, 0, 0, 1, false, false))).ok());
    EXPECT_EQ(pacer_->Receive().status().code(), absl::StatusCode::kNotFound);
  }

  void TearDown() override {
    pacer_.reset();
    client_.reset();
    server_.reset();
  }

  // Creates `seq`'s session and appends positions [0, count).
  void CreateAndAppend(Sequence* seq, int32_t count) {
    absl::StatusOr<pb::CreateSessionResponse> created = client_->CreateSession(SessionOf(*seq));
    ASSERT_TRUE(created.ok()) << created.status();
    seq->id = created->session_id();
    seq->padded = created->padded_heads();
    const Prompt prompt = MakePrompt(*seq, 0, count);
    absl::StatusOr<pb::AppendKVResponse> appended =
        client_->AppendKV(seq->id, 0, count, prompt.layers);
    ASSERT_TRUE(appended.ok()) << appended.status();
    EXPECT_EQ(appended->next_position(), count);
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<AttendStream> pacer_;  // StartSlowServer's
};

TEST_F(ClientTest, ConnectsAndReadsServerInfoAndHealth) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  absl::StatusOr<pb::ServerInfo> info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_THAT(info->version(), HasSubstr("mla-offload"));
  EXPECT_THAT(info->backend(), HasSubstr("cpu"));
  EXPECT_EQ(info->kv_blocks_total(), static_cast<int64_t>(0.05e9 / kBlockBytes));
  EXPECT_EQ(info->max_position(), kMaxPosition);
  EXPECT_EQ(info->sessions(), 0);
  std::set<std::string> models;
  for (const pb::ModelInfo& model : info->models()) models.insert(model.name());
  EXPECT_EQ(models, (std::set<std::string>{"deepseek-v4-flash", "deepseek-v4-pro"}));

  absl::StatusOr<HealthStatus> health = client_->CheckHealth();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kServing);
  absl::StatusOr<HealthStatus> unknown = client_->CheckHealth("no.such.Service");
  // The default health service answers NOT_FOUND for a service it does not know.
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
}

// Sockets this process holds (each gRPC connection is one).
int OpenSockets() {
  int count = 0;
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  while (dirent* entry = readdir(fds)) {
    char target[256];
    const ssize_t length = readlink(absl::StrCat("/proc/self/fd/", entry->d_name).c_str(), target,
                                    sizeof(target) - 1);
    if (length > 0 && absl::string_view(target, length).substr(0, 7) == "socket:") ++count;
  }
  closedir(fds);
  return count;
}

// Clients of one target share a connection unless own_connection is set.
TEST_F(ClientTest, OwnConnectionOpensASeparateConnection) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ASSERT_TRUE(client_->GetServerInfo().ok());
  const int before = OpenSockets();
  ASSERT_GT(before, 0);
  ConnectOptions shared;
  shared.connect_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<Client>> a = Client::Connect(server_->target(), shared);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE((*a)->GetServerInfo().ok());
  EXPECT_EQ(OpenSockets(), before) << "a second Client with the same options shares the connection";
  ConnectOptions own = shared;
  own.own_connection = true;
  absl::StatusOr<std::unique_ptr<Client>> b = Client::Connect(server_->target(), own);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(server_->target(), own);
  ASSERT_TRUE(b.ok() && c.ok());
  ASSERT_TRUE((*b)->GetServerInfo().ok());
  ASSERT_TRUE((*c)->GetServerInfo().ok());
  EXPECT_EQ(OpenSockets(), before + 2) << "own_connection: one connection each";
}

TEST_F(ClientTest, UnreachableServerIsUnavailableNamingTheTarget) {
  const std::string target = absl::StrCat("127.0.0.1:", UnusedPort());
  ConnectOptions waiting;
  waiting.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<Client>> refused = Client::Connect(target, waiting);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("cannot connect to ", target)));

  absl::StatusOr<std::unique_ptr<Client>> lazy = Client::Connect(target);
  ASSERT_TRUE(lazy.ok()) << lazy.status();
  absl::StatusOr<pb::ServerInfo> info = (*lazy)->GetServerInfo();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(info.status().message(), HasSubstr(absl::StrCat("GetServerInfo on ", target)));
}

TEST_F(ClientTest, BadConnectOptionsAreRefused) {
  ConnectOptions half_key;
  half_key.use_tls = true;
  half_key.tls_client_cert_pem = "-----BEGIN CERTIFICATE-----";
  EXPECT_EQ(Client::Connect("127.0.0.1:1", half_key).status().code(),
            absl::StatusCode::kInvalidArgument);
  ConnectOptions certs_without_tls;
  certs_without_tls.tls_root_certs_pem = "-----BEGIN CERTIFICATE-----";
  EXPECT_THAT(Client::Connect("127.0.0.1:1", certs_without_tls).status().message(),
              HasSubstr("use_tls"));
  ConnectOptions name_without_tls;
  name_without_tls.tls_server_name = "mla.example";
  absl::Status ignored_name = Client::Connect("127.0.0.1:1", name_without_tls).status();
  EXPECT_EQ(ignored_name.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ignored_name.message(), HasSubstr("tls_server_name"));
  EXPECT_EQ(Client::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, SessionLifecycle) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Sequence seq = MakeSequence(11);
  absl::StatusOr<pb::CreateSessionResponse> created = client_->CreateSession(SessionOf(seq));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_THAT(created->session_id(), MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(created->num_heads(), kHeads);
  EXPECT_EQ(created->padded_heads(), 8);
  seq.id = created->session_id();

  absl::StatusOr<std::vector<pb::SessionInfo>> listed = client_->ListSessions();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].session_id(), seq.id);
  EXPECT_EQ((*listed)[0].model(), kFlash);
  EXPECT_EQ((*listed)[0].next_position(), 0);

  // Two AppendKV calls continue each other; the second starts mid-row of
  // the C4A layers' compression.
  const Prompt first = MakePrompt(seq, 0, 130);
  absl::StatusOr<pb::AppendKVResponse> appended = client_->AppendKV(seq.id, 0, 130, first.layers);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->next_position(), 130);
  const Prompt second = MakePrompt(seq, 130, 70);
  appended = client_->AppendKV(seq.id, 130, 70, second.layers);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->next_position(), 200);
  const int64_t blocks = appended->kv_blocks_used();
  EXPECT_GT(blocks, 0);

  listed = client_->ListSessions();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].next_position(), 200);
  EXPECT_EQ((*listed)[0].kv_blocks(), blocks);
  EXPECT_EQ(client_->GetServerInfo()->kv_blocks_used(), blocks);

  absl::StatusOr<int64_t> freed = client_->CloseSession(seq.id);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, blocks);
  EXPECT_TRUE(client_->ListSessions()->empty());
  absl::StatusOr<int64_t> again = client_->CloseSession(seq.id);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(again.status().message(), HasSubstr("CloseSession on " + server_->target()));
  EXPECT_THAT(again.status().message(), HasSubstr(seq.id));
}

// A negative idle TTL is refused before anything is sent; one beyond the
// wire's int32 seconds (InfiniteDuration) asks for the longest there is,
// and gets the server's cap.
TEST_F(ClientTest, IdleTtlIsCheckedAndLongOnesAreTheLongest) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  // The options view the sequence's sinks: it lives as long as they are used.
  const Sequence first = MakeSequence(12);
  SessionOptions negative = SessionOf(first);
  negative.idle_ttl = absl::Seconds(-1);
  absl::Status refused = client_->CreateSession(negative).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("SessionOptions.idle_ttl"));
  EXPECT_TRUE(client_->ListSessions()->empty());

  for (absl::Duration ttl : {absl::InfiniteDuration(), absl::Hours(24 * 365 * 100),
                             absl::Milliseconds(1500)}) {
    const Sequence seq = MakeSequence(13);
    SessionOptions options = SessionOf(seq);
    options.idle_ttl = ttl;
    absl::StatusOr<pb::CreateSessionResponse> created = client_->CreateSession(options);
    ASSERT_TRUE(created.ok()) << absl::FormatDuration(ttl) << ": " << created.status();
    // The server's cap (--max_session_idle_ttl_s, 3600 by default) bounds
    // what a session gets; 1.5 s is asked as 2.
    EXPECT_EQ(created->idle_ttl_seconds(), ttl < absl::Seconds(2) ? 2 : 3600)
        << absl::FormatDuration(ttl);
    EXPECT_TRUE(client_->CloseSession(created->session_id()).ok());
  }
}

// Codes and the server's messages reach the caller as absl::Status; a refused
// Attend message fails alone and the stream goes on.
TEST_F(ClientTest, ErrorsCarryTheServersCodeAndMessage) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  SessionOptions bad_model;
  bad_model.model = "no-such-model";
  bad_model.num_heads = kHeads;
  absl::StatusOr<pb::CreateSessionResponse> refused = client_->CreateSession(bad_model);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("no-such-model"));

  const Sequence one = MakeSequence(1);
  SessionOptions bad_sinks = SessionOf(one);
  const int64_t values = static_cast<int64_t>(bad_sinks.sinks.size());
  // Shapes whose product is wrong, negative, or overflows int64 to the size.
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{3, 3}, {-1, -values}, {values, 1, 1},
                                          {int64_t{1} << 62, 4 + values}}) {
    bad_sinks.sinks_shape = shape;
    EXPECT_THAT(client_->CreateSession(bad_sinks).status().message(), HasSubstr("sinks_shape"))
        << shape[0] << " x " << shape[1];
  }

  Sequence seq = MakeSequence(21);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 20));
  const Prompt late = MakePrompt(seq, 25, 5);
  absl::StatusOr<pb::AppendKVResponse> gap = client_->AppendKV(seq.id, 25, 5, late.layers);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition) << gap.status();
  EXPECT_THAT(gap.status().message(), HasSubstr("AppendKV on " + server_->target()));
  const Prompt next = MakePrompt(seq, 20, 5);
  const std::string unknown = std::string(32, 'a');
  absl::StatusOr<pb::AppendKVResponse> nobody = client_->AppendKV(unknown, 20, 5, next.layers);
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kNotFound) << nobody.status();
  EXPECT_THAT(nobody.status().message(), HasSubstr(unknown));

  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  Sequence ghost = seq;
  ghost.id = unknown;
  const Step step = MakeStep(seq, 0, 20, 1, true, false);
  absl::StatusOr<uint64_t> id = (*stream)->Send(InputOf(ghost, step));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 1u);
  absl::StatusOr<AttendResult> not_found = (*stream)->Receive();
  EXPECT_EQ(not_found.status().code(), absl::StatusCode::kNotFound) << not_found.status();
  EXPECT_THAT(not_found.status().message(), HasSubstr("Attend request 1: "));
  EXPECT_THAT(not_found.status().message(), HasSubstr(unknown));
  EXPECT_TRUE((*stream)->status().ok()) << "a refused message must not end the stream";

  AttendInput wrong_position = InputOf(seq, step);
  wrong_position.segments[0].position = 30;
  ASSERT_TRUE((*stream)->Send(wrong_position).ok());
  absl::StatusOr<AttendResult> out_of_order = (*stream)->Receive();
  EXPECT_EQ(out_of_order.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(out_of_order.status().message(), HasSubstr("Attend request 2: "));

  // Checked here, before anything is sent: no request id is used up.
  AttendInput ragged = InputOf(seq, step);
  ragged.q = ragged.q.subspan(1);
  absl::StatusOr<uint64_t> not_sent = (*stream)->Send(ragged);
  EXPECT_EQ(not_sent.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_sent.status().message(), HasSubstr("AttendInput.q"));
  EXPECT_EQ((*stream)->outstanding(), 0);
  AttendInput empty = InputOf(seq, step);
  empty.segments.clear();
  EXPECT_THAT((*stream)->Send(empty).status().message(), HasSubstr("no tokens"));

  // The good message after them is served, with the next id.
  SwaMirror mirror(seq);
  mirror.Insert(0, 21);
  id = (*stream)->Send(InputOf(seq, step));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(*id, 3u);
  absl::StatusOr<AttendResult> served = (*stream)->Receive();
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->request_id(), 3u);
  ExpectAnswer(*served, step, mirror, "the message after two refused ones");
  EXPECT_TRUE((*stream)->Finish().ok());
}

// Several layer steps in flight on one stream (consecutive positions of one
// layer, two layers, a two-token segment), answered in the order sent with
// CpuBackend's bits; memory handed over by keep_alive may be dropped right
// after Send.
TEST_F(ClientTest, PipelinedAttendAnswersInOrderLikeTheCpuBackend) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--batch_wait_us=20000"}));
  Sequence seq = MakeSequence(31);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 200));
  SwaMirror mirror(seq);
  mirror.Insert(0, 205);
  mirror.Insert(1, 205);

  std::vector<Step> steps = {
      MakeStep(seq, 0, 200, 1, true, false),  MakeStep(seq, 1, 200, 1, false, true),
      MakeStep(seq, 0, 201, 1, false, false), MakeStep(seq, 1, 201, 1, true, true),
      MakeStep(seq, 0, 202, 2, true, true),   MakeStep(seq, 1, 202, 3, true, false),
  };
  StreamOptions options;
  options.max_in_flight = 8;
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream(options);
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (size_t i = 0; i < steps.size(); ++i) {
    AttendInput input = InputOf(seq, steps[i]);
    if (i % 2 == 1) {
      // Hand the buffers over and drop this test's references to them.
      input.keep_alive = std::make_shared<std::pair<std::shared_ptr<std::vector<uint16_t>>,
                                                    std::shared_ptr<std::vector<uint16_t>>>>(
          steps[i].q, steps[i].kv);
      steps[i].q.reset();
      steps[i].kv.reset();
      absl::StatusOr<uint64_t> id = (*stream)->Send(input);
      ASSERT_TRUE(id.ok()) << id.status();
      EXPECT_EQ(*id, i + 1);
    } else {
      absl::StatusOr<uint64_t> id = (*stream)->Send(input);
      ASSERT_TRUE(id.ok()) << id.status();
      EXPECT_EQ(*id, i + 1);
    }
  }
  EXPECT_EQ((*stream)->outstanding(), static_cast<int>(steps.size()));
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<AttendResult> result = (*stream)->Receive();
    ASSERT_TRUE(result.ok()) << "answer " << i << ": " << result.status();
    EXPECT_EQ(result->request_id(), i + 1);
    ExpectAnswer(*result, steps[i], mirror, absl::StrCat("answer ", i));
  }
  EXPECT_EQ((*stream)->outstanding(), 0);
  EXPECT_TRUE((*stream)->Finish().ok());
  absl::StatusOr<AttendResult> nothing = (*stream)->Receive();
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*stream)->Send(InputOf(seq, MakeStep(seq, 0, 205, 1, false, false))).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = client_->ListSessions();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ((*listed)[0].next_position(), 200) << "layers 2.. were never attended";
}

// The same-host data plane: q and kv in a HostRegion, out and lse written
// into it, on a stream striped over two connections (the client's id makes
// them one owner); the answers carry no bytes and the region holds
// CpuBackend's bits. A bad reference fails alone; the region goes, on the
// server and on this host, with its HostRegion.
TEST_F(ClientTest, HostRegionsCarryTheTensorsAndTheAnswer) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Sequence seq = MakeSequence(97);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 200));
  SwaMirror mirror(seq);
  mirror.Insert(0, 204);
  mirror.Insert(1, 204);
  constexpr int64_t kStepBytes = 64 << 10;  // each step's part of the region
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(*client_, 8 * kStepBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<std::vector<pb::RegionInfo>> listed = client_->ListRegions();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].region_id(), (*region)->id());
  EXPECT_EQ((*listed)[0].name(), (*region)->name());

  std::vector<Step> steps;
  for (int32_t p = 200; p < 204; ++p) {
    for (int layer = 0; layer < 2; ++layer) steps.push_back(MakeStep(seq, layer, p, 1, p % 2 == 0, false));
  }
  StreamOptions options;
  options.connections = 2;
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream(options);
  ASSERT_TRUE(stream.ok()) << stream.status();
  const int64_t q_bytes = kHeads * kHeadDim * 2;
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t at = static_cast<int64_t>(i) * kStepBytes;
    std::memcpy((*region)->data() + at, steps[i].q->data(), q_bytes);
    std::memcpy((*region)->data() + at + q_bytes, steps[i].kv->data(), kHeadDim * 2);
    AttendInput input = InputOf(seq, steps[i]);
    input.q = {};
    input.kv = {};
    input.q_region = *(*region)->Ref(at, q_bytes);
    input.kv_region = *(*region)->Ref(at + q_bytes, kHeadDim * 2);
    input.out_region = *(*region)->Ref(at + 2 * q_bytes, q_bytes);
    if (steps[i].lse) input.lse_region = *(*region)->Ref(at + 3 * q_bytes, kHeads * 4);
    ASSERT_TRUE((*stream)->Send(input).ok());
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<AttendResult> result = (*stream)->Receive();
    ASSERT_TRUE(result.ok()) << "answer " << i << ": " << result.status();
    EXPECT_TRUE(result->in_regions());
    EXPECT_TRUE(result->out().empty());
    EXPECT_EQ(result->num_tokens(), 1);
    EXPECT_EQ(result->num_heads(), kHeads);
    std::vector<uint16_t> out;
    std::vector<float> lse;
    mirror.Decode(steps[i].layer, steps[i].position, false, &out, &lse);
    const uint8_t* at = (*region)->data() + i * kStepBytes;
    EXPECT_EQ(std::memcmp(at + 2 * q_bytes, out.data(), q_bytes), 0) << "answer " << i;
    if (steps[i].lse) {
      EXPECT_EQ(std::memcmp(at + 3 * q_bytes, lse.data(), kHeads * 4), 0) << "answer " << i;
    }
  }

  // Refused here: the region's end, a span beside a region; by the server:
  // an unknown region. The stream goes on.
  EXPECT_EQ((*region)->Ref(8 * kStepBytes - 1, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  const Step next = MakeStep(seq, 0, 204, 1, false, false);
  AttendInput both = InputOf(seq, next);
  both.q_region = *(*region)->Ref(0, q_bytes);
  absl::StatusOr<uint64_t> refused = (*stream)->Send(both);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("AttendInput.q: given as a span"));
  AttendInput unknown = InputOf(seq, next);
  unknown.q = {};
  unknown.q_region = RegionRef{(*region)->id() + 100, 0, q_bytes};
  ASSERT_TRUE((*stream)->Send(unknown).ok());
  EXPECT_EQ((*stream)->Receive().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*stream)->Finish().ok());

  const std::string name = (*region)->name();
  region->reset();
  listed = client_->ListRegions();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty()) << "the region is still registered";
  EXPECT_LT(shm_open(name.c_str(), O_RDONLY, 0), 0) << name << " is left on this host";
}

// The FP8 output: asked with fp8_output, answered as e4m3 codes and UE8M0
// scales (out() empty) with CpuBackend's bytes and lse, inline and written
// into a HostRegion (out_region for the codes, out_scales_region for the
// scales). Answer regions that do not fit the FP8 answer are refused by
// Send, naming the field.
TEST_F(ClientTest, Fp8AnswersInlineAndIntoAHostRegion) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Sequence seq = MakeSequence(53);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 200));
  SwaMirror mirror(seq);
  mirror.Insert(0, 204);
  mirror.Insert(1, 204);
  constexpr int64_t kAnswerBytes = kHeads * (kHeadDim + kOutputBlocks + 4);
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(*client_, 1 << 16);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (int32_t p = 200; p < 204; ++p) {
    for (int layer = 0; layer < 2; ++layer) {
      const bool into_region = p >= 202;
      const std::string what = absl::StrCat("layer ", layer, " at ", p,
                                            into_region ? " into the region" : " inline");
      const Step step = MakeStep(seq, layer, p, 1, true, layer == 1);
      AttendInput input = InputOf(seq, step);
      input.fp8_output = true;
      const int64_t at = (2 * (p - 202) + layer) * kAnswerBytes;
      if (into_region) {
        input.out_region = *(*region)->Ref(at, kHeads * kHeadDim);
        input.out_scales_region = *(*region)->Ref(at + kHeads * kHeadDim, kHeads * kOutputBlocks);
        input.lse_region =
            *(*region)->Ref(at + kHeads * (kHeadDim + kOutputBlocks), kHeads * 4);
      }
      ASSERT_TRUE((*stream)->Send(input).ok()) << what;
      absl::StatusOr<AttendResult> result = (*stream)->Receive();
      ASSERT_TRUE(result.ok()) << what << ": " << result.status();
      EXPECT_TRUE(result->fp8_output()) << what;
      EXPECT_TRUE(result->out().empty()) << what << ": bf16 out of an FP8 answer";
      EXPECT_EQ(result->num_tokens(), 1) << what;
      EXPECT_EQ(result->num_heads(), kHeads) << what;
      std::vector<uint16_t> unused;
      std::vector<float> lse;
      Fp8Answer expected;
      mirror.Decode(layer, p, step.derotate, &unused, &lse, &expected);
      if (into_region) {
        EXPECT_TRUE(result->in_regions()) << what;
        EXPECT_TRUE(result->out_e4m3().empty() && result->out_scales().empty()) << what;
        const uint8_t* answer = (*region)->data() + at;
        EXPECT_EQ(std::memcmp(answer, expected.e4m3.data(), expected.e4m3.size()), 0) << what;
        EXPECT_EQ(std::memcmp(answer + kHeads * kHeadDim, expected.scales.data(),
                              expected.scales.size()),
                  0)
            << what;
        EXPECT_EQ(std::memcmp(answer + kHeads * (kHeadDim + kOutputBlocks), lse.data(),
                              kHeads * 4),
                  0)
            << what;
      } else {
        EXPECT_EQ(std::vector<uint8_t>(result->out_e4m3().begin(), result->out_e4m3().end()),
                  expected.e4m3)
            << what;
        EXPECT_EQ(std::vector<uint8_t>(result->out_scales().begin(), result->out_scales().end()),
                  expected.scales)
            << what;
        EXPECT_EQ(std::memcmp(result->lse().data(), lse.data(), kHeads * 4), 0) << what;
        std::vector<uint8_t> copied(kHeads * kHeadDim);
        result->out_view().CopyTo(copied.data());
        EXPECT_EQ(copied, expected.e4m3) << what << ": out_view";
      }
    }
  }

  const Step next = MakeStep(seq, 0, 204, 1, false, false);
  struct Refusal {
    std::string what;
    std::function<void(AttendInput&)> change;
    std::string words;
  };
  const std::vector<Refusal> refusals = {
      {"a bf16-sized out region", [&](AttendInput& in) {
         in.out_region = *(*region)->Ref(0, kHeads * kHeadDim * 2);
       },
       "AttendInput.out_region: 8192 bytes where out [T=1, H=8, 512] e4m3fn needs 4096"},
      {"no scales region", [](AttendInput& in) { in.out_scales_region.reset(); },
       "AttendInput.out_scales_region: give one exactly when fp8_output is set"},
      {"a scales region for a bf16 answer", [&](AttendInput& in) {
         in.fp8_output = false;
         in.out_region = *(*region)->Ref(0, kHeads * kHeadDim * 2);
       },
       "AttendInput.out_scales_region: give one exactly when fp8_output is set"},
      {"a scales region of the wrong size", [&](AttendInput& in) {
         in.out_scales_region = *(*region)->Ref(kHeads * kHeadDim, kHeads * kOutputBlocks + 4);
       },
       "AttendInput.out_scales_region: 36 bytes where out_scales [T=1, H=8, 4] UE8M0 needs 32"},
      {"a scales region without out_region", [](AttendInput& in) { in.out_region.reset(); },
       "AttendInput.out_scales_region: only with out_region"},
  };
  for (const Refusal& refusal : refusals) {
    AttendInput input = InputOf(seq, next);
    input.fp8_output = true;
    input.out_region = *(*region)->Ref(0, kHeads * kHeadDim);
    input.out_scales_region = *(*region)->Ref(kHeads * kHeadDim, kHeads * kOutputBlocks);
    refusal.change(input);
    absl::StatusOr<uint64_t> sent = (*stream)->Send(input);
    EXPECT_EQ(sent.status().code(), absl::StatusCode::kInvalidArgument) << refusal.what;
    EXPECT_THAT(std::string(sent.status().message()), HasSubstr(refusal.words)) << refusal.what;
  }
  EXPECT_EQ((*stream)->outstanding(), 0) << "a refused message was sent";
  EXPECT_TRUE((*stream)->Finish().ok());
}

// More messages than max_in_flight from one thread without receiving: Send
// waits for answers (which the library reads meanwhile), and nothing stalls.
TEST_F(ClientTest, SendWaitsForRoomAndNeverDeadlocks) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Sequence seq = MakeSequence(41);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 10));
  StreamOptions options;
  options.max_in_flight = 2;
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream(options);
  ASSERT_TRUE(stream.ok());
  std::vector<Step> steps;
  for (int32_t p = 10; p < 22; ++p) steps.push_back(MakeStep(seq, 0, p, 1, false, false));
  for (const Step& step : steps) ASSERT_TRUE((*stream)->Send(InputOf(seq, step)).ok());
  SwaMirror mirror(seq);
  mirror.Insert(0, 22);
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<AttendResult> result = (*stream)->Receive();
    ASSERT_TRUE(result.ok()) << result.status();
    ExpectAnswer(*result, steps[i], mirror, absl::StrCat("answer ", i));
  }
  EXPECT_TRUE((*stream)->Finish().ok());
}

// The usual shape of a serving node: one thread sends layer steps, another
// receives them; every answer in order and right.
TEST_F(ClientTest, SendAndReceiveFromTwoThreads) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  Sequence seq = MakeSequence(91);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 100));
  SwaMirror mirror(seq);
  mirror.Insert(0, 120);
  mirror.Insert(1, 120);
  std::vector<Step> steps;
  for (int32_t p = 100; p < 120; ++p) {
    for (int layer = 0; layer < 2; ++layer) steps.push_back(MakeStep(seq, layer, p, 1, p % 2 == 0, false));
  }
  StreamOptions options;
  options.max_in_flight = 4;
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream(options);
  ASSERT_TRUE(stream.ok());
  std::thread sender([&] {
    for (const Step& step : steps) {
      absl::StatusOr<uint64_t> id = (*stream)->Send(InputOf(seq, step));
      EXPECT_TRUE(id.ok()) << id.status();
    }
  });
  for (size_t i = 0; i < steps.size(); ++i) {
    // Receive may run ahead of Send: wait until this answer's message is out.
    while ((*stream)->outstanding() == 0) absl::SleepFor(absl::Microseconds(100));
    absl::StatusOr<AttendResult> result = (*stream)->Receive();
    ASSERT_TRUE(result.ok()) << "answer " << i << ": " << result.status();
    EXPECT_EQ(result->request_id(), i + 1);
    ExpectAnswer(*result, steps[i], mirror, absl::StrCat("answer ", i));
  }
  sender.join();
  EXPECT_TRUE((*stream)->Finish().ok());
}

// A stream spread over three connections (two of them opened for it):
// every answer in the order sent and right, although each layer's
// consecutive positions are in flight together, so they must stay on one
// connection (the server orders only one connection's messages) while the
// two layers' messages spread. Echo spreads the same way; a connection
// count outside 1..16 is refused.
TEST_F(ClientTest, StripedStreamsSpreadOverConnectionsAndKeepEachLayersOrder) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--batch_wait_us=20000"}));
  Sequence seq = MakeSequence(93);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 100));
  SwaMirror mirror(seq);
  mirror.Insert(0, 116);
  mirror.Insert(1, 116);
  std::vector<Step> steps;
  for (int32_t p = 100; p < 116; ++p) {
    for (int layer = 0; layer < 2; ++layer) steps.push_back(MakeStep(seq, layer, p, 1, true, false));
  }
  const int before = OpenSockets();
  StreamOptions options;
  options.connections = 3;
  options.max_in_flight = 16;
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream(options);
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<uint64_t> id = (*stream)->Send(InputOf(seq, steps[i]));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, i + 1);
  }
  EXPECT_EQ(OpenSockets(), before + 2) << "connections 2 and 3 are the stream's own";
  EXPECT_EQ((*stream)->outstanding(), static_cast<int>(steps.size()));
  for (size_t i = 0; i < steps.size(); ++i) {
    absl::StatusOr<AttendResult> result = (*stream)->Receive();
    ASSERT_TRUE(result.ok()) << "answer " << i << ": " << result.status();
    EXPECT_EQ(result->request_id(), i + 1);
    ExpectAnswer(*result, steps[i], mirror, absl::StrCat("answer ", i));
  }
  EXPECT_TRUE((*stream)->Finish().ok());
  EXPECT_EQ((*stream)->Receive().status().code(), absl::StatusCode::kFailedPrecondition);

  options.connections = 2;
  absl::StatusOr<std::unique_ptr<EchoStream>> echo = client_->OpenEchoStream(options);
  ASSERT_TRUE(echo.ok()) << echo.status();
  std::vector<std::vector<uint8_t>> payloads;  // referenced until answered
  for (uint8_t m = 0; m < 6; ++m) payloads.emplace_back(1000 + m, m);
  for (const std::vector<uint8_t>& payload : payloads) ASSERT_TRUE((*echo)->Send(payload).ok());
  for (uint8_t m = 0; m < 6; ++m) {
    absl::StatusOr<EchoResult> back = (*echo)->Receive();
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToString(), std::string(1000 + m, static_cast<char>(m))) << "message " << +m;
  }
  EXPECT_TRUE((*echo)->Finish().ok());

  for (int connections : {0, kMaxStreamConnections + 1}) {
    options.connections = connections;
    absl::StatusOr<std::unique_ptr<AttendStream>> bad = client_->OpenAttendStream(options);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << connections;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("StreamOptions.connections"));
  }
}

// Two threads waiting in Receive for one answer: one gets it, the other is
// told that nothing is outstanding any more.
TEST_F(ClientTest, TwoReceivesForOneAnswer) {
  // The lone message waits batch_wait for company: both Receives are waiting.
  ASSERT_NO_FATAL_FAILURE(StartSlowServer(300000));
  Sequence seq = MakeSequence(92);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 10));
  SwaMirror mirror(seq);
  mirror.Insert(0, 11);
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  const Step step = MakeStep(seq, 0, 10, 1, false, false);
  ASSERT_TRUE((*stream)->Send(InputOf(seq, step)).ok());
  std::vector<absl::StatusOr<AttendResult>> results;
  results.reserve(2);
  for (int i = 0; i < 2; ++i) results.emplace_back(absl::UnknownError("not run"));
  std::thread other([&] { results[1] = (*stream)->Receive(); });
  results[0] = (*stream)->Receive();
  other.join();
  const int taker = results[0].ok() ? 0 : 1;
  ASSERT_TRUE(results[taker].ok()) << results[0].status() << " / " << results[1].status();
  ExpectAnswer(*results[taker], step, mirror, "the answer one Receive took");
  const absl::Status& told = results[1 - taker].status();
  EXPECT_EQ(told.code(), absl::StatusCode::kFailedPrecondition) << told;
  EXPECT_THAT(told.message(), HasSubstr("another Receive took the last answer"));
  EXPECT_TRUE((*stream)->Finish().ok());
}

// Destroying a stream with messages in flight cancels it without waiting for
// the answers; the sessions are unaffected.
TEST_F(ClientTest, DestroyingAnUnfinishedStreamCancelsIt) {
  ASSERT_NO_FATAL_FAILURE(StartSlowServer(500000));
  Sequence seq = MakeSequence(92);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 10));
  const absl::Time start = absl::Now();
  std::weak_ptr<const void> handed_over;
  {
    absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE((*stream)->Send(InputOf(seq, MakeStep(seq, 0, 10, 1, false, false))).ok());
    Step step = MakeStep(seq, 1, 10, 1, false, false);
    AttendInput input = InputOf(seq, step);
    input.keep_alive = std::make_shared<std::pair<std::shared_ptr<std::vector<uint16_t>>,
                                                  std::shared_ptr<std::vector<uint16_t>>>>(
        step.q, step.kv);
    handed_over = input.keep_alive;
    step = Step();
    ASSERT_TRUE((*stream)->Send(input).ok());
  }
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(450)) << "the destructor waited for answers";
  EXPECT_TRUE(handed_over.expired())
      << "gRPC may still reference the message's memory after the stream was destroyed";
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = client_->ListSessions();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
}

// A layer step not answered within step_timeout (the server holds it for a
// 2 s batch) fails with DEADLINE_EXCEEDED and ends the stream.
TEST_F(ClientTest, StepDeadlineEndsTheStream) {
  ASSERT_NO_FATAL_FAILURE(StartSlowServer(2000000));
  Sequence seq = MakeSequence(51);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 10));
  const Step step = MakeStep(seq, 0, 10, 1, false, false);
  StreamOptions options;
  options.step_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream(options);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Send(InputOf(seq, step)).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<AttendResult> late = (*stream)->Receive();
  const absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_THAT(late.status().message(), HasSubstr("step_timeout"));
  EXPECT_GE(waited, absl::Milliseconds(250));
  EXPECT_LT(waited, absl::Milliseconds(1500));
  EXPECT_EQ((*stream)->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ((*stream)->Send(InputOf(seq, step)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

// A message over gRPC's own limit on the server (twice --max_message_mb
// and 1 MiB more; below it the server answers in-band) ends the whole
// stream with RESOURCE_EXHAUSTED, and every later call on the stream reports
// the stream's end.
TEST_F(ClientTest, AStreamTheServerEndsFailsWithItsStatus) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_message_mb=1"}));
  Sequence seq = MakeSequence(81);
  ASSERT_NO_FATAL_FAILURE(CreateAndAppend(&seq, 10));
  SwaMirror mirror(seq);
  mirror.Insert(0, 11);
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  const Step good = MakeStep(seq, 0, 10, 1, true, false);
  ASSERT_TRUE((*stream)->Send(InputOf(seq, good)).ok());
  // Answered before the oversized message goes out (the server ends the
  // stream as soon as it sees that one, answered or not what came before).
  absl::StatusOr<AttendResult> first = (*stream)->Receive();
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectAnswer(*first, good, mirror, "the message before the oversized one");

  const std::vector<uint16_t> big(int64_t{512} * kHeads * kHeadDim, 0x3f80);  // 4 MiB of q
  AttendInput oversized = InputOf(seq, good);
  oversized.segments[0].num_tokens = 512;
  oversized.q = big;
  oversized.kv = {};
  absl::StatusOr<uint64_t> sent = (*stream)->Send(oversized);
  ASSERT_TRUE(sent.ok()) << sent.status();
  absl::StatusOr<AttendResult> second = (*stream)->Receive();
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("Attend stream on " + server_->target()));
  EXPECT_EQ((*stream)->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*stream)->Send(InputOf(seq, good)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*stream)->Finish().code(), absl::StatusCode::kResourceExhausted);

  // The session is unaffected: a new stream carries on from position 11.
  stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  mirror.Insert(0, 12);
  const Step next = MakeStep(seq, 0, 11, 1, false, false);
  ASSERT_TRUE((*stream)->Send(InputOf(seq, next)).ok());
  absl::StatusOr<AttendResult> result = (*stream)->Receive();
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectAnswer(*result, next, mirror, "on a new stream");
  EXPECT_TRUE((*stream)->Finish().ok());
}

// A gRPC server in this process serving `service` on a free loopback port;
// its HOST:PORT in `target`.
std::unique_ptr<grpc::Server> StartInProcess(grpc::Service* service, std::string* target) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *target = absl::StrCat("127.0.0.1:", port);
  return server;
}

// A server that takes a second to answer GetServerInfo.
class SlowInfoService final : public pb::MlaOffload::Service {
  grpc::Status GetServerInfo(grpc::ServerContext*, const pb::GetServerInfoRequest*,
                             pb::ServerInfo* info) override {
    absl::SleepFor(absl::Seconds(1));
    info->set_version("slow");
    return grpc::Status::OK;
  }
};

// Unary calls carry CallOptions::timeout, else ConnectOptions::call_timeout.
TEST(UnaryDeadlineTest, CallsEndAtTheirDeadline) {
  SlowInfoService service;
  std::string target;
  std::unique_ptr<grpc::Server> server = StartInProcess(&service, &target);
  ASSERT_NE(server, nullptr);

  ConnectOptions options;
  options.call_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target, options);
  ASSERT_TRUE(client.ok());
  absl::Time start = absl::Now();
  absl::Status status = (*client)->GetServerInfo().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("GetServerInfo on " + target));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));

  CallOptions longer;
  longer.timeout = absl::Seconds(5);
  absl::StatusOr<pb::ServerInfo> info = (*client)->GetServerInfo(longer);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version(), "slow");

  CallOptions shorter;
  shorter.timeout = absl::Milliseconds(100);
  options.call_timeout = absl::Seconds(5);
  client = Client::Connect(target, options);
  ASSERT_TRUE(client.ok());
  start = absl::Now();
  EXPECT_EQ((*client)->GetServerInfo(shorter).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

// A server whose Attend answers have the wrong shape: message 1's out is
// [T, H, 256], message 2's lse is [T * H]; message 3 is answered right; FP8
// messages as Fp8Answer says.
class WrongShapeService final : public pb::MlaOffload::Service {
  grpc::Status Attend(grpc::ServerContext*,
                      grpc::ServerReaderWriter<pb::AttendResponse, pb::AttendRequest>* stream)
      override {
    pb::AttendRequest request;
    while (stream->Read(&request)) {
      if (request.fp8_output()) {
        stream->Write(Fp8Answer(request));
        continue;
      }
      const int64_t tokens = request.q().shape(0), heads = request.q().shape(1);
      const int64_t width = request.request_id() == 1 ? 256 : 512;
      pb::AttendResponse response;
      response.set_request_id(request.request_id());
      pb::Tensor* out = response.mutable_out();
      out->set_dtype(pb::DTYPE_BF16);
      for (int64_t dim : {tokens, heads, width}) out->add_shape(dim);
      out->set_data(std::string(tokens * heads * width * 2, '\0'));
      pb::Tensor* lse = response.mutable_lse();
      lse->set_dtype(pb::DTYPE_F32);
      if (request.request_id() == 2) {
        lse->add_shape(tokens * heads);
      } else {
        lse->add_shape(tokens);
        lse->add_shape(heads);
      }
      lse->set_data(std::string(tokens * heads * 4, '\0'));
      stream->Write(response);
    }
    return grpc::Status::OK;
  }

  // To FP8 messages: request 4 bf16 out, request 5 e4m3 out without
  // out_scales, request 6 scales of the wrong shape, request 7 a
  // well-formed FP8 answer.
  static pb::AttendResponse Fp8Answer(const pb::AttendRequest& request) {
    const int64_t tokens = request.q().shape(0), heads = request.q().shape(1);
    const uint64_t id = request.request_id();
    pb::AttendResponse response;
    response.set_request_id(id);
    pb::Tensor* out = response.mutable_out();
    out->set_dtype(id == 4 ? pb::DTYPE_BF16 : pb::DTYPE_E4M3FN);
    for (int64_t dim : {tokens, heads, int64_t{512}}) out->add_shape(dim);
    out->set_data(std::string(tokens * heads * 512 * (id == 4 ? 2 : 1), '\x38'));
    if (id >= 6) {
      const int64_t blocks = id == 6 ? 8 : 4;
      pb::Tensor* scales = response.mutable_out_scales();
      scales->set_dtype(pb::DTYPE_UE8M0);
      for (int64_t dim : {tokens, heads, blocks}) scales->add_shape(dim);
      scales->set_data(std::string(tokens * heads * blocks, '\x7f'));
    }
    return response;
  }
};

// Answers are checked against the [T, H] and the output format of the
// message they answer.
TEST(AnswerShapeTest, AnswersOfTheWrongShapeAreServerFaults) {
  WrongShapeService service;
  std::string target;
  std::unique_ptr<grpc::Server> server = StartInProcess(&service, &target);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(target);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = (*client)->OpenAttendStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const std::vector<uint16_t> q(2 * kHeads * kHeadDim, 0);
  AttendInput input;
  input.segments = {{"any", 0, 2, 0, 0}};
  input.q = q;
  input.return_lse = true;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*stream)->Send(input).ok());
  absl::StatusOr<AttendResult> narrow = (*stream)->Receive();
  EXPECT_EQ(narrow.status().code(), absl::StatusCode::kInternal) << narrow.status();
  EXPECT_THAT(narrow.status().message(),
              HasSubstr("Attend request 1: AttendResponse.out is [2, 8, 256] DTYPE_BF16 where "
                        "[2, 8, 512] DTYPE_BF16 is expected"));
  absl::StatusOr<AttendResult> flat_lse = (*stream)->Receive();
  EXPECT_EQ(flat_lse.status().code(), absl::StatusCode::kInternal) << flat_lse.status();
  EXPECT_THAT(flat_lse.status().message(),
              HasSubstr("AttendResponse.lse is [16] DTYPE_F32 where [2, 8] DTYPE_F32"));
  absl::StatusOr<AttendResult> right = (*stream)->Receive();
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->num_tokens(), 2);
  EXPECT_EQ(right->num_heads(), kHeads);
  EXPECT_EQ(right->lse().size(), 2u * kHeads);

  // An FP8 message needs an FP8 answer.
  input.return_lse = false;
  input.fp8_output = true;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*stream)->Send(input).ok());
  for (const char* words :
       {"Attend request 4: AttendResponse.out is [2, 8, 512] DTYPE_BF16 where [2, 8, 512] "
        "DTYPE_E4M3FN is expected",
        "Attend request 5: an FP8 answer without out_scales",
        "Attend request 6: AttendResponse.out_scales is [2, 8, 8] DTYPE_UE8M0 where [2, 8, 4] "
        "DTYPE_UE8M0 is expected"}) {
    absl::StatusOr<AttendResult> wrong = (*stream)->Receive();
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInternal) << wrong.status();
    EXPECT_THAT(wrong.status().message(), HasSubstr(words));
  }
  absl::StatusOr<AttendResult> fp8 = (*stream)->Receive();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_TRUE(fp8->fp8_output());
  EXPECT_EQ(fp8->out_e4m3().size(), 2u * kHeads * 512);
  EXPECT_EQ(fp8->out_scales().size(), 2u * kHeads * 4);
  EXPECT_EQ(fp8->out_scales()[0], 0x7f);
  EXPECT_TRUE(fp8->out().empty());
  EXPECT_TRUE((*stream)->Finish().ok());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

TEST_F(ClientTest, EchoReturnsEveryPayloadInOrder) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  absl::StatusOr<std::unique_ptr<EchoStream>> stream = client_->OpenEchoStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<std::vector<uint8_t>> payloads = {{}, {42}, std::vector<uint8_t>(3 << 20)};
  for (size_t i = 0; i < payloads.back().size(); ++i) payloads.back()[i] = i * 131 % 251;
  for (size_t i = 0; i < payloads.size(); ++i) {
    absl::StatusOr<uint64_t> id = (*stream)->Send(payloads[i]);
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(*id, i + 1);
  }
  for (const std::vector<uint8_t>& payload : payloads) {
    absl::StatusOr<EchoResult> back = (*stream)->Receive();
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->size(), payload.size());
    const std::string bytes = back->ToString();
    EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), payload.begin(),
                           [](char a, uint8_t b) { return static_cast<uint8_t>(a) == b; }));
  }
  EXPECT_TRUE((*stream)->Finish().ok());
}

// --max_streams_per_connection bounds what one connection holds at once: a
// second stream waits (it is not refused) until the first ends.
TEST_F(ClientTest, AConnectionHoldsAtMostItsStreams) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_streams_per_connection=1"}));
  absl::StatusOr<std::unique_ptr<EchoStream>> first = client_->OpenEchoStream();
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<uint8_t> payload = {1, 2, 3};
  ASSERT_TRUE((*first)->Send(payload).ok());
  ASSERT_TRUE((*first)->Receive().ok());
  absl::StatusOr<std::unique_ptr<EchoStream>> second = client_->OpenEchoStream();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE((*second)->Send(payload).ok());
  std::atomic<bool> answered{false};
  absl::Status second_status;
  std::thread receiver([&] {
    second_status = (*second)->Receive().status();
    answered = true;
  });
  absl::SleepFor(absl::Milliseconds(700));
  EXPECT_FALSE(answered) << "the second stream ran beside the first";
  EXPECT_TRUE((*first)->Finish().ok());
  receiver.join();
  EXPECT_TRUE(second_status.ok()) << second_status;
  EXPECT_TRUE((*second)->Finish().ok());
}

// Draining: new sessions are UNAVAILABLE with the server's word for it,
// health says NOT_SERVING for the service's name (readiness) and SERVING
// for "" (liveness).
TEST_F(ClientTest, DrainingServerRefusesSessionsAsUnavailable) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--drain_seconds=5"}));
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = client_->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  // An open stream keeps the draining server up while the test looks.
  absl::StatusOr<std::unique_ptr<EchoStream>> echo = client_->OpenEchoStream();
  ASSERT_TRUE(echo.ok());
  ASSERT_TRUE((*echo)->Send(std::vector<uint8_t>{1}).ok());
  ASSERT_TRUE((*echo)->Receive().ok());
  server_->Signal(SIGTERM);
  ASSERT_TRUE(server_->WaitForLine("draining", absl::Seconds(2)).has_value());
  absl::StatusOr<HealthStatus> health;
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  do {
    health = client_->CheckHealth(pb::MlaOffload::service_full_name());
  } while (health.ok() && *health == HealthStatus::kServing && absl::Now() < deadline);
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::kNotServing);
  absl::StatusOr<HealthStatus> liveness = client_->CheckHealth();
  ASSERT_TRUE(liveness.ok()) << liveness.status();
  EXPECT_EQ(*liveness, HealthStatus::kServing);
  absl::StatusOr<pb::CreateSessionResponse> refused =
      client_->CreateSession(SessionOf(MakeSequence(61)));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("draining"));
  (*echo)->Finish().IgnoreError();
  (*stream)->Finish().IgnoreError();
}

// Two real servers: sessions land where rendezvous hashing says; when one
// server is lost its sessions are gone (UNAVAILABLE), the caller marks it
// lost, re-creates them on the other and re-appends; the other server's
// sessions never move.
TEST(ClusterServersTest, PlacesSessionsAndSurvivesALostServer) {
  // Room for all 12 sessions on one server (176 blocks each).
  absl::StatusOr<std::unique_ptr<TestServer>> a = TestServer::Start({"--kv_cache_gb=0.1"});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::unique_ptr<TestServer>> b = TestServer::Start({"--kv_cache_gb=0.1"});
  ASSERT_TRUE(b.ok()) << b.status();
  const std::vector<std::string> targets = {(*a)->target(), (*b)->target()};
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Connect(targets);
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  std::map<std::string, PlacedSession> sessions;
  std::vector<int> per_server(2, 0);
  const Sequence seq = MakeSequence(71);
  const Prompt prompt = MakePrompt(seq, 0, 8);
  for (int i = 0; i < 12; ++i) {
    const std::string key = absl::StrCat("sequence-", i);
    absl::StatusOr<PlacedSession> placed = (*cluster)->CreateSession(key, SessionOf(seq));
    ASSERT_TRUE(placed.ok()) << placed.status();
    EXPECT_EQ(placed->server, RendezvousPlace(key, targets)) << key;
    EXPECT_EQ(placed->target, targets[placed->server]);
    ASSERT_TRUE((*cluster)
                    ->client(placed->server)
                    .AppendKV(placed->session.session_id(), 0, 8, prompt.layers)
                    .ok());
    ++per_server[placed->server];
    sessions[key] = *placed;
  }
  ASSERT_GT(per_server[0], 0) << "12 keys all on one server";
  ASSERT_GT(per_server[1], 0) << "12 keys all on one server";
  for (int server = 0; server < 2; ++server) {
    absl::StatusOr<std::vector<pb::SessionInfo>> listed =
        (*cluster)->client(server).ListSessions();
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(static_cast<int>(listed->size()), per_server[server]) << targets[server];
  }

  // An Attend stream to b, working before the loss.
  Sequence on_b = seq;
  for (const auto& [key, placed] : sessions) {
    if (placed.server == 1) on_b.id = placed.session.session_id();
  }
  absl::StatusOr<std::unique_ptr<AttendStream>> stream = (*cluster)->client(1).OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Send(InputOf(on_b, MakeStep(on_b, 0, 8, 1, false, false))).ok());
  ASSERT_TRUE((*stream)->Receive().ok());

  // Server b is lost with everything it held.
  (*b)->Signal(SIGKILL);
  (*b)->WaitExit(absl::Seconds(5));
  absl::StatusOr<uint64_t> sent = (*stream)->Send(InputOf(on_b, MakeStep(on_b, 0, 9, 1, false, false)));
  const absl::Status lost = sent.ok() ? (*stream)->Receive().status() : sent.status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  EXPECT_THAT(lost.message(), HasSubstr("Attend stream on " + targets[1]));
  EXPECT_EQ((*stream)->status().code(), absl::StatusCode::kUnavailable);
  for (const auto& [key, placed] : sessions) {
    const Prompt more = MakePrompt(seq, 8, 1);
    absl::StatusOr<pb::AppendKVResponse> appended =
        (*cluster)->client(placed.server).AppendKV(placed.session.session_id(), 8, 1, more.layers);
    if (placed.server == 1) {
      EXPECT_EQ(appended.status().code(), absl::StatusCode::kUnavailable) << appended.status();
      EXPECT_THAT(appended.status().message(), HasSubstr("AppendKV on " + targets[1]));
    } else {
      EXPECT_TRUE(appended.ok()) << key << ": " << appended.status();
    }
  }
  (*cluster)->MarkLost(1);
  for (const auto& [key, placed] : sessions) {
    absl::StatusOr<int> now = (*cluster)->Place(key);
    ASSERT_TRUE(now.ok());
    EXPECT_EQ(*now, 0) << key;
    if (placed.server == 0) continue;
    // The caller's recovery: a new session on the live server, its KV again.
    absl::StatusOr<PlacedSession> again = (*cluster)->CreateSession(key, SessionOf(seq));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->server, 0);
    const Prompt all = MakePrompt(seq, 0, 9);
    ASSERT_TRUE((*cluster)->client(0).AppendKV(again->session.session_id(), 0, 9, all.layers).ok());
  }
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = (*cluster)->client(0).ListSessions();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), sessions.size());
  for (const pb::SessionInfo& info : *listed) EXPECT_EQ(info.next_position(), 9);
}

}  // namespace
}  // namespace mla::client
