// The sessions of one engine, by id: created against the models the server
// serves, found, listed, closed and expired.
//
// Create checks the request (model, head count, idle TTL, sinks) before it
// takes anything, then takes the session's SWA ring blocks from the pool
// (RESOURCE_EXHAUSTED takes none); Close and ExpireIdle give every block of
// the session back. Find is NOT_FOUND, saying why a session may be gone and
// what to do, for an id the table does not hold; errors that quote a
// client's string quote it through EchoClientText. Ids are 128 random bits,
// so knowing one is what entitles a caller to the session.
//
// The table owns its sessions; a Session* stays valid until the session is
// closed or expires. The pool and the model profiles must outlive the
// table. Not thread-safe: the engine thread owns it.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_SESSION_TABLE_H_
#define MLA_OFFLOAD_SERVER_ENGINE_SESSION_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/model_profile.h"
#include "server/engine/kv_pool.h"
#include "server/engine/requests.h"
#include "server/engine/session.h"

namespace mla {

// NOT_FOUND for session `id`, saying why it may be gone and what to do: the
// answer for a session that does not exist, and for one another tenant
// holds (server/access/tenants.h), so that the two read the same.
absl::Status SessionNotFound(absl::string_view id);
// `status` (a session's refusal) for segment `s` of an Attend message: its
// code, and "segments[s]: " before its message. The planner's words for a
// session it does not know, and the service's for another tenant's.
absl::Status InSegment(size_t s, const absl::Status& status);

class SessionTable {
 public:
  // Sessions of `models`; a session created without an idle TTL of its own
  // gets `default_idle_ttl`, one that asks for more than `max_idle_ttl` gets
  // `max_idle_ttl` (a client cannot pin its KV blocks for longer), as does
  // the default. Whole seconds.
  SessionTable(KvBlockPool& pool, std::vector<const ModelProfile*> models,
               absl::Duration default_idle_ttl, absl::Duration max_idle_ttl);

  absl::StatusOr<CreateSessionResult> Create(const wire::CreateSessionRequestView& input,
                                             absl::Time now);
  absl::StatusOr<Session*> Find(const std::string& id);
  // Frees the session's blocks; returns how many.
  absl::StatusOr<int64_t> Close(const std::string& id);
  // Every session, by id.
  std::vector<SessionSummary> List(absl::Time now) const;
  // Whether some session has been idle for longer than its TTL.
  bool AnyIdle(absl::Time now) const;
  // Closes sessions idle for longer than their TTL; returns their ids.
  std::vector<std::string> ExpireIdle(absl::Time now);

  int64_t size() const { return static_cast<int64_t>(sessions_.size()); }

 private:
  absl::StatusOr<const ModelProfile*> FindModel(const std::string& name) const;

  KvBlockPool& pool_;
  std::vector<const ModelProfile*> models_;
  absl::Duration default_idle_ttl_;
  absl::Duration max_idle_ttl_;
  absl::flat_hash_map<std::string, std::unique_ptr<Session>> sessions_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_SESSION_TABLE_H_
