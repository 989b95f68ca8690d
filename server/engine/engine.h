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
// Batches are pipelined (EngineOptions::batches_in_flight 1): Start()
// returns while the backend still runs the batch's last wave, and the
// engine's finisher thread waits for it and hands its answers to the
// batch's callback as soon as the backend is done, batch after batch in the
// order they started, while the engine thread plans and stages the next
// batch. Sessions advance on the engine thread (Collect, which every call
// here makes first), so planning never races with a commit. A message
// touching a session layer that a running or uncollected batch writes
// waits for that batch (as for a wave), so answers are those of batches run
// one at a time. ListSessions() shows the sessions as of the last Collect.
// Every call that changes sessions first waits for the running batches.
// With batches_in_flight 0 there is no finisher: a batch is answered
// within Start.
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
// Not thread-safe: one thread (the scheduler's, the engine thread) makes
// every call, but batches_running() and SetFinishedHook() may come from any
// thread. Batch callbacks run on the finisher thread (or within Start) and
// must not call the engine.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_ENGINE_H_
#define MLA_OFFLOAD_SERVER_ENGINE_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "kernels/model_profile.h"
#include "kernels/thread_pool.h"
#include "server/engine/append_plan.h"
#include "server/engine/attend_plan.h"
#include "server/engine/kv_pool.h"
#include "server/engine/launcher.h"
#include "server/engine/requests.h"
#include "server/engine/session_table.h"

namespace mla {

struct EngineOptions {
  int64_t kv_blocks = 0;             // pool size in 64-token blocks
  int32_t max_position = 1 << 18;    // positions must be below this (RoPE table rows)
  int32_t max_tokens_per_message = 1024;
  absl::Duration default_idle_ttl = absl::Minutes(10);
  // The longest idle TTL a session may ask for (more gets this); at least
  // default_idle_ttl.
  absl::Duration max_idle_ttl = absl::Hours(1);
  std::vector<const ModelProfile*> models;  // models this server accepts
  // An Attend message whose answer (out, lse and framing) would be larger is
  // refused with RESOURCE_EXHAUSTED before anything changes: the service
  // could not send it. 0: no limit.
  int64_t max_answer_bytes = 0;
  // Threads (the engine's own among them) for large host work: the top-k
  // check, the copies into the staging; 0: a quarter of the host's hardware
  // threads, 1 to 4.
  int copy_threads = 0;
  // 1: a batch is left running on the backend when Start returns, and the
  // finisher thread answers it while the engine thread plans and stages
  // the next; 0: Start answers it. -1: 1 on a device backend, 0 on one
  // whose memory is the host's (it has done its work when a call returns:
  // nothing to overlap).
  int batches_in_flight = -1;
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<ComputeBackend> backend,
                                                        const EngineOptions& options);
  ~Engine();

  absl::StatusOr<CreateSessionResult> CreateSession(const wire::CreateSessionRequestView& input,
                                                    absl::Time now);
  // `admit` is asked about the compressed pages the append adds, once it
  // is known to be valid (AppendPlanner::Plan).
  absl::StatusOr<AppendResult> AppendKV(const wire::AppendKVRequestView& input, absl::Time now,
                                        AdmitPages admit = AdmitAnyPages);
  // Frees the session's blocks; returns how many.
  absl::StatusOr<int64_t> CloseSession(const std::string& session_id);
  std::vector<SessionSummary> ListSessions(absl::Time now) const;
  // Closes sessions idle for longer than their TTL; returns their ids. Waits
  // for the running batches (whose sessions they advance) only when some
  // session looks idle.
  std::vector<std::string> ExpireIdle(absl::Time now);

  // Results of a batch: results[i] answers the batch's i-th message.
  using BatchDone = std::function<void(std::vector<AttendResult> results)>;
  // Plans and launches a batch. `published` runs on this thread once the
  // batch's pages are taken and before any of its answers can go out;
  // `done` gets its results once the backend has finished it, on the
  // finisher thread (or within this call), and must not block. The messages
  // must outlive the next Collect after `done`.
  void Start(std::vector<const ReceivedAttend*> batch, absl::Time now, BatchDone done,
             absl::FunctionRef<void()> published = [] {});
  // Advances the sessions of the batches answered since the last Collect
  // (or gives back the pages of their failed messages); whether there were
  // any.
  bool Collect();
  // Waits until every batch started has been answered, then Collect.
  void Finish();
  // Batches started and not answered yet.
  int batches_running() const;
  // Called on the finisher thread after each batch it answers (the
  // scheduler then has the engine thread Collect).
  void SetFinishedHook(std::function<void()> hook);
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
    // Shared: the finisher calls it after handing the batch to Collect, and
    // the messages it keeps alive must last until CommitWave has run too.
    std::shared_ptr<BatchDone> done;
    std::vector<AttendPlan> plans;  // of the wave
    std::vector<LaunchGroup> groups;
    std::vector<absl::StatusOr<int64_t>> launches;  // per group: Launcher::Start's
    WrittenLayers written;  // the session layers the wave writes
    std::vector<bool> ran;  // per plan: its launch succeeded (FinishLaunches)
    bool failed = false;    // a launch failed after it started
  };

  // Plans the pending messages of `run` (those touching `written`, which
  // gains the wave's, are deferred) and starts the launches of those that
  // may run now; returns those deferred to the next wave.
  std::vector<int> StartWave(RunningBatch& run, const std::vector<int>& pending,
                             WrittenLayers& written);
  // Waits for the wave's launches and writes their answers (or failures);
  // on either thread.
  void FinishLaunches(RunningBatch& run);
  // Commits the wave's plans that ran, gives back the others' pages, clears
  // a failure the backend holds; on the engine thread.
  void CommitWave(RunningBatch& run);
  void FinisherLoop();

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
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  // Handed to the finisher, oldest first; then answered, not collected.
  std::deque<std::unique_ptr<RunningBatch>> running_;
  std::deque<std::unique_ptr<RunningBatch>> finished_;
  int answering_ = 0;  // batches taken from running_ whose callback has not returned
  bool stopping_ = false;
  std::function<void()> finished_hook_;
  std::thread finisher_;  // with batches_in_flight_ 1
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_ENGINE_H_
