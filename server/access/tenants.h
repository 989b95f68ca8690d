// The tenants of one server: which tenant holds each session, and the
// limits of one tenant (sessions, KV blocks, open streams).
//
// A session belongs to the tenant that created it. To every other tenant it
// is NOT_FOUND with the very message of a session that does not exist
// (SessionNotFound), so that existence never leaks; an operator may list
// and close every tenant's sessions, but attends and appends only to its
// own. Without authentication every caller is the one tenant "", which
// holds every session, so nothing changes for a server on loopback. With
// authentication a session id this book does not know is NOT_FOUND too.
//
// Limits apply only with authentication: an unauthenticated server is one
// tenant, bounded by its pool and its server-wide limits as it was before
// tenants (a loopback benchmark may hold more sessions and streams than one
// tenant may). With authentication a call that would take a tenant past
// one is RESOURCE_EXHAUSTED,
// naming the limit, the server flag that sets it and what to do, and the
// caller checks before it changes anything. KV blocks are those of the
// tenant's sessions as the engine reports them (SessionSummary::blocks); a
// CreateSession, an AppendKV or an Attend message (the pages its new
// compressed rows need, ReceivedAttend::admit_pages) that would pass the
// limit is refused. The messages of one batch are each checked against the
// blocks before the batch, so one batch may pass the limit by its own
// pages.
//
// Thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ACCESS_TENANTS_H_
#define MLA_OFFLOAD_SERVER_ACCESS_TENANTS_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "server/access/auth.h"
#include "server/engine/requests.h"

namespace mla {

// Per authenticated tenant; unused without authentication.
struct TenantLimits {
  int max_sessions = 1024;    // sessions a tenant holds at once
  int64_t max_kv_blocks = 0;  // KV blocks of its sessions; 0: only the pool's size
  int max_streams = 1024;     // Attend and Echo streams it has open at once
};

class Tenants {
 public:
  // `authenticated`: callers are authenticated tenants (the server has
  // tokens or client certificates).
  Tenants(const TenantLimits& limits, bool authenticated)
      : limits_(limits), authenticated_(authenticated) {}

  // OK when `caller` may use session `session_id`: its own, or any with
  // `operator_may` and an operator caller; otherwise (another tenant's, or
  // one this book does not know) SessionNotFound, the engine's answer for an
  // unknown id, so that no path can use a session without an owner. Without
  // authentication always OK (the engine answers).
  absl::Status CheckAccess(const Caller& caller, const std::string& session_id,
                           bool operator_may) const;
  // Whether `caller` sees `session_id` in ListSessions.
  bool Visible(const Caller& caller, const std::string& session_id) const;
  // The tenant holding `session_id` ("" when unknown).
  std::string TenantOf(const std::string& session_id) const;

  // RESOURCE_EXHAUSTED when `tenant` may not create one more session that
  // takes `new_blocks`, or add `new_blocks` to its sessions (AdmitBlocks);
  // `sessions` gives the engine's list, for the tenant's blocks now (called
  // only with a block limit).
  absl::Status AdmitSession(const std::string& tenant, int64_t new_blocks,
                            absl::FunctionRef<std::vector<SessionSummary>()> sessions) const;
  absl::Status AdmitBlocks(const std::string& tenant, int64_t new_blocks,
                           absl::FunctionRef<std::vector<SessionSummary>()> sessions) const;
  void SessionCreated(const std::string& tenant, const std::string& session_id);
  void SessionClosed(const std::string& session_id);
  // Forgets sessions not in `live` (closed by their idle TTL).
  void KeepOnly(const std::vector<SessionSummary>& live);

  // RESOURCE_EXHAUSTED at the stream limit; otherwise counts the stream
  // until StreamClosed. Admit* and StreamOpened are always OK without
  // authentication.
  absl::Status StreamOpened(const std::string& tenant);
  void StreamClosed(const std::string& tenant);

 private:
  int64_t BlocksOf(const std::string& tenant, const std::vector<SessionSummary>& sessions) const;

  const TenantLimits limits_;
  const bool authenticated_;
  mutable std::mutex mutex_;
  std::map<std::string, std::string> owners_;  // tenant, by session id
  std::map<std::string, int> sessions_;        // count, by tenant
  std::map<std::string, int> streams_;         // open, by tenant
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ACCESS_TENANTS_H_
