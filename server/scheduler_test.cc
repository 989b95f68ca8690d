// Tests of the scheduler (server/scheduler.h) over a real engine on the CPU
// backend. The engine thread is held by a task until the test has queued
// everything, so that every batch is gathered from a full queue and the
// batches do not depend on timing.
#include "server/scheduler.h"

#include <algorithm>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/model_profile.h"
#include "server/engine.h"
#include "server/requests.h"

namespace mla {
namespace {

std::unique_ptr<Engine> NewEngine() {
  EngineOptions options;
  options.kv_blocks = 200;  // one V4-Flash session
  options.max_position = 4096;
  options.models.push_back(*FindModelProfile("deepseek-v4-flash"));
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::make_unique<CpuBackend>(1), options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

// A message of one segment claiming `tokens` tokens (the scheduler counts
// them before the engine validates anything).
std::shared_ptr<const AttendInput> Claiming(const std::string& session_id, int32_t tokens,
                                            uint64_t request_id) {
  auto input = std::make_shared<AttendInput>();
  input->request_id = request_id;
  input->layer = 0;
  SegmentInput segment;
  segment.session_id = session_id;
  segment.num_tokens = tokens;
  input->segments.push_back(segment);
  return input;
}

// A message claiming a negative token count makes no room in its batch for
// other messages: no batch holds more than max_batch_tokens tokens of valid
// counts, beyond a single message.
TEST(SchedulerTest, NegativeTokenCountsDoNotStretchTheBudget) {
  std::unique_ptr<Engine> engine = NewEngine();
  ASSERT_NE(engine, nullptr);
  CreateSessionInput create;
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
  std::vector<std::shared_ptr<const AttendInput>> messages = {
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
