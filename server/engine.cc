#include "server/engine.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

// Host threads, the engine's own among them: `asked`, or for 0 a quarter of
// the host's hardware threads, 1 to 4.
int HostThreads(int asked) {
  if (asked > 0) return asked;
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(hardware / 4, 1, 4);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ComputeBackend> backend,
                                                       const EngineOptions& options) {
  if (options.models.empty()) return absl::InvalidArgumentError("the engine needs a model");
  if (options.max_position <= 0) {
    return absl::InvalidArgumentError("max_position must be positive");
  }
  absl::StatusOr<KvBlockPool> pool = KvBlockPool::Create(*backend, options.kv_blocks);
  if (!pool.ok()) return pool.status();
  auto host_threads = std::make_unique<ThreadPool>(HostThreads(options.copy_threads));
  absl::StatusOr<std::unique_ptr<Launcher>> launcher =
      Launcher::Create(*backend, pool->view(), options.max_position, *host_threads);
  if (!launcher.ok()) return launcher.status();
  return std::unique_ptr<Engine>(new Engine(std::move(backend), *std::move(pool),
                                            std::move(host_threads), *std::move(launcher),
                                            options));
}

Engine::Engine(std::unique_ptr<ComputeBackend> backend, KvBlockPool pool,
               std::unique_ptr<ThreadPool> host_threads, std::unique_ptr<Launcher> launcher,
               const EngineOptions& options)
    : backend_(std::move(backend)),
      pool_(std::move(pool)),
      options_(options),
      host_threads_(std::move(host_threads)),
      sessions_(pool_, options.models, options.default_idle_ttl),
      attend_planner_(sessions_, pool_,
                      {options.max_position, options.max_tokens_per_message,
                       options.max_answer_bytes},
                      *host_threads_),
      append_planner_(sessions_, pool_, options.max_position),
      launcher_(std::move(launcher)) {}

Engine::~Engine() = default;

absl::StatusOr<CreateSessionResult> Engine::CreateSession(
    const wire::CreateSessionRequestView& input, absl::Time now) {
  return sessions_.Create(input, now);
}

absl::StatusOr<int64_t> Engine::CloseSession(const std::string& session_id) {
  return sessions_.Close(session_id);
}

std::vector<SessionSummary> Engine::ListSessions(absl::Time now) const {
  return sessions_.List(now);
}

std::vector<std::string> Engine::ExpireIdle(absl::Time now) { return sessions_.ExpireIdle(now); }

absl::StatusOr<AppendResult> Engine::AppendKV(const wire::AppendKVRequestView& input,
                                              absl::Time now) {
  absl::StatusOr<AppendPlan> plan = append_planner_.Plan(input);
  if (!plan.ok()) return plan.status();
  if (absl::Status status = launcher_->Append(*plan); !status.ok()) {
    // Nothing written counts (no position advanced); the pages go back.
    append_planner_.ReturnPages(*plan);
    return absl::InternalError(absl::StrCat("AppendKV failed in the backend: ", status.message()));
  }
  return AppendPlanner::Commit(*plan, now);
}

std::vector<AttendResult> Engine::Attend(const std::vector<const ReceivedAttend*>& batch,
                                         absl::Time now) {
  std::vector<AttendResult> results(batch.size());
  std::vector<int> pending(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    pending[i] = static_cast<int>(i);
    results[i].request_id = batch[i]->request.request_id;
    results[i].timing.queue_us = absl::ToDoubleMicroseconds(now - batch[i]->arrival);
  }
  while (!pending.empty()) pending = RunWave(batch, pending, now, results);
  return results;
}

std::vector<int> Engine::RunWave(const std::vector<const ReceivedAttend*>& batch,
                                 const std::vector<int>& pending, absl::Time now,
                                 std::vector<AttendResult>& results) {
  WrittenLayers written;
  std::vector<AttendPlan> plans;
  plans.reserve(pending.size());
  std::vector<int> deferred;
  const auto planning = std::chrono::steady_clock::now();
  for (int index : pending) {
    absl::StatusOr<AttendPlan> plan = attend_planner_.Plan(batch[index]->request, written);
    if (!plan.ok()) {
      results[index].status = plan.status();
    } else if (plan->defer) {
      deferred.push_back(index);
    } else {
      plan->index = index;
      plans.push_back(*std::move(plan));
    }
  }
  // Every message of the wave shares its planning time.
  const double plan_us = std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - planning)
                             .count();
  for (int index : pending) results[index].timing.plan_us += plan_us;
  for (const LaunchGroup& group : GroupForLaunch(plans)) RunGroup(group, results);
  for (AttendPlan& plan : plans) {
    if (results[plan.index].status.ok()) {
      AttendPlanner::Commit(plan, now);
    } else {
      attend_planner_.ReturnPages(plan);
    }
  }
  return deferred;
}

void Engine::RunGroup(const LaunchGroup& group, std::vector<AttendResult>& results) {
  LaunchTimes times;
  const absl::StatusOr<GroupAnswer> answer = launcher_->Run(group, times);
  const int heads = group.num_heads;
  int64_t offset = 0;  // tokens of the group's plans before this one
  for (const AttendPlan* plan : group.plans) {
    AttendResult& result = results[plan->index];
    result.timing.upload_us = times.upload_us;
    result.timing.prologue_us = times.prologue_us;
    result.timing.decode_us = times.decode_us;
    result.timing.readback_us = times.readback_us;
    result.timing.batch_tokens = static_cast<int32_t>(group.num_tokens);
    if (!answer.ok()) {
      result.status = absl::InternalError(
          absl::StrCat("the compute backend failed on this batch: ", answer.status().message()));
    } else {
      result.num_tokens = plan->num_tokens;
      result.num_heads = heads;
      result.out = answer->out + offset * heads * kRowBytes;
      if (plan->input->return_lse) result.lse = answer->lse + offset * heads * 4;
      result.keep_alive = answer->memory;
    }
    offset += plan->num_tokens;
  }
}

}  // namespace mla
