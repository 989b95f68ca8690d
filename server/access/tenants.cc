#include "server/access/tenants.h"

#include "absl/strings/str_cat.h"
#include "server/engine/session_table.h"

namespace mla {
namespace {

std::string Who(const std::string& tenant) { return absl::StrCat("tenant '", tenant, "'"); }

}  // namespace

absl::Status Tenants::CheckAccess(const Caller& caller, const std::string& session_id,
                                  bool operator_may) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(session_id);
  // Without authentication the one tenant holds every session, and the
  // engine answers ids it does not know.
  if (!authenticated_) return absl::OkStatus();
  if (it != owners_.end() &&
      (it->second == caller.tenant || (operator_may && caller.is_operator))) {
    return absl::OkStatus();
  }
  return SessionNotFound(session_id);
}

bool Tenants::Visible(const Caller& caller, const std::string& session_id) const {
  if (caller.is_operator) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(session_id);
  return it != owners_.end() && it->second == caller.tenant;
}

std::string Tenants::TenantOf(const std::string& session_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(session_id);
  return it == owners_.end() ? "" : it->second;
}

int64_t Tenants::BlocksOf(const std::string& tenant,
                          const std::vector<SessionSummary>& sessions) const {
  int64_t blocks = 0;
  for (const SessionSummary& summary : sessions) {
    const auto it = owners_.find(summary.session_id);
    if (it != owners_.end() && it->second == tenant) blocks += summary.blocks;
  }
  return blocks;
}

absl::Status Tenants::AdmitSession(const std::string& tenant, int64_t new_blocks,
                                   absl::FunctionRef<std::vector<SessionSummary>()> sessions) const {
  if (!authenticated_) return absl::OkStatus();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sessions_.find(tenant);
    const int held = it == sessions_.end() ? 0 : it->second;
    if (held >= limits_.max_sessions) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Who(tenant), " holds ", held, " sessions, its limit (--max_sessions_per_tenant=",
          limits_.max_sessions, "); nothing was created: close sessions it no longer uses, or "
          "ask the operator to raise --max_sessions_per_tenant"));
    }
  }
  return AdmitBlocks(tenant, new_blocks, sessions);
}

absl::Status Tenants::AdmitBlocks(const std::string& tenant, int64_t new_blocks,
                                  absl::FunctionRef<std::vector<SessionSummary>()> sessions) const {
  if (!authenticated_ || limits_.max_kv_blocks <= 0 || new_blocks <= 0) return absl::OkStatus();
  const std::vector<SessionSummary> list = sessions();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t held = BlocksOf(tenant, list);
  if (new_blocks > limits_.max_kv_blocks - held) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Who(tenant), " holds ", held, " KV blocks and this call needs ", new_blocks,
        " more, past its limit (--max_kv_blocks_per_tenant=", limits_.max_kv_blocks,
        "); nothing was changed: close sessions it no longer uses, or ask the operator to raise "
        "--max_kv_blocks_per_tenant"));
  }
  return absl::OkStatus();
}

void Tenants::SessionCreated(const std::string& tenant, const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  owners_[session_id] = tenant;
  ++sessions_[tenant];
}

void Tenants::SessionClosed(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = owners_.find(session_id);
  if (it == owners_.end()) return;
  if (--sessions_[it->second] == 0) sessions_.erase(it->second);
  owners_.erase(it);
}

void Tenants::KeepOnly(const std::vector<SessionSummary>& live) {
  std::map<std::string, std::string> kept;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const SessionSummary& summary : live) {
    const auto it = owners_.find(summary.session_id);
    if (it != owners_.end()) kept.insert(*it);
  }
  owners_ = std::move(kept);
  sessions_.clear();
  for (const auto& [id, tenant] : owners_) ++sessions_[tenant];
}

absl::Status Tenants::StreamOpened(const std::string& tenant) {
  if (!authenticated_) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mutex_);
  int& open = streams_[tenant];
  if (open >= limits_.max_streams) {
    if (open == 0) streams_.erase(tenant);
    return absl::ResourceExhaustedError(absl::StrCat(
        Who(tenant), " has ", open, " Attend and Echo streams open, its limit "
        "(--max_streams_per_tenant=", limits_.max_streams, "); end a stream first, send "
        "the sessions' steps on one stream, or ask the operator to raise "
        "--max_streams_per_tenant"));
  }
  ++open;
  return absl::OkStatus();
}

void Tenants::StreamClosed(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = streams_.find(tenant);
  if (it != streams_.end() && --it->second == 0) streams_.erase(it);
}

}  // namespace mla
