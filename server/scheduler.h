// The scheduler of one device: a queue in front of the engine and the one
// thread that runs it.
//
// Attend messages from every stream wait in one FIFO queue. The engine thread
// takes the message at the head and, for up to `batch_wait`, gathers the
// messages behind it until `max_batch_tokens` tokens are in hand, then runs
// them as one batch (one prologue and one decode launch per compatible
// group). Other work (create, append, close, list, info) is queued in the
// same FIFO and runs between batches, so every request sees the effects of
// all requests queued before it, and the messages of one stream run in the
// order they arrived. A full queue rejects new Attend messages at once with
// RESOURCE_EXHAUSTED rather than letting latency grow without bound; a slow
// consumer never blocks the engine, which hands each result to a callback.
//
// Read-only work (RunNext: server info, session lists) does not wait behind
// queued batches: it runs before the next batch, behind at most the batch or
// task running now. An Attend message whose stream was cancelled before its
// batch began is answered CANCELLED without running: nothing of it is applied.
//
// The batch wait: a batch waits for more messages only while another active
// stream (one that sent a message within `active_stream_window`) has none in
// it, and never longer than `batch_wait`. A lone stream is never held back;
// streams stepping through layers together meet in one batch.
//
// Pipelining: a batch is started on the engine (Engine::Start) and, while
// the backend runs it, the engine thread gathers and stages the next; the
// engine's finisher thread sends the running batch's answers as soon as the
// backend is done, and the engine thread then advances its sessions
// (Engine::Collect) before anything else runs.
//
// Thread-safe. Attend callbacks run on the engine thread or the engine's
// finisher thread, tasks on the engine thread; none may block.
#ifndef MLA_OFFLOAD_SERVER_SCHEDULER_H_
#define MLA_OFFLOAD_SERVER_SCHEDULER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/engine/engine.h"
#include "server/engine/requests.h"
#include "server/process/clock.h"

namespace mla {

struct SchedulerOptions {
  int max_batch_tokens = 1024;
  absl::Duration batch_wait = absl::Microseconds(200);  // the longest a batch waits
  absl::Duration active_stream_window = absl::Milliseconds(100);
  int max_queued_messages = 4096;
  absl::Duration expiry_interval = absl::Seconds(1);  // how often idle sessions are closed
  Clock clock = MonotonicNow;  // the engine's time: arrivals, last use, expiry
};

// One Attend stream as the scheduler sees it. The service sets `cancelled`
// when the stream's client has gone: its queued messages then do not run.
struct AttendStreamTag {
  std::atomic<bool> cancelled{false};
};

// What the scheduler reports about each batch it runs (for metrics).
struct BatchStats {
  int messages = 0;
  int64_t tokens = 0;
  double run_us = 0;
};

class Scheduler {
 public:
  using AttendDone = std::function<void(AttendResult)>;
  // A task does its work on the engine thread and returns the reply to send
  // (or nullptr). The scheduler publishes the engine state between the two,
  // so a client that has its answer sees the state the request left behind.
  using Reply = std::function<void()>;
  using Task = std::function<Reply(Engine&)>;

  Scheduler(std::unique_ptr<Engine> engine, const SchedulerOptions& options);
  // Runs everything still queued, then stops the engine thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues one Attend message of `stream` (may be null: a stream of its
  // own); `done` is called exactly once with its result unless this returns
  // an error (queue full, or stopped). When the stream is cancelled as the
  // message's batch forms, the message is answered CANCELLED and not run.
  absl::Status SubmitAttend(std::shared_ptr<const ReceivedAttend> input, AttendDone done,
                            std::shared_ptr<const AttendStreamTag> stream = nullptr);
  // Queues work that needs the engine; it runs on the engine thread, in FIFO
  // order with the Attend messages.
  void Run(Task task);
  // Queues work that only reads the engine: it runs on the engine thread
  // before any queued batch or task (in the order RunNext was called), so it
  // waits only for what runs now.
  void RunNext(Task task);
  // The time on the engine's clock (SchedulerOptions::clock).
  absl::Time Now() const { return options_.clock(); }
  // Called after every batch, on the thread that answers it.
  void SetBatchObserver(std::function<void(const BatchStats&)> observer);
  // Called on the engine thread after anything that may change the engine's
  // state (a batch started, an answered batch collected, a task, an
  // idle-session sweep), and once at the start; always before the answers
  // of that batch or task go out (a batch takes its pages when it starts).
  void SetStateObserver(std::function<void(const Engine&)> observer);
  // Called on the engine thread after every idle-session sweep (each
  // expiry_interval), for what expires with them (the service's regions).
  void SetSweepObserver(std::function<void(const Engine&)> observer);

  int queued_messages() const;

 private:
  struct Item {
    std::shared_ptr<const ReceivedAttend> attend;
    int64_t tokens = 0;
    AttendDone done;
    std::shared_ptr<const AttendStreamTag> stream;
    Task task;
  };
  struct StreamSeen {
    std::weak_ptr<const AttendStreamTag> stream;
    absl::Time last_message;
  };

  void Loop();
  // Starts a batch on the engine; Answer() sends its answers when the
  // engine has finished it.
  void RunBatch(std::vector<Item>& batch);
  void Answer(std::vector<Item>& items, BatchStats stats,
              std::chrono::steady_clock::time_point start, std::vector<AttendResult>& results);
  // Whether an active stream other than those of `batch` may still send a
  // message for it; forgets streams that ended or went quiet. With mutex_.
  bool OthersActive(const std::vector<Item>& batch);

  std::unique_ptr<Engine> engine_;
  const SchedulerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Item> queue_;
  std::deque<Task> next_;  // RunNext's, ahead of queue_
  absl::flat_hash_map<const AttendStreamTag*, StreamSeen> streams_;  // by their last message
  int queued_attends_ = 0;
  bool stopping_ = false;
  bool collect_ = false;  // the engine's finisher answered a batch
  std::function<void(const BatchStats&)> batch_observer_;
  std::function<void(const Engine&)> state_observer_;
  std::function<void(const Engine&)> sweep_observer_;
  void NotifyState();
  std::thread thread_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_SCHEDULER_H_
