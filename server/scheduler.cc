#include "server/scheduler.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/process/log.h"

namespace mla {
namespace {

// The tokens a message claims, for the batch's budget. Not yet validated
// (the engine refuses a bad count), so a negative count counts as none: it
// must not make room in the batch for others.
int64_t TokensOf(const wire::AttendRequestView& input) {
  int64_t tokens = 0;
  for (const wire::SegmentView& segment : input.segments) {
    tokens += std::max<int32_t>(segment.num_tokens, 0);
  }
  return tokens;
}

}  // namespace

Scheduler::Scheduler(std::unique_ptr<Engine> engine, const SchedulerOptions& options)
    : engine_(std::move(engine)), options_(options) {
  engine_->SetFinishedHook([this] {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      collect_ = true;
    }
    wake_.notify_one();
  });
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  // The engine's finisher may still be in the finished hook, which locks
  // mutex_: the engine (and its finisher) goes before the scheduler's own
  // members do.
  engine_.reset();
}

absl::Status Scheduler::SubmitAttend(std::shared_ptr<const ReceivedAttend> input, AttendDone done,
                                     std::shared_ptr<const AttendStreamTag> stream) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (queued_attends_ >= options_.max_queued_messages) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server's queue is full (", options_.max_queued_messages,
          " messages waiting); retry later, send fewer messages in flight, or add servers"));
    }
    const int64_t tokens = TokensOf(input->request);
    if (stream != nullptr) streams_[stream.get()] = StreamSeen{stream, options_.clock()};
    queue_.push_back(Item{std::move(input), tokens, std::move(done), std::move(stream), nullptr});
    ++queued_attends_;
  }
  wake_.notify_one();
  return absl::OkStatus();
}

void Scheduler::Run(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{nullptr, 0, nullptr, nullptr, std::move(task)});
  }
  wake_.notify_one();
}

void Scheduler::RunNext(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    next_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void Scheduler::SetBatchObserver(std::function<void(const BatchStats&)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  batch_observer_ = std::move(observer);
}

void Scheduler::SetStateObserver(std::function<void(const Engine&)> observer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_observer_ = std::move(observer);
  }
  Run([](Engine&) { return Reply(); });  // publishes the state once, from the engine thread
}

void Scheduler::SetSweepObserver(std::function<void(const Engine&)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  sweep_observer_ = std::move(observer);
}

void Scheduler::NotifyState() {
  std::function<void(const Engine&)> observer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observer = state_observer_;
  }
  if (observer) observer(*engine_);
}

int Scheduler::queued_messages() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return queued_attends_;
}

void Scheduler::Loop() {
  auto next_expiry = std::chrono::steady_clock::now();
  const auto expiry_interval = absl::ToChronoNanoseconds(options_.expiry_interval);
  std::unique_lock<std::mutex> lock(mutex_);
  const auto new_work = [&] { return stopping_ || !queue_.empty() || !next_.empty(); };
  const auto work_waiting = [&] { return collect_ || new_work(); };
  while (true) {
    wake_.wait_until(lock, next_expiry, work_waiting);
    if (collect_) {
      // Batches the engine's finisher answered: their sessions advance now.
      collect_ = false;
      lock.unlock();
      if (engine_->Collect()) NotifyState();
      lock.lock();
    }
    if (std::chrono::steady_clock::now() >= next_expiry) {
      const std::function<void(const Engine&)> sweep = sweep_observer_;
      lock.unlock();
      const std::vector<std::string> expired = engine_->ExpireIdle(options_.clock());
      if (!expired.empty()) {
        Log(LogLevel::kInfo, absl::StrCat("closed ", expired.size(), " session",
                                          expired.size() == 1 ? "" : "s",
                                          " idle past their TTL: ", absl::StrJoin(expired, ", ")));
        NotifyState();
      }
      if (sweep) sweep(*engine_);
      lock.lock();
      next_expiry = std::chrono::steady_clock::now() + expiry_interval;
    }
    Task task;
    if (!next_.empty()) {
      task = std::move(next_.front());
      next_.pop_front();
    } else if (!queue_.empty() && queue_.front().task) {
      task = std::move(queue_.front().task);
      queue_.pop_front();
    }
    if (task) {
      lock.unlock();
      engine_->Collect();  // the task sees what every answered batch did
      const Reply reply = task(*engine_);
      NotifyState();
      if (reply) reply();
      lock.lock();
      continue;
    }
    if (queue_.empty()) {
      if (stopping_) {
        // The running batches' answers go before the scheduler does.
        lock.unlock();
        engine_->Finish();
        return;
      }
      continue;
    }
    // Gather a batch: consecutive Attend messages up to the token budget,
    // waiting up to batch_wait for more to arrive behind the first.
    std::vector<Item> batch;
    int64_t tokens = 0;
    const auto deadline =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.batch_wait);
    while (true) {
      while (!queue_.empty() && queue_.front().attend &&
             (batch.empty() || tokens + queue_.front().tokens <= options_.max_batch_tokens)) {
        tokens += queue_.front().tokens;
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
        --queued_attends_;
      }
      // Blocked by a task, the token budget or read-only work.
      const bool blocked = !queue_.empty() || !next_.empty();
      if (blocked || stopping_ || tokens >= options_.max_batch_tokens) break;
      if (!OthersActive(batch)) break;
      // Not woken by answered batches (their sessions advance after this
      // batch starts): the wait ends at new work or the deadline.
      if (!wake_.wait_until(lock, deadline, new_work)) break;
    }
    lock.unlock();
    RunBatch(batch);
    lock.lock();
  }
}

bool Scheduler::OthersActive(const std::vector<Item>& batch) {
  const absl::Time quiet_since = options_.clock() - options_.active_stream_window;
  absl::flat_hash_set<const AttendStreamTag*> in_batch;
  for (const Item& item : batch) in_batch.insert(item.stream.get());
  bool others = false;
  for (auto it = streams_.begin(); it != streams_.end();) {
    const std::shared_ptr<const AttendStreamTag> stream = it->second.stream.lock();
    if (stream == nullptr || stream->cancelled.load() || it->second.last_message < quiet_since) {
      streams_.erase(it++);
      continue;
    }
    others |= !in_batch.contains(it->first);
    ++it;
  }
  return others;
}

void Scheduler::RunBatch(std::vector<Item>& batch) {
  // A cancelled stream's messages are answered without running: its client
  // is gone and would never learn what they changed.
  std::vector<Item> live;
  live.reserve(batch.size());
  for (Item& item : batch) {
    if (item.stream == nullptr || !item.stream->cancelled.load()) {
      live.push_back(std::move(item));
      continue;
    }
    AttendResult result;
    result.request_id = item.attend->request.request_id;
    result.status = absl::CancelledError(
        "the stream was cancelled before this message ran; nothing of it was applied");
    item.done(std::move(result));
  }
  if (live.empty()) return;
  const auto start = std::chrono::steady_clock::now();
  std::vector<const ReceivedAttend*> inputs;
  BatchStats stats;
  for (const Item& item : live) {
    inputs.push_back(item.attend.get());
    stats.tokens += item.tokens;
  }
  stats.messages = static_cast<int>(live.size());
  // The items (and the messages in them) stay with the batch until its
  // answers go.
  auto items = std::make_shared<std::vector<Item>>(std::move(live));
  // The state goes out once the batch's pages are taken, before any answer
  // does: whoever has one sees the pages it took.
  engine_->Start(
      std::move(inputs), options_.clock(),
      [this, items, stats, start](std::vector<AttendResult> results) {
        Answer(*items, stats, start, results);
      },
      [this] { NotifyState(); });
}

void Scheduler::Answer(std::vector<Item>& items, BatchStats stats,
                       std::chrono::steady_clock::time_point start,
                       std::vector<AttendResult>& results) {
  const absl::Time finished = options_.clock();
  stats.run_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::function<void(const BatchStats&)> observer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observer = batch_observer_;
  }
  if (observer) observer(stats);
  for (size_t i = 0; i < items.size(); ++i) {
    results[i].timing.total_us = absl::ToDoubleMicroseconds(finished - items[i].attend->arrival);
    items[i].done(std::move(results[i]));
  }
}

}  // namespace mla
