#include "server/scheduler.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace mla {
namespace {

int64_t TokensOf(const AttendInput& input) {
  int64_t tokens = 0;
  for (const SegmentInput& segment : input.segments) tokens += segment.num_tokens;
  return tokens;
}

}  // namespace

Scheduler::Scheduler(std::unique_ptr<Engine> engine, const SchedulerOptions& options)
    : engine_(std::move(engine)), options_(options), thread_([this] { Loop(); }) {}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

absl::Status Scheduler::SubmitAttend(std::shared_ptr<const AttendInput> input, AttendDone done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (queued_attends_ >= options_.max_queued_messages) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server's queue is full (", options_.max_queued_messages,
          " messages waiting); retry later, send fewer messages in flight, or add servers"));
    }
    const int64_t tokens = TokensOf(*input);
    queue_.push_back(Item{std::move(input), tokens, std::move(done), nullptr});
    ++queued_attends_;
  }
  wake_.notify_one();
  return absl::OkStatus();
}

void Scheduler::Run(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Item{nullptr, 0, nullptr, std::move(task)});
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
  while (true) {
    wake_.wait_until(lock, next_expiry, [&] { return stopping_ || !queue_.empty(); });
    if (std::chrono::steady_clock::now() >= next_expiry) {
      lock.unlock();
      if (!engine_->ExpireIdle(absl::Now()).empty()) NotifyState();
      lock.lock();
      next_expiry = std::chrono::steady_clock::now() + expiry_interval;
    }
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    if (queue_.front().task) {
      Task task = std::move(queue_.front().task);
      queue_.pop_front();
      lock.unlock();
      const Reply reply = task(*engine_);
      NotifyState();
      if (reply) reply();
      lock.lock();
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
      const bool blocked = !queue_.empty();  // by a task or the token budget
      if (blocked || stopping_ || tokens >= options_.max_batch_tokens) break;
      if (!wake_.wait_until(lock, deadline, [&] { return stopping_ || !queue_.empty(); })) break;
    }
    lock.unlock();
    RunBatch(batch);
    lock.lock();
  }
}

void Scheduler::RunBatch(std::vector<Item>& batch) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const AttendInput*> inputs;
  BatchStats stats;
  for (const Item& item : batch) {
    inputs.push_back(item.attend.get());
    stats.tokens += item.tokens;
  }
  stats.messages = static_cast<int>(batch.size());
  std::vector<AttendResult> results = engine_->Attend(inputs, absl::Now());
  const absl::Time finished = absl::Now();
  stats.run_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  std::function<void(const BatchStats&)> observer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    observer = batch_observer_;
  }
  if (observer) observer(stats);
  NotifyState();  // before the answers: whoever has one sees the pages it took
  for (size_t i = 0; i < batch.size(); ++i) {
    results[i].timing.total_us = absl::ToDoubleMicroseconds(finished - batch[i].attend->arrival);
    batch[i].done(std::move(results[i]));
  }
}

}  // namespace mla
