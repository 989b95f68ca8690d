// Tests of the scheduler (server/scheduler.h) over a real engine on the CPU
// backend. The engine thread is held by a queued task that waits for the
// test, so every ordering below is forced, not hoped for.
#include "server/scheduler.h"

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <string>
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

}  // namespace
}  // namespace mla
