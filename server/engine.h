// The engine of one device: its compute backend, its paged KV pool, the
// sessions whose KV lives there, and the execution of every request that
// touches them.
//
// Attend() runs a batch of Attend messages gathered from many streams with
// as few kernel launches as the batch allows (one prologue and one decode per
// group of messages sharing head counts, RoPE kind and output flags). Every
// message is validated against the sessions before anything changes; a bad
// message fails alone with a status naming its field and leaves every session
// and the pool exactly as they were. Messages that touch a session layer whose
// rows an earlier message of the batch writes (the next position of the same
// sequence, or other tensor-parallel ranks repeating the step) run in a later
// wave of the same call, so results never depend on how requests were
// batched; the ranks that repeat a step share one wave.
//
// AppendKV() checks a request the same way, writes its rows, and advances
// every layer of the session only when the backend has written them; a
// failed launch, of either call, gives back the pages it took.
//
// The engine is a facade over one type per stage, in the order a request
// runs: the session table (session_table.h), the planners (attend_plan.h,
// append_plan.h: may it run, and what does it take?), the launcher
// (launcher.h: how it runs on the backend). The requests and answers are
// the types of requests.h.
//
// Not thread-safe: one thread (the scheduler's) makes every call.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_H_
#define MLA_OFFLOAD_SERVER_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "kernels/model_profile.h"
#include "kernels/thread_pool.h"
#include "server/append_plan.h"
#include "server/attend_plan.h"
#include "server/kv_pool.h"
#include "server/launcher.h"
#include "server/requests.h"
#include "server/session_table.h"

namespace mla {

struct EngineOptions {
  int64_t kv_blocks = 0;             // pool size in 64-token blocks
  int32_t max_position = 1 << 18;    // positions must be below this (RoPE table rows)
  int32_t max_tokens_per_message = 1024;
  absl::Duration default_idle_ttl = absl::Minutes(10);
  std::vector<const ModelProfile*> models;  // models this server accepts
  // An Attend message whose answer (out, lse and framing) would be larger is
  // refused with RESOURCE_EXHAUSTED before anything changes: the service
  // could not send it. 0: no limit.
  int64_t max_answer_bytes = 0;
  // Threads (the engine's own among them) for large host work: the top-k
  // check, the copies into the staging; 0: a quarter of the host's hardware
  // threads, 1 to 4.
  int copy_threads = 0;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ComputeBackend> backend,
                                                        const EngineOptions& options);
  ~Engine();

  absl::StatusOr<CreateSessionResult> CreateSession(const wire::CreateSessionRequestView& input,
                                                    absl::Time now);
  absl::StatusOr<AppendResult> AppendKV(const wire::AppendKVRequestView& input, absl::Time now);
  // Frees the session's blocks; returns how many.
  absl::StatusOr<int64_t> CloseSession(const std::string& session_id);
  std::vector<SessionSummary> ListSessions(absl::Time now) const;
  // Closes sessions idle for longer than their TTL; returns their ids.
  std::vector<std::string> ExpireIdle(absl::Time now);

  // Runs a batch; results[i] answers *batch[i].
  std::vector<AttendResult> Attend(const std::vector<const ReceivedAttend*>& batch, absl::Time now);

  const EngineOptions& options() const { return options_; }
  const ComputeBackend& backend() const { return *backend_; }
  int64_t kv_blocks_total() const { return pool_.total_blocks(); }
  int64_t kv_blocks_used() const { return pool_.used_blocks(); }
  int64_t num_sessions() const { return sessions_.size(); }

 private:
  Engine(std::unique_ptr<ComputeBackend> backend, KvBlockPool pool,
         std::unique_ptr<ThreadPool> host_threads, std::unique_ptr<Launcher> launcher,
         const EngineOptions& options);
  // Plans the pending messages of a batch and runs those that may run now;
  // returns those deferred to the next wave.
  std::vector<int> RunWave(const std::vector<const ReceivedAttend*>& batch,
                           const std::vector<int>& pending, absl::Time now,
                           std::vector<AttendResult>& results);
  // Launches one group and writes its answers (or its failure) into results.
  void RunGroup(const LaunchGroup& group, std::vector<AttendResult>& results);

  // Destroyed bottom-up: the launcher and the pool free backend memory, so
  // the backend goes last.
  std::unique_ptr<ComputeBackend> backend_;
  KvBlockPool pool_;
  EngineOptions options_;
  // The engine thread's helpers for large host work (the top-k check, the
  // staging copies): used by the planner and the launcher, one at a time.
  std::unique_ptr<ThreadPool> host_threads_;
  SessionTable sessions_;
  AttendPlanner attend_planner_;
  AppendPlanner append_planner_;
  std::unique_ptr<Launcher> launcher_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_H_
