// Tests of the scheduler (server/scheduler.h) over a real engine on the CPU
// backend. The engine thread is held by a queued task that waits for the
// test, so every ordering below is forced, not hoped for, and batches are
// gathered from a full queue.
#include "server/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <future>
#include <limits>
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
#include "server/engine/engine.h"
#include "server/engine/requests.h"
#include "server/testing/engine_hold.h"

namespace mla {
namespace {

// `batches_in_flight` 1: batches answered by the engine's finisher thread.
std::unique_ptr<Engine> NewEngine(int batches_in_flight = -1) {
  EngineOptions options;
  options.batches_in_flight = batches_in_flight;
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
  EngineHold hold(scheduler);
  scheduler.Run([&](Engine&) {
    note("task");
    finished();
    return Scheduler::Reply();
  });
  for (int i = 0; i < 2; ++i) {
    auto input = std::make_shared<ReceivedAttend>();
    input->request.request_id = i;
    input->request.segments.push_back({"no such session", 0, 1, 0, 0});
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
    wire::CreateSessionRequestView input;
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
std::shared_ptr<ReceivedAttend> Message(uint64_t id) {
  auto input = std::make_shared<ReceivedAttend>();
  input->request.request_id = id;
  input->request.segments.push_back({"no such session", 0, 1, 0, 0});
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
std::future<AttendResult> Submit(Scheduler& scheduler, std::shared_ptr<ReceivedAttend> input,
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
  // Both streams active: one batch of one message each. Queued while the
  // engine is held, so that both are in it (else b's, coming after a's
  // batch took a's, would wait the whole minute for a's next one).
  std::future<AttendResult> a0, b0;
  {
    EngineHold hold(scheduler);
    a0 = Submit(scheduler, Message(1), a);
    b0 = Submit(scheduler, Message(2), b);
  }
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

// A batch answered by the engine's finisher while the next one gathers
// (waiting for another active stream) does not stretch the batch wait: the
// next batch starts at the wait's end, not once the other stream has been
// quiet for the active window (a scheduler that took the answered batch for
// new work waited the whole window, 100 ms by default, at every such batch).
TEST(SchedulerTest, AnAnsweredBatchDoesNotStretchTheBatchWait) {
  SchedulerOptions options;
  options.batch_wait = absl::Milliseconds(50);
  options.active_stream_window = absl::Seconds(20);
  Scheduler scheduler(NewEngine(/*batches_in_flight=*/1), options);
  const auto a = std::make_shared<AttendStreamTag>();
  const auto b = std::make_shared<AttendStreamTag>();
  Submit(scheduler, Message(1), b).wait();  // b is active from now on
  std::future<AttendResult> second;
  auto slow_answer = std::make_shared<std::promise<void>>();
  {
    EngineHold hold(scheduler);
    // a's first message; its answer (on the finisher) comes 10 ms into the
    // second's batch wait, which a task between them keeps apart.
    ASSERT_TRUE(scheduler
                    .SubmitAttend(Message(2),
                                  [slow_answer](AttendResult) {
                                    std::this_thread::sleep_for(std::chrono::milliseconds(10));
                                    slow_answer->set_value();
                                  },
                                  a)
                    .ok());
    scheduler.Run([](Engine&) { return Scheduler::Reply(); });
    second = Submit(scheduler, Message(3), a);
  }
  const absl::Time start = absl::Now();
  ASSERT_EQ(second.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2))
      << "the second batch waited for the quiet stream b's active window";
  slow_answer->get_future().wait();
}

// A message of one segment claiming `tokens` tokens (the scheduler counts
// them before the engine validates anything).
std::shared_ptr<const ReceivedAttend> Claiming(const std::string& session_id, int32_t tokens,
                                               uint64_t request_id) {
  auto input = std::make_shared<ReceivedAttend>();
  input->request.request_id = request_id;
  input->request.layer = 0;
  wire::SegmentView segment;
  segment.session_id = session_id;
  segment.num_tokens = tokens;
  input->request.segments.push_back(segment);
  return input;
}

// A message claiming a negative token count makes no room in its batch for
// other messages: no batch holds more than max_batch_tokens tokens of valid
// counts, beyond a single message.
TEST(SchedulerTest, NegativeTokenCountsDoNotStretchTheBudget) {
  std::unique_ptr<Engine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  wire::CreateSessionRequestView create;
  create.model = "deepseek-v4-flash";
  create.num_heads = 4;
  absl::StatusOr<CreateSessionResult> session = engine->CreateSession(create, MonotonicNow());
  ASSERT_TRUE(session.ok()) << session.status();

  SchedulerOptions options;
  options.max_batch_tokens = 150;
  options.batch_wait = absl::Milliseconds(1);
  auto scheduler = std::make_unique<Scheduler>(std::move(engine), options);
  std::vector<BatchStats> batches;  // written on the engine thread, read after it stopped
  scheduler->SetBatchObserver([&batches](const BatchStats& stats) { batches.push_back(stats); });
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  scheduler->Run([released](Engine&) {
    released.wait();
    return Scheduler::Reply();
  });

  // Each message's valid count, in queue order: the bad one's is none. The
  // others name no session (the engine refuses them; the scheduler only
  // counts their tokens).
  std::vector<std::shared_ptr<const ReceivedAttend>> messages = {
      Claiming(session->session_id, std::numeric_limits<int32_t>::min(), 1)};
  std::vector<int64_t> valid = {0};
  for (int i = 0; i < 10; ++i) {
    messages.push_back(Claiming("no such session", 100, 2 + i));
    valid.push_back(100);
  }
  std::vector<AttendResult> results;
  for (const auto& message : messages) {
    EXPECT_TRUE(scheduler
                    ->SubmitAttend(message, [&results](AttendResult result) {
                      results.push_back(std::move(result));
                    })
                    .ok());
  }
  release.set_value();
  scheduler.reset();  // runs everything queued

  ASSERT_EQ(results.size(), messages.size());
  EXPECT_EQ(results[0].status.code(), absl::StatusCode::kInvalidArgument) << results[0].status;
  EXPECT_THAT(std::string(results[0].status.message()), ::testing::HasSubstr("num_tokens"));
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(results[i].status.code(), absl::StatusCode::kNotFound) << i << ": "
                                                                     << results[i].status;
  }
  // Batches take consecutive messages of the queue.
  size_t next = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    ASSERT_LE(next + batches[b].messages, messages.size()) << "batch " << b;
    int64_t tokens = 0;
    for (int i = 0; i < batches[b].messages; ++i) tokens += valid[next + i];
    if (batches[b].messages > 1) {
      EXPECT_LE(tokens, options.max_batch_tokens)
          << "batch " << b << ": " << batches[b].messages << " messages from message " << next;
    }
    EXPECT_GE(batches[b].tokens, 0) << "batch " << b;
    next += batches[b].messages;
  }
  EXPECT_EQ(next, messages.size());
  // 0 + 100, then one 100-token message a batch.
  EXPECT_EQ(batches.size(), 10u);
}

}  // namespace
}  // namespace mla
