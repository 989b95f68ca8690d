#include "server/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
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
      sessions_(pool_, options.models, options.default_idle_ttl, options.max_idle_ttl),
      attend_planner_(sessions_, pool_,
                      {options.max_position, options.max_tokens_per_message,
                       options.max_answer_bytes},
                      *host_threads_),
      append_planner_(sessions_, pool_, options.max_position),
      launcher_(std::move(launcher)),
      batches_in_flight_(options.batches_in_flight >= 0 ? options.batches_in_flight
                         : backend_->host_accessible() ? 0
                                                       : 1) {
  if (batches_in_flight_ > 0) finisher_ = std::thread([this] { FinisherLoop(); });
}

Engine::~Engine() {
  Finish();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (finisher_.joinable()) finisher_.join();
}

absl::StatusOr<CreateSessionResult> Engine::CreateSession(
    const wire::CreateSessionRequestView& input, absl::Time now) {
  Finish();
  return sessions_.Create(input, now);
}

absl::StatusOr<int64_t> Engine::CloseSession(const std::string& session_id) {
  Finish();
  return sessions_.Close(session_id);
}

std::vector<SessionSummary> Engine::ListSessions(absl::Time now) const {
  return sessions_.List(now);
}

std::vector<std::string> Engine::ExpireIdle(absl::Time now) {
  // Most sweeps find none idle; those keep the pipeline running.
  Collect();
  if (!sessions_.AnyIdle(now)) return {};
  Finish();
  return sessions_.ExpireIdle(now);
}

absl::StatusOr<AppendResult> Engine::AppendKV(const wire::AppendKVRequestView& input,
                                              absl::Time now, AdmitPages admit) {
  Finish();
  absl::StatusOr<AppendPlan> plan = append_planner_.Plan(input, admit);
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
  std::vector<AttendResult> results;
  std::mutex mutex;
  Start(batch, now, [&](std::vector<AttendResult> done) {
    std::lock_guard<std::mutex> lock(mutex);
    results = std::move(done);
  });
  Finish();
  std::lock_guard<std::mutex> lock(mutex);
  return results;
}

void Engine::Start(std::vector<const ReceivedAttend*> batch, absl::Time now, BatchDone done,
                   absl::FunctionRef<void()> published) {
  auto run = std::make_unique<RunningBatch>();
  run->batch = std::move(batch);
  run->results.resize(run->batch.size());
  run->now = now;
  run->done = std::make_shared<BatchDone>(std::move(done));
  std::vector<int> pending(run->batch.size());
  for (size_t i = 0; i < run->batch.size(); ++i) {
    pending[i] = static_cast<int>(i);
    run->results[i].request_id = run->batch[i]->request.request_id;
    run->results[i].timing.queue_us = absl::ToDoubleMicroseconds(now - run->batch[i]->arrival);
  }
  // What the running batches write waits for them, like an earlier wave's;
  // the finished ones advance their sessions first. In one look: a batch
  // that finishes meanwhile is still counted as running.
  WrittenLayers written;
  std::deque<std::unique_ptr<RunningBatch>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished.swap(finished_);
    for (const std::unique_ptr<RunningBatch>& running : running_) {
      written.insert(running->written.begin(), running->written.end());
    }
  }
  for (const std::unique_ptr<RunningBatch>& batch_done : finished) CommitWave(*batch_done);
  while (true) {
    pending = StartWave(*run, pending, written);
    if (pending.empty()) break;
    // The deferred wait for the batches before and for this wave.
    Finish();
    FinishLaunches(*run);
    CommitWave(*run);
    written.clear();
  }
  published();
  if (batches_in_flight_ == 0) {
    FinishLaunches(*run);
    CommitWave(*run);
    (*run->done)(std::move(run->results));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.push_back(std::move(run));
  }
  changed_.notify_all();
}

bool Engine::Collect() {
  std::deque<std::unique_ptr<RunningBatch>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished.swap(finished_);
  }
  for (const std::unique_ptr<RunningBatch>& run : finished) CommitWave(*run);
  return !finished.empty();
}

void Engine::Finish() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return running_.empty() && answering_ == 0; });
  }
  Collect();
}

int Engine::batches_running() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(running_.size());
}

void Engine::SetFinishedHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  finished_hook_ = std::move(hook);
}

void Engine::FinisherLoop() {
  while (true) {
    RunningBatch* run = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || !running_.empty(); });
      if (running_.empty()) return;
      run = running_.front().get();
    }
    FinishLaunches(*run);
    // Collectable before its answers go: whoever has one and then asks
    // (ListSessions runs Collect first) sees the sessions it advanced.
    std::vector<AttendResult> results = std::move(run->results);
    const std::shared_ptr<BatchDone> done = run->done;
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      finished_.push_back(std::move(running_.front()));
      running_.pop_front();
      ++answering_;
      hook = finished_hook_;
    }
    if (hook) hook();
    (*done)(std::move(results));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --answering_;
    }
    changed_.notify_all();
  }
}

std::vector<int> Engine::StartWave(RunningBatch& run, const std::vector<int>& pending,
                                   WrittenLayers& written) {
  run.plans.clear();
  run.plans.reserve(pending.size());
  run.written.clear();
  std::vector<int> deferred;
  const auto planning = std::chrono::steady_clock::now();
  for (int index : pending) {
    absl::StatusOr<AttendPlan> plan = attend_planner_.Plan(*run.batch[index], written);
    if (!plan.ok()) {
      run.results[index].status = plan.status();
    } else if (plan->defer) {
      deferred.push_back(index);
    } else {
      plan->index = index;
      run.plans.push_back(*std::move(plan));
    }
  }
  // Every message of the wave shares its planning time.
  const double plan_us = std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - planning)
                             .count();
  for (int index : pending) run.results[index].timing.plan_us += plan_us;
  for (const AttendPlan& plan : run.plans) {
    for (size_t s = 0; s < plan.sessions.size(); ++s) {
      if (plan.inserts[s]) run.written.insert(SessionLayer{plan.sessions[s], plan.input->layer});
    }
  }
  run.groups = GroupForLaunch(run.plans);
  run.launches.clear();
  for (const LaunchGroup& group : run.groups) run.launches.push_back(launcher_->Start(group));
  return deferred;
}

void Engine::FinishLaunches(RunningBatch& run) {
  run.ran.assign(run.plans.size(), false);
  for (size_t g = 0; g < run.groups.size(); ++g) {
    const LaunchGroup& group = run.groups[g];
    LaunchTimes times;
    const absl::StatusOr<GroupAnswer> answer =
        run.launches[g].ok() ? launcher_->Finish(*run.launches[g], times)
                             : absl::StatusOr<GroupAnswer>(run.launches[g].status());
    // A launch that started and then failed leaves the failure with the
    // backend, for CommitWave to clear.
    run.failed |= run.launches[g].ok() && !answer.ok();
    const int heads = group.num_heads;
    for (size_t i = 0; i < group.plans.size(); ++i) {
      const AttendPlan* plan = group.plans[i];
      AttendResult& result = run.results[plan->index];
      result.timing.upload_us = times.upload_us;
      result.timing.prologue_us = times.prologue_us;
      result.timing.decode_us = times.decode_us;
      result.timing.readback_us = times.readback_us;
      result.timing.batch_tokens = static_cast<int32_t>(group.num_tokens);
      if (!answer.ok()) {
        result.status = absl::InternalError(absl::StrCat(
            "the compute backend failed on this batch: ", answer.status().message()));
      } else {
        result.num_tokens = plan->num_tokens;
        result.num_heads = heads;
        result.fp8_output = group.fp8_output;
        if (const AnswerRegions* regions = plan->answer_regions; regions != nullptr) {
          result.out = regions->out.data;
          result.out_scales = regions->scales.data;
          result.lse = regions->lse.data;
        } else {
          result.out = answer->out[i];
          result.out_scales = answer->out_scales[i];
          if (plan->input->return_lse) result.lse = answer->lse[i];
          result.keep_alive = answer->memory;
        }
        run.ran[plan - run.plans.data()] = true;
      }
    }
  }
}

void Engine::CommitWave(RunningBatch& run) {
  for (size_t p = 0; p < run.plans.size(); ++p) {
    if (run.ran[p]) {
      AttendPlanner::Commit(run.plans[p], run.now);
    } else {
      attend_planner_.ReturnPages(run.plans[p]);
    }
  }
  // A group's plans ran or failed together.
  for (size_t g = 0; g < run.groups.size(); ++g) {
    if (!run.launches[g].ok()) continue;
    launcher_->Settle(*run.launches[g], run.ran[run.groups[g].plans.front() - run.plans.data()]);
  }
  if (run.failed) launcher_->ClearFailure().IgnoreError();
  run.failed = false;
  run.groups.clear();
  run.launches.clear();
  run.plans.clear();
  run.ran.clear();
  run.written.clear();
}

}  // namespace mla
