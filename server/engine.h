// The engine of one device: its compute backend, its paged KV pool, the
// sessions whose KV lives there, and the execution of every request that
// touches them.
//
// Start() runs a batch of Attend messages gathered from many streams with
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
// Batches are pipelined: Start() returns while the backend still runs the
// batch's last wave (up to EngineOptions::batches_in_flight batches), so
// that the next batch is planned and staged on the host while the one
// before computes; each batch's answers go to its callback once the backend
// has finished it, batch after batch in the order they started. A message
// touching a session layer that a running batch writes waits for that batch
// (as for a wave), so answers are those of batches run one at a time. A
// running batch's sessions have not advanced yet: ListSessions() shows them
// as they were; every call that changes sessions first finishes the running
// batches.
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
// Not thread-safe: one thread (the scheduler's) makes every call; the
// callbacks run on it, from inside the engine's calls, and must not call
// the engine.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_H_
#define MLA_OFFLOAD_SERVER_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
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
  // Batches left running on the backend when Start returns, while the next
  // is staged; -1: 1 on a device backend, 0 on one whose memory is the
  // host's (it has done its work when a call returns: nothing to overlap).
  int batches_in_flight = -1;
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

  // Results of a batch: results[i] answers the batch's i-th message.
  using BatchDone = std::function<void(std::vector<AttendResult> results)>;
  // Plans and launches a batch; `done` gets its results once the backend has
  // finished it: during this call or a later one (Start, Finish, a call that
  // changes sessions, the destructor). The messages must outlive that.
  void Start(std::vector<const ReceivedAttend*> batch, absl::Time now, BatchDone done);
  // Waits for the running batches and hands out their results.
  void Finish();
  // Batches started whose results are not handed out yet.
  int batches_running() const { return static_cast<int>(running_.size()); }
  // Start, then Finish: the results of `batch`.
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
  // A batch started: its messages, their results so far, and the wave the
  // backend may still run.
  struct RunningBatch {
    std::vector<const ReceivedAttend*> batch;
    std::vector<AttendResult> results;
    absl::Time now;
    BatchDone done;
    std::vector<AttendPlan> plans;  // of the wave
    std::vector<LaunchGroup> groups;
    std::vector<absl::StatusOr<int64_t>> launches;  // per group: Launcher::Start's
    WrittenLayers written;  // the session layers the wave writes
  };

  // Plans the pending messages of `run` (those touching `written`, which
  // gains the wave's, are deferred) and starts the launches of those that
  // may run now; returns those deferred to the next wave.
  std::vector<int> StartWave(RunningBatch& run, const std::vector<int>& pending,
                             WrittenLayers& written);
  // Waits for the wave's launches, writes their answers (or failures) and
  // commits the plans that ran or gives back their pages.
  void FinishWave(RunningBatch& run);
  void FinishOldest();

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
  const int batches_in_flight_;
  std::deque<std::unique_ptr<RunningBatch>> running_;  // in the order they started
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_H_
