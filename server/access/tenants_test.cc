#include "server/access/tenants.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/session_table.h"

namespace mla {
namespace {

using ::testing::HasSubstr;

SessionSummary Summary(const std::string& id, int64_t blocks) {
  SessionSummary summary;
  summary.session_id = id;
  summary.blocks = blocks;
  return summary;
}

TEST(TenantsTest, ForeignSessionsReadAsUnknownOnes) {
  Tenants tenants({}, /*authenticated=*/true);
  tenants.SessionCreated("alpha", "s1");
  const Caller alpha{"alpha", false}, beta{"beta", false}, ops{"ops", true};
  EXPECT_TRUE(tenants.CheckAccess(alpha, "s1", false).ok());
  const absl::Status foreign = tenants.CheckAccess(beta, "s1", false);
  EXPECT_EQ(foreign, SessionNotFound("s1"));
  EXPECT_EQ(tenants.CheckAccess(ops, "s1", false), SessionNotFound("s1"));
  EXPECT_TRUE(tenants.CheckAccess(ops, "s1", /*operator_may=*/true).ok());
  // Unknown to the book: refused as the engine would refuse it, so that no
  // session exists without an owner.
  EXPECT_EQ(tenants.CheckAccess(beta, "s2", false), SessionNotFound("s2"));
  EXPECT_EQ(tenants.CheckAccess(ops, "s2", /*operator_may=*/true), SessionNotFound("s2"));
  EXPECT_TRUE(tenants.Visible(alpha, "s1"));
  EXPECT_FALSE(tenants.Visible(beta, "s1"));
  EXPECT_TRUE(tenants.Visible(ops, "s1"));
  EXPECT_EQ(tenants.TenantOf("s1"), "alpha");
  tenants.SessionClosed("s1");
  EXPECT_FALSE(tenants.Visible(alpha, "s1"));
}

TEST(TenantsTest, SessionLimitCountsUntilClosedOrExpired) {
  TenantLimits limits;
  limits.max_sessions = 2;
  Tenants tenants(limits, /*authenticated=*/true);
  const auto none = [] { return std::vector<SessionSummary>(); };
  tenants.SessionCreated("alpha", "s1");
  tenants.SessionCreated("alpha", "s2");
  const absl::Status refused = tenants.AdmitSession("alpha", 4, none);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("tenant 'alpha' holds 2 sessions"));
  EXPECT_TRUE(tenants.AdmitSession("beta", 4, none).ok());
  tenants.SessionClosed("s1");
  EXPECT_TRUE(tenants.AdmitSession("alpha", 4, none).ok());
  tenants.SessionCreated("alpha", "s3");
  // s2 expired: the sweep forgets it.
  tenants.KeepOnly({Summary("s3", 4)});
  EXPECT_TRUE(tenants.AdmitSession("alpha", 4, none).ok());
  EXPECT_EQ(tenants.TenantOf("s2"), "");
}

TEST(TenantsTest, BlockLimitCountsTheTenantsOwnSessions) {
  TenantLimits limits;
  limits.max_kv_blocks = 100;
  Tenants tenants(limits, /*authenticated=*/true);
  tenants.SessionCreated("alpha", "a");
  tenants.SessionCreated("beta", "b");
  const auto sessions = [] { return std::vector<SessionSummary>{Summary("a", 90), Summary("b", 90)}; };
  EXPECT_TRUE(tenants.AdmitBlocks("alpha", 10, sessions).ok());
  const absl::Status refused = tenants.AdmitBlocks("alpha", 11, sessions);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("holds 90 KV blocks and this call needs 11 more"));
  EXPECT_THAT(refused.message(), HasSubstr("--max_kv_blocks_per_tenant=100"));
  EXPECT_FALSE(tenants.AdmitSession("beta", 11, sessions).ok());
}

TEST(TenantsTest, StreamLimit) {
  TenantLimits limits;
  limits.max_streams = 1;
  Tenants tenants(limits, /*authenticated=*/true);
  ASSERT_TRUE(tenants.StreamOpened("alpha").ok());
  const absl::Status refused = tenants.StreamOpened("alpha");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("--max_streams_per_tenant=1"));
  EXPECT_TRUE(tenants.StreamOpened("beta").ok());
  tenants.StreamClosed("alpha");
  EXPECT_TRUE(tenants.StreamOpened("alpha").ok());
}

// Without authentication the server is one tenant, "", that holds every
// session: unknown ids are the engine's to answer, and the per-tenant limits
// do not apply (the pool bounds the server, as before tenants).
TEST(TenantsTest, WithoutAuthenticationNothingIsRefused) {
  TenantLimits limits;
  limits.max_sessions = 1;
  limits.max_kv_blocks = 10;
  limits.max_streams = 1;
  Tenants tenants(limits, /*authenticated=*/false);
  const Caller anyone;
  EXPECT_TRUE(tenants.CheckAccess(anyone, "unknown", false).ok());
  const auto sessions = [] { return std::vector<SessionSummary>{Summary("s1", 10)}; };
  tenants.SessionCreated("", "s1");
  EXPECT_TRUE(tenants.CheckAccess(anyone, "s1", false).ok());
  EXPECT_TRUE(tenants.AdmitSession("", 4, sessions).ok());
  EXPECT_TRUE(tenants.AdmitBlocks("", 4, sessions).ok());
  ASSERT_TRUE(tenants.StreamOpened("").ok());
  EXPECT_TRUE(tenants.StreamOpened("").ok());
}

}  // namespace
}  // namespace mla
