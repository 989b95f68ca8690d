// The real mla_offload_server with TLS, mutual TLS and bearer tokens, over
// loopback, driven by the C++ client library: every refusal with its code
// and nothing changed by it, tenants that cannot see or touch each other's
// sessions, an operator that can, each per-tenant limit, plaintext and bad
// client certificates refused at the handshake, and the tokens file and the
// server certificate rotated while the server runs. The certificates are
// made with openssl by the test (tests/support/make_test_certs.sh).
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/host_region.h"
#include "client/mla_client.h"
#include "client/test_processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/model_profile.h"
#include "tests/support/test_certs.h"
#include "tests/support/test_rows.h"

namespace mla {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace pb = ::mla_offload::v1;

const std::vector<testing::TestToken> kTokens = {
    {"alpha", "alpha-token-1"}, {"beta", "beta-token-1"}, {"ops", "ops-token-1", true}};

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

client::SessionOptions Flash() {
  client::SessionOptions session;
  session.model = "deepseek-v4-flash";
  session.num_heads = 8;
  return session;
}

class AuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> certs = testing::TestCertsDir();
    ASSERT_TRUE(certs.ok()) << certs.status();
    certs_ = *certs;
    tokens_file_ = TempPath(absl::StrCat(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".tokens"));
    testing::WriteTokensFile(tokens_file_, kTokens);
  }

  std::string Cert(const std::string& name) const { return absl::StrCat(certs_, "/", name); }

  // The server with TLS and tokens (and `flags` after).
  void Start(const std::vector<std::string>& flags = {}) {
    std::vector<std::string> all = {"--tls_cert_file=" + Cert("server.pem"),
                                    "--tls_key_file=" + Cert("server.key"),
                                    "--auth_tokens_file=" + tokens_file_,
                                    "--credentials_reload_s=1"};
    all.insert(all.end(), flags.begin(), flags.end());
    absl::StatusOr<std::unique_ptr<client::TestServer>> server = client::TestServer::Start(all);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  client::ConnectOptions Tls(const std::string& token, const std::string& client_cert = "",
                             const std::string& ca = "ca.pem") const {
    client::ConnectOptions options;
    options.use_tls = true;
    options.tls_root_certs_pem = testing::ReadText(Cert(ca));
    options.bearer_token = token;
    if (!client_cert.empty()) {
      options.tls_client_cert_pem = testing::ReadText(Cert(client_cert + ".pem"));
      options.tls_client_key_pem = testing::ReadText(Cert(client_cert + ".key"));
    }
    options.call_timeout = absl::Seconds(10);
    options.own_connection = true;
    return options;
  }

  std::unique_ptr<client::Client> Connect(const client::ConnectOptions& options) {
    absl::StatusOr<std::unique_ptr<client::Client>> connected =
        client::Client::Connect(server_->target(), options);
    EXPECT_TRUE(connected.ok()) << connected.status();
    return connected.ok() ? *std::move(connected) : nullptr;
  }
  std::unique_ptr<client::Client> As(const std::string& token) { return Connect(Tls(token)); }

  // The ids ListSessions shows `client`.
  static std::vector<std::string> Ids(client::Client& client) {
    std::vector<std::string> ids;
    absl::StatusOr<std::vector<pb::SessionInfo>> sessions = client.ListSessions();
    EXPECT_TRUE(sessions.ok()) << sessions.status();
    if (sessions.ok()) {
      for (const pb::SessionInfo& info : *sessions) ids.push_back(info.session_id());
    }
    return ids;
  }

  std::string certs_;
  std::string tokens_file_;
  std::unique_ptr<client::TestServer> server_;
};

// An Attend message of one token for `session_id` on layer 0.
struct OneToken {
  explicit OneToken(const std::string& session_id) : q(8 * client::kHeadDim, 0) {
    input.layer = 0;
    input.segments.push_back({session_id, 0, 1, 0, 0});
    input.q = q;
  }
  std::vector<uint16_t> q;
  client::AttendInput input;
};

absl::Status AttendOnce(client::Client& client, const std::string& session_id) {
  absl::StatusOr<std::unique_ptr<client::AttendStream>> stream = client.OpenAttendStream();
  if (!stream.ok()) return stream.status();
  OneToken message(session_id);
  absl::StatusOr<uint64_t> sent = (*stream)->Send(message.input);
  if (!sent.ok()) return sent.status();
  return (*stream)->Receive().status();
}

absl::Status EchoOnce(client::EchoStream& stream) {
  const std::vector<uint8_t> payload(16, 7);
  absl::StatusOr<uint64_t> sent = stream.Send(payload);
  if (!sent.ok()) return sent.status();
  return stream.Receive().status();
}

TEST_F(AuthTest, WithoutAValidTokenEveryMethodIsUnauthenticatedAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::unique_ptr<client::Client> ops = As("ops-token-1");
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  ASSERT_NE(ops, nullptr);
  ASSERT_NE(alpha, nullptr);
  absl::StatusOr<pb::CreateSessionResponse> session = alpha->CreateSession(Flash());
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string id = session->session_id();

  for (const std::string& token : {std::string(), std::string("not-a-token")}) {
    SCOPED_TRACE(token.empty() ? "no token" : "wrong token");
    std::unique_ptr<client::Client> anon = As(token);
    ASSERT_NE(anon, nullptr);
    std::vector<absl::Status> refused = {
        anon->GetServerInfo().status(),
        anon->CreateSession(Flash()).status(),
        anon->AppendKV(id, 0, 1, {}).status(),
        anon->CloseSession(id).status(),
        anon->ListSessions().status(),
        anon->RegisterRegion("/mla-auth-test", 4096).status(),
        anon->UnregisterRegion(1),
        anon->ListRegions().status(),
        AttendOnce(*anon, id),
    };
    absl::StatusOr<std::unique_ptr<client::EchoStream>> echo = anon->OpenEchoStream();
    refused.push_back(echo.ok() ? EchoOnce(**echo) : echo.status());
    for (const absl::Status& status : refused) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
      EXPECT_THAT(status.message(), Not(HasSubstr("not-a-token")));
    }
    EXPECT_THAT(refused[0].message(),
                HasSubstr(token.empty() ? "no token" : "not one this server knows"));
    // Health answers without a token, for probes.
    absl::StatusOr<client::HealthStatus> health = anon->CheckHealth();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, client::HealthStatus::kServing);
  }
  // Nothing was created, changed or closed.
  EXPECT_THAT(Ids(*ops), ::testing::ElementsAre(id));
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = alpha->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].next_position(), 0);
  EXPECT_EQ((*listed)[0].tenant(), "alpha");
  EXPECT_THAT(server_->Output(), Not(HasSubstr("not-a-token")));
  EXPECT_THAT(server_->Output(), Not(HasSubstr("alpha-token-1")));
}

TEST_F(AuthTest, ATenantCannotSeeAttendAppendToOrCloseAnotherTenantsSession) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  std::unique_ptr<client::Client> beta = As("beta-token-1");
  std::unique_ptr<client::Client> ops = As("ops-token-1");
  absl::StatusOr<pb::CreateSessionResponse> mine = alpha->CreateSession(Flash());
  absl::StatusOr<pb::CreateSessionResponse> theirs = beta->CreateSession(Flash());
  ASSERT_TRUE(mine.ok() && theirs.ok());
  const std::string id = mine->session_id();

  EXPECT_THAT(Ids(*beta), ::testing::ElementsAre(theirs->session_id()));
  EXPECT_THAT(Ids(*alpha), ::testing::ElementsAre(id));
  // Another tenant's session reads exactly as one that does not exist: the
  // same code and the same whole message, the id aside, for every call that
  // names a session.
  const std::string unknown = "00000000000000000000000000000000";
  ASSERT_EQ(unknown.size(), id.size());
  const auto same = [&](const char* call, const absl::Status& foreign, const absl::Status& none) {
    EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound) << call << ": " << foreign;
    EXPECT_EQ(none.code(), absl::StatusCode::kNotFound) << call << ": " << none;
    EXPECT_EQ(std::string(foreign.message()),
              absl::StrReplaceAll(none.message(), {{unknown, id}}))
        << call;
    EXPECT_THAT(foreign.message(), HasSubstr("session '" + id + "' does not exist")) << call;
  };
  same("AppendKV", beta->AppendKV(id, 0, 1, {}).status(),
       beta->AppendKV(unknown, 0, 1, {}).status());
  same("CloseSession", beta->CloseSession(id).status(), beta->CloseSession(unknown).status());
  same("Attend", AttendOnce(*beta, id), AttendOnce(*beta, unknown));
  same("AppendKV by the operator", ops->AppendKV(id, 0, 1, {}).status(),
       ops->AppendKV(unknown, 0, 1, {}).status());
  same("Attend by the operator", AttendOnce(*ops, id), AttendOnce(*ops, unknown));
  // Still alpha's, as it was.
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = alpha->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].next_position(), 0);

  // The operator sees both, with their tenants, and may close either.
  absl::StatusOr<std::vector<pb::SessionInfo>> all = ops->ListSessions();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  for (const pb::SessionInfo& info : *all) {
    EXPECT_EQ(info.tenant(), info.session_id() == id ? "alpha" : "beta");
  }
  EXPECT_TRUE(ops->CloseSession(theirs->session_id()).ok());
  EXPECT_THAT(Ids(*beta), ::testing::IsEmpty());
  EXPECT_TRUE(alpha->CloseSession(id).ok());
}

// With authentication a region belongs to its tenant and its client (each
// client::Client sends an mla-client-id of its own): another client of the
// same tenant can neither see nor unregister it, and another tenant cannot
// either; so --max_regions_per_client counts per client within a tenant,
// and a client's stream keeps only that client's regions registered.
TEST_F(AuthTest, RegionsBelongToTheTenantAndTheClient) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  std::unique_ptr<client::Client> alpha_too = As("alpha-token-1");
  std::unique_ptr<client::Client> beta = As("beta-token-1");
  absl::StatusOr<std::unique_ptr<client::HostRegion>> region =
      client::HostRegion::Create(*alpha, 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  const auto ids = [](client::Client& client) {
    std::vector<uint64_t> ids;
    absl::StatusOr<std::vector<pb::RegionInfo>> regions = client.ListRegions();
    EXPECT_TRUE(regions.ok()) << regions.status();
    if (regions.ok()) {
      for (const pb::RegionInfo& info : *regions) ids.push_back(info.region_id());
    }
    return ids;
  };
  EXPECT_THAT(ids(*alpha), ::testing::ElementsAre((*region)->id()));
  EXPECT_THAT(ids(*alpha_too), ::testing::IsEmpty());
  EXPECT_EQ(alpha_too->UnregisterRegion((*region)->id()).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ids(*beta), ::testing::IsEmpty());
  EXPECT_EQ(beta->UnregisterRegion((*region)->id()).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ids(*alpha), ::testing::ElementsAre((*region)->id()));
}

TEST_F(AuthTest, SessionLimitPerTenant) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max_sessions_per_tenant=2"}));
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  std::unique_ptr<client::Client> beta = As("beta-token-1");
  ASSERT_TRUE(alpha->CreateSession(Flash()).ok());
  absl::StatusOr<pb::CreateSessionResponse> second = alpha->CreateSession(Flash());
  ASSERT_TRUE(second.ok());
  const absl::Status third = alpha->CreateSession(Flash()).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_THAT(third.message(), HasSubstr("tenant 'alpha' holds 2 sessions"));
  EXPECT_THAT(third.message(), HasSubstr("--max_sessions_per_tenant=2"));
  EXPECT_EQ(Ids(*alpha).size(), 2u);
  // Another tenant's limit is its own; a closed session makes room.
  EXPECT_TRUE(beta->CreateSession(Flash()).ok());
  ASSERT_TRUE(alpha->CloseSession(second->session_id()).ok());
  EXPECT_TRUE(alpha->CreateSession(Flash()).ok());
}

TEST_F(AuthTest, KvBlockLimitPerTenant) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max_kv_blocks_per_tenant=1"}));
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  absl::StatusOr<pb::ServerInfo> before = alpha->GetServerInfo();
  ASSERT_TRUE(before.ok());
  const absl::Status refused = alpha->CreateSession(Flash()).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max_kv_blocks_per_tenant=1"));
  EXPECT_THAT(refused.message(), HasSubstr("nothing was changed"));
  EXPECT_THAT(Ids(*alpha), ::testing::IsEmpty());
  absl::StatusOr<pb::ServerInfo> after = alpha->GetServerInfo();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->kv_blocks_used(), before->kv_blocks_used());
}

// AppendKV's compressed pages count against the tenant's block limit: a
// prompt that would pass it is refused and writes nothing; one that needs
// no new page goes in.
TEST_F(AuthTest, KvBlockLimitRefusesAnAppendThatWouldPassIt) {
  absl::StatusOr<const ModelProfile*> profile = FindModelProfile("deepseek-v4-flash");
  ASSERT_TRUE(profile.ok());
  const int layers = (*profile)->num_attention_layers();
  const int64_t ring_blocks = int64_t{layers} * 4;  // a new session's SWA rings
  ASSERT_NO_FATAL_FAILURE(
      Start({absl::StrCat("--max_kv_blocks_per_tenant=", ring_blocks + 1)}));
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  absl::StatusOr<pb::CreateSessionResponse> session = alpha->CreateSession(Flash());
  ASSERT_TRUE(session.ok()) << session.status();

  // Rows of `count` positions from 0 for every layer, with the compressed
  // rows they complete.
  const auto prompt = [&](int32_t count, std::vector<std::vector<uint16_t>>& storage) {
    std::vector<client::LayerRowsInput> rows(layers);
    storage.assign(2 * layers, {});
    for (int layer = 0; layer < layers; ++layer) {
      const int ratio = (*profile)->compress_ratio(layer);
      storage[2 * layer] = TestRows(layer, count);
      rows[layer].layer = layer;
      rows[layer].swa_kv = storage[2 * layer];
      if (ratio != 0) {
        storage[2 * layer + 1] = TestRows(1000 + layer, count / ratio);
        rows[layer].compressed_kv = storage[2 * layer + 1];
      }
    }
    return rows;
  };
  std::vector<std::vector<uint16_t>> storage;
  const std::vector<client::LayerRowsInput> big = prompt(256, storage);
  const absl::Status refused = alpha->AppendKV(session->session_id(), 0, 256, big).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("tenant 'alpha' holds ", ring_blocks,
                                                        " KV blocks")));
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = alpha->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].next_position(), 0);
  EXPECT_EQ((*listed)[0].kv_blocks(), ring_blocks);

  std::vector<std::vector<uint16_t>> small_storage;
  const std::vector<client::LayerRowsInput> small = prompt(3, small_storage);
  absl::StatusOr<pb::AppendKVResponse> appended =
      alpha->AppendKV(session->session_id(), 0, 3, small);
  ASSERT_TRUE(appended.ok()) << appended.status();
  EXPECT_EQ(appended->next_position(), 3);
}

// The pages decoding adds count against the same limit: an Attend step
// whose new compressed row would take a page past it is refused, naming
// the flag, and takes nothing; a step that needs no page still runs.
TEST_F(AuthTest, KvBlockLimitRefusesAnAttendStepThatWouldPassIt) {
  absl::StatusOr<const ModelProfile*> profile = FindModelProfile("deepseek-v4-flash");
  ASSERT_TRUE(profile.ok());
  const int layers = (*profile)->num_attention_layers();
  const int64_t ring_blocks = int64_t{layers} * 4;  // a new session's SWA rings
  ASSERT_NO_FATAL_FAILURE(Start({absl::StrCat("--max_kv_blocks_per_tenant=", ring_blocks)}));
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  absl::StatusOr<pb::CreateSessionResponse> session = alpha->CreateSession(Flash());
  ASSERT_TRUE(session.ok()) << session.status();
  const std::string id = session->session_id();
  // Three positions of every layer: no compressed row yet (ratio 4 needs 4).
  std::vector<std::vector<uint16_t>> storage(layers);
  std::vector<client::LayerRowsInput> rows(layers);
  int c4a = -1, swa = -1;
  for (int layer = 0; layer < layers; ++layer) {
    storage[layer] = TestRows(layer, 3);
    rows[layer].layer = layer;
    rows[layer].swa_kv = storage[layer];
    const int ratio = (*profile)->compress_ratio(layer);
    if (ratio == 4 && c4a < 0) c4a = layer;
    if (ratio == 0 && swa < 0) swa = layer;
  }
  ASSERT_TRUE(c4a >= 0 && swa >= 0);
  ASSERT_TRUE(alpha->AppendKV(id, 0, 3, rows).ok());
  absl::StatusOr<std::unique_ptr<client::AttendStream>> stream = alpha->OpenAttendStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const std::vector<uint16_t> q(8 * client::kHeadDim, 0);
  const std::vector<uint16_t> kv = TestRows(77, 1), compressed = TestRows(78, 1);
  const std::vector<int32_t> topk = {0};
  client::AttendInput step;
  step.layer = c4a;
  // Position 3 completes compressed row 0: its page would pass the limit.
  step.segments.push_back({id, 3, 1, 0, 1});
  step.q = q;
  step.kv = kv;
  step.compressed_kv = compressed;
  step.topk = topk;
  ASSERT_TRUE((*stream)->Send(step).ok());
  const absl::Status refused = (*stream)->Receive().status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max_kv_blocks_per_tenant"));
  absl::StatusOr<std::vector<pb::SessionInfo>> listed = alpha->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].kv_blocks(), ring_blocks) << "the refused step took a page";
  client::AttendInput plain;
  plain.layer = swa;
  plain.segments.push_back({id, 3, 1, 0, 0});
  plain.q = q;
  plain.kv = kv;
  ASSERT_TRUE((*stream)->Send(plain).ok());
  const absl::StatusOr<client::AttendResult> answered = (*stream)->Receive();
  EXPECT_TRUE(answered.ok()) << answered.status();
}

TEST_F(AuthTest, StreamLimitPerTenant) {
  ASSERT_NO_FATAL_FAILURE(Start({"--max_streams_per_tenant=1"}));
  std::unique_ptr<client::Client> alpha = As("alpha-token-1");
  std::unique_ptr<client::Client> beta = As("beta-token-1");
  absl::StatusOr<std::unique_ptr<client::EchoStream>> first = alpha->OpenEchoStream();
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(EchoOnce(**first).ok());  // the server holds it open now
  absl::StatusOr<std::unique_ptr<client::EchoStream>> second = alpha->OpenEchoStream();
  ASSERT_TRUE(second.ok());
  const absl::Status refused = EchoOnce(**second);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("--max_streams_per_tenant=1"));
  const absl::Status attend = AttendOnce(*alpha, "00000000000000000000000000000000");
  EXPECT_EQ(attend.code(), absl::StatusCode::kResourceExhausted) << attend;
  // Beta's stream is its own; the first stream still works.
  absl::StatusOr<std::unique_ptr<client::EchoStream>> other = beta->OpenEchoStream();
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(EchoOnce(**other).ok());
  EXPECT_TRUE(EchoOnce(**first).ok());
  // Once the first ends, alpha may open another.
  EXPECT_TRUE((*first)->Finish().ok());
  first->reset();
  absl::Status again;
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<std::unique_ptr<client::EchoStream>> next = alpha->OpenEchoStream();
    ASSERT_TRUE(next.ok());
    again = EchoOnce(**next);
    if (again.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(again.ok()) << again;
}

TEST_F(AuthTest, PlaintextOnTheTlsPortIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Start());
  client::ConnectOptions plaintext;
  plaintext.bearer_token = "alpha-token-1";
  plaintext.call_timeout = absl::Seconds(5);
  std::unique_ptr<client::Client> client = Connect(plaintext);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->CreateSession(Flash()).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(AuthTest, MutualTlsNamesTheTenantAndRefusesBadCertificates) {
  ASSERT_NO_FATAL_FAILURE(Start({"--tls_client_ca_file=" + Cert("ca.pem")}));
  std::unique_ptr<client::Client> alpha = Connect(Tls("", "alpha"));
  std::unique_ptr<client::Client> beta = Connect(Tls("", "beta"));
  ASSERT_NE(alpha, nullptr);
  ASSERT_NE(beta, nullptr);
  // The certificate's CN is the tenant.
  absl::StatusOr<pb::CreateSessionResponse> session = alpha->CreateSession(Flash());
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_THAT(Ids(*beta), ::testing::IsEmpty());
  EXPECT_EQ(beta->CloseSession(session->session_id()).status().code(),
            absl::StatusCode::kNotFound);
  // A token of the same tenant over another tenant's certificate: the token
  // decides; alpha's token sees alpha's session.
  std::unique_ptr<client::Client> alpha_token = Connect(Tls("alpha-token-1", "beta"));
  EXPECT_THAT(Ids(*alpha_token), ::testing::ElementsAre(session->session_id()));

  for (const std::string& cert : {std::string(), std::string("expired"), std::string("wrong_ca")}) {
    SCOPED_TRACE(cert.empty() ? "no client certificate" : cert);
    std::unique_ptr<client::Client> refused = Connect(Tls("alpha-token-1", cert));
    ASSERT_NE(refused, nullptr);
    const absl::Status status = refused->ListSessions().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
  EXPECT_THAT(Ids(*alpha), ::testing::ElementsAre(session->session_id()));
}

TEST_F(AuthTest, ARotatedTokensFileTakesEffectAndABadOneKeepsTheOld) {
  ASSERT_NO_FATAL_FAILURE(Start());
  std::unique_ptr<client::Client> old = As("alpha-token-1");
  ASSERT_TRUE(old->GetServerInfo().ok());
  // A stream opened with the old token: its messages are answered until the
  // token goes, then refused.
  absl::StatusOr<std::unique_ptr<client::AttendStream>> stream = old->OpenAttendStream();
  ASSERT_TRUE(stream.ok());
  OneToken message("00000000000000000000000000000000");
  ASSERT_TRUE((*stream)->Send(message.input).ok());
  EXPECT_EQ((*stream)->Receive().status().code(), absl::StatusCode::kNotFound);
  testing::WriteTokensFile(tokens_file_, {{"alpha", "alpha-token-2"}});
  absl::Status fresh;
  for (int i = 0; i < 100; ++i) {
    fresh = As("alpha-token-2")->GetServerInfo().status();
    if (fresh.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(fresh.ok()) << fresh;
  EXPECT_EQ(As("alpha-token-1")->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(As("beta-token-1")->GetServerInfo().status().code(),
            absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE((*stream)->Send(message.input).ok());
  EXPECT_EQ((*stream)->Receive().status().code(), absl::StatusCode::kUnauthenticated);

  std::ofstream(tokens_file_) << "alpha 12345\n";
  ASSERT_TRUE(server_->WaitForLine("does not parse", absl::Seconds(10)).has_value())
      << server_->Output();
  EXPECT_TRUE(As("alpha-token-2")->GetServerInfo().ok());
  EXPECT_THAT(server_->Output(), HasSubstr("line 1: the hash has 5 characters"));
}

TEST_F(AuthTest, ARotatedServerCertificateReachesNewConnections) {
  // The server's certificate and key are copies, so the test can rotate them.
  const std::string cert = TempPath("rotated_server.pem"), key = TempPath("rotated_server.key");
  testing::ReplaceFile(Cert("server.pem"), cert);
  testing::ReplaceFile(Cert("server.key"), key);
  ASSERT_NO_FATAL_FAILURE(Start({"--tls_cert_file=" + cert, "--tls_key_file=" + key}));
  ASSERT_TRUE(Connect(Tls("alpha-token-1"))->GetServerInfo().ok());
  EXPECT_EQ(Connect(Tls("alpha-token-1", "", "other_ca.pem"))->GetServerInfo().status().code(),
            absl::StatusCode::kUnavailable);

  testing::ReplaceFile(Cert("other_server.key"), key);
  testing::ReplaceFile(Cert("other_server.pem"), cert);
  absl::Status rotated;
  for (int i = 0; i < 100; ++i) {
    rotated = Connect(Tls("alpha-token-1", "", "other_ca.pem"))->GetServerInfo().status();
    if (rotated.ok()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(rotated.ok()) << rotated;
  EXPECT_EQ(Connect(Tls("alpha-token-1"))->GetServerInfo().status().code(),
            absl::StatusCode::kUnavailable);
}

// The mla tool with TLS and a token from each of its sources; the token
// never in its output, nor in --help.
TEST_F(AuthTest, TheToolTakesATokenAndNeverPrintsIt) {
  ASSERT_NO_FATAL_FAILURE(Start());
  absl::StatusOr<std::string> mla = client::RunfilePath("client/mla");
  ASSERT_TRUE(mla.ok());
  const std::string token_file = TempPath("tool.token");
  std::ofstream(token_file) << "alpha-token-1\n";
  const std::vector<std::string> base = {*mla, "--target=" + server_->target(), "--tls",
                                         "--tls_ca=" + Cert("ca.pem")};
  auto run = [&](std::vector<std::string> flags) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<client::CommandResult> result = client::RunCommand(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : client::CommandResult{};
  };
  client::CommandResult result = run({"--token_file=" + token_file, "sessions", "list"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("0 sessions"));
  setenv("MLA_AUTH_TEST_TOKEN", "beta-token-1", 1);
  result = run({"--token_env=MLA_AUTH_TEST_TOKEN", "info"});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  result = run({"--token=wrong-cli-token", "info"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(result.err, HasSubstr("--token_file=PATH"));
  EXPECT_THAT(result.out + result.err, Not(HasSubstr("wrong-cli-token")));
  result = run({"--token_env=", "info"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("no token"));
  result = run({"--token=alpha-token-1", "--help"});
  EXPECT_THAT(result.out, HasSubstr("--token_file"));
  EXPECT_THAT(result.out, HasSubstr("(given, not shown)"));
  EXPECT_THAT(result.out + result.err, Not(HasSubstr("alpha-token-1")));
  EXPECT_THAT(server_->Output(), Not(HasSubstr("wrong-cli-token")));
}

TEST(AuthFlagsTest, AnAddressOtherHostsReachNeedsTlsAndAuthentication) {
  absl::StatusOr<std::string> binary = client::ServerBinary();
  ASSERT_TRUE(binary.ok());
  absl::StatusOr<std::string> certs = testing::TestCertsDir();
  ASSERT_TRUE(certs.ok()) << certs.status();
  const std::string tokens = TempPath("flags.tokens");
  testing::WriteTokensFile(tokens, kTokens);
  const std::string tls_cert = "--tls_cert_file=" + *certs + "/server.pem";
  const std::string tls_key = "--tls_key_file=" + *certs + "/server.key";
  const std::string tokens_flag = "--auth_tokens_file=" + tokens;
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--listen=0.0.0.0:0"}, "no TLS or authentication"},
           {{"--listen=0.0.0.0:0", tokens_flag}, "authentication but no TLS"},
           {{"--listen=0.0.0.0:0", tls_cert, tls_key}, "TLS but no authentication"},
           {{tls_cert}, "--tls_cert_file needs --tls_key_file"},
           {{tls_cert, "--tls_key_file=" + *certs + "/alpha.key"},
            "is not the key of the certificate"},
           {{tls_cert, tls_key, "--tls_client_ca_file=/no/such/ca.pem"},
            "--tls_client_ca_file=/no/such/ca.pem: cannot read it"},
           {{"--tls_client_ca_file=" + *certs + "/ca.pem"}, "need --tls_cert_file"},
           {{"--auth_tokens_file=/no/such/tokens"},
            "--auth_tokens_file=/no/such/tokens: cannot read it"},
       }) {
    std::vector<std::string> argv = {*binary, "--listen=127.0.0.1:0", "--metrics_port=-1"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    absl::StatusOr<client::CommandResult> result = client::RunCommand(argv);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 1) << c.message;
    EXPECT_THAT(result->err, HasSubstr(c.message));
    EXPECT_THAT(result->out, Not(HasSubstr("serving on")));
  }
  // TLS and tokens: it serves on every interface.
  absl::StatusOr<std::unique_ptr<client::TestServer>> server =
      client::TestServer::Start({"--listen=0.0.0.0:0", tls_cert, tls_key, tokens_flag});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->Output(), HasSubstr(", TLS, bearer tokens"));
}

}  // namespace
}  // namespace mla
