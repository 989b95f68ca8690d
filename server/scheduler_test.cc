// Tests of the scheduler (server/scheduler.h) over a real engine on the CPU
// backend. The engine thread is held by a queued task that waits for the
// test, so every ordering below is forced, not hoped for.
#include "server/scheduler.h"

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/model_profile.h"

namespace mla {
namespace {

std::unique_ptr<Engine> NewEngine() {
  EngineOptions options;
  options.kv_blocks = 1000;
  options.max_position = 4096;
  options.models = {*FindModelProfile("deepseek-v4-flash")};
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::make_unique<CpuBackend>(1), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// Runs `work` on the engine thread and waits for it.
template <typename Work>
void RunAndWait(Scheduler& scheduler, Work work) {
  std::promise<void> done;
  scheduler.Run([&](Engine& engine) {
    work(engine);
    done.set_value();
    return Scheduler::Reply();
  });
  done.get_future().wait();
}

// Holds the engine thread until released.
class Hold {
 public:
  explicit Hold(Scheduler& scheduler) {
    scheduler.Run([this](Engine&) {
      held_.set_value();
      release_.get_future().wait();
      return Scheduler::Reply();
    });
    held_.get_future().wait();
  }
  void Release() { release_.set_value(); }

 private:
  std::promise<void> held_, release_;
};

// Read-only work queued with RunNext runs before the tasks and Attend
// batches queued before it, in the order RunNext was called.
TEST(SchedulerTest, RunNextGoesAheadOfQueuedWork) {
  Scheduler scheduler(NewEngine(), SchedulerOptions());
  std::mutex mutex;
  std::vector<std::string> order;
  auto note = [&](std::string what) {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(std::move(what));
  };
  std::promise<void> all_done;
  std::atomic<int> left{5};
  auto finished = [&] {
    if (--left == 0) all_done.set_value();
  };
  Hold hold(scheduler);
  scheduler.Run([&](Engine&) {
    note("task");
    finished();
    return Scheduler::Reply();
  });
  for (int i = 0; i < 2; ++i) {
    auto input = std::make_shared<AttendInput>();
    input->request_id = i;
    input->segments.push_back({"no such session", 0, 1, 0, 0});
    ASSERT_TRUE(scheduler
                    .SubmitAttend(input,
                                  [&, i](AttendResult) {
                                    note(absl::StrCat("attend ", i));
                                    finished();
                                  })
                    .ok());
  }
  for (int i = 0; i < 2; ++i) {
    scheduler.RunNext([&, i](Engine&) {
      note(absl::StrCat("next ", i));
      finished();
      return Scheduler::Reply();
    });
  }
  hold.Release();
  all_done.get_future().wait();
  EXPECT_THAT(order, ::testing::ElementsAre("next 0", "next 1", "task", "attend 0", "attend 1"));
}

// The engine's time is the scheduler's clock (SchedulerOptions::clock,
// monotonic by default): sessions expire when that clock passes their TTL,
// whatever the wall clock does. Here the clock stands still while real
// time passes many sweep intervals, then jumps past the TTL.
TEST(SchedulerTest, IdleExpiryFollowsTheSchedulersClock) {
  std::atomic<int64_t> now_ms{1000};
  SchedulerOptions options;
  options.expiry_interval = absl::Milliseconds(5);
  options.clock = [&now_ms] { return absl::UnixEpoch() + absl::Milliseconds(now_ms.load()); };
  Scheduler scheduler(NewEngine(), options);
  RunAndWait(scheduler, [&](Engine& engine) {
    CreateSessionInput input;
    input.model = "deepseek-v4-flash";
    input.num_heads = 8;
    input.idle_ttl_seconds = 1;
    ASSERT_TRUE(engine.CreateSession(input, scheduler.Now()).ok());
  });
  auto sessions = [&] {
    int64_t count = 0;
    RunAndWait(scheduler, [&](Engine& engine) { count = engine.num_sessions(); });
    return count;
  };
  const absl::Time wall_start = absl::Now();
  while (absl::Now() - wall_start < absl::Milliseconds(200)) {
    ASSERT_EQ(sessions(), 1) << "expired while the scheduler's clock stood still";
  }
  now_ms += 1500;
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (sessions() == 1 && absl::Now() < give_up) {
  }
  EXPECT_EQ(sessions(), 0) << "not expired 1.5 s after its 1 s TTL on the scheduler's clock";
}

// A message to no session (the engine refuses it; the scheduler batches it
// all the same).
std::shared_ptr<AttendInput> Message(uint64_t id) {
  auto input = std::make_shared<AttendInput>();
  input->request_id = id;
  input->segments.push_back({"no such session", 0, 1, 0, 0});
  return input;
}

// Batches of a scheduler, as its observer saw them.
class Batches {
 public:
  explicit Batches(Scheduler& scheduler) {
    scheduler.SetBatchObserver([this](const BatchStats& stats) {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_.push_back(stats.messages);
    });
  }
  std::vector<int> sizes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return sizes_;
  }

 private:
  std::mutex mutex_;
  std::vector<int> sizes_;
};

// Submits `input` for `stream` and returns a future of its answer.
std::future<AttendResult> Submit(Scheduler& scheduler, std::shared_ptr<AttendInput> input,
                                 std::shared_ptr<const AttendStreamTag> stream) {
  auto answer = std::make_shared<std::promise<AttendResult>>();
  std::future<AttendResult> future = answer->get_future();
  EXPECT_TRUE(scheduler
                  .SubmitAttend(std::move(input),
                                [answer](AttendResult result) { answer->set_value(std::move(result)); },
                                std::move(stream))
                  .ok());
  return future;
}

// With a batch wait of a minute, a lone stream's message runs at once: no
// other stream is active, so there is nothing to wait for (before, every
// batch waited the whole --batch_wait_us).
TEST(SchedulerTest, ALoneStreamIsNotHeldByTheBatchWait) {
  SchedulerOptions options;
  options.batch_wait = absl::Minutes(1);
  Scheduler scheduler(NewEngine(), options);
  const auto stream = std::make_shared<AttendStreamTag>();
  for (uint64_t step = 0; step < 3; ++step) {
    std::future<AttendResult> answer = Submit(scheduler, Message(step), stream);
    ASSERT_EQ(answer.wait_for(std::chrono::seconds(20)), std::future_status::ready)
        << "step " << step << " waited for streams that are not there";
    EXPECT_EQ(answer.get().request_id, step);
  }
}

// Two active streams: the first one's message waits (up to the batch wait)
// for the other's, and both run in one batch. A stream that has been quiet
// longer than the active window holds nobody.
TEST(SchedulerTest, ActiveStreamsMeetInOneBatchAndQuietOnesHoldNobody) {
  std::atomic<int64_t> now_ms{1000};
  SchedulerOptions options;
  options.batch_wait = absl::Minutes(1);
  options.active_stream_window = absl::Milliseconds(100);
  options.clock = [&now_ms] { return absl::UnixEpoch() + absl::Milliseconds(now_ms.load()); };
  Scheduler scheduler(NewEngine(), options);
  Batches batches(scheduler);
  const auto a = std::make_shared<AttendStreamTag>();
  const auto b = std::make_shared<AttendStreamTag>();
  // Both streams active: one batch of one message each.
  std::future<AttendResult> a0 = Submit(scheduler, Message(1), a);
  std::future<AttendResult> b0 = Submit(scheduler, Message(2), b);
  a0.wait();
  b0.wait();
  // a's next message is gathered and waits for b (the queue empties when it
  // is taken into the batch); then b's arrives and both run.
  std::future<AttendResult> a1 = Submit(scheduler, Message(3), a);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (scheduler.queued_messages() > 0 && absl::Now() < give_up) std::this_thread::yield();
  EXPECT_EQ(a1.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "ran without waiting for the other active stream";
  std::future<AttendResult> b1 = Submit(scheduler, Message(4), b);
  ASSERT_EQ(a1.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  b1.wait();
  // b goes quiet: a's messages no longer wait for it.
  now_ms += 1000;
  std::future<AttendResult> a2 = Submit(scheduler, Message(5), a);
  ASSERT_EQ(a2.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "waited for a quiet stream";
  const std::vector<int> sizes = batches.sizes();
  ASSERT_GE(sizes.size(), 2u);
  EXPECT_EQ(sizes[sizes.size() - 2], 2) << "a's and b's second messages ran apart";
  EXPECT_EQ(sizes.back(), 1);
}

}  // namespace
}  // namespace mla
