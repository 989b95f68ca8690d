// The engine's state and its planners without the launcher, for the stage
// tests: a KV pool, the session table serving both built-in models, and the
// attend and append planners over them, wired as Engine wires them. No row
// is ever written: a plan is committed as if its launch had succeeded, or
// its pages go back, so a test sees exactly what a stage changes.
//
// A KvBlockPool is made of backend memory, so the pool lives in a
// MemoryOnlyBackend (memory_only_backend.h), which runs no kernel. The
// messages handed to the planners (Receive) are kept as long as the stages,
// as the engine keeps a batch's until its commit. Not thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_PLANNER_STAGES_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_PLANNER_STAGES_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/thread_pool.h"
#include "server/engine/append_plan.h"
#include "server/engine/attend_plan.h"
#include "server/engine/kv_pool.h"
#include "server/engine/requests.h"
#include "server/engine/session_table.h"
#include "server/engine/testing/memory_only_backend.h"
#include "server/engine/testing/messages.h"
#include "server/engine/testing/session_model.h"

namespace mla::engine_testing {

// EngineOptions' share that the stages take.
struct StageOptions {
  int64_t kv_blocks = 1000;
  AttendLimits limits = {kMaxPosition, /*max_tokens_per_message=*/1024, /*max_answer_bytes=*/0};
  absl::Duration default_idle_ttl = absl::Minutes(10);
  absl::Duration max_idle_ttl = absl::Hours(1);
  int threads = 3;  // the top-k check of a large message runs in token ranges
};

// Everything a planner may change: the outside view (the pool's used blocks,
// the session list) and, per session id, each layer's next position,
// compressed rows and pages.
struct StageState {
  using Layer = std::tuple<int32_t, int32_t, std::vector<int32_t>>;
  Snapshot outside;
  std::map<std::string, std::vector<Layer>> layers;

  bool operator==(const StageState& other) const {
    return outside == other.outside && layers == other.layers;
  }
};

std::ostream& operator<<(std::ostream& os, const StageState& state);

class PlannerStages {
 public:
  // Null, with a test failure, if the pool cannot be made.
  static std::unique_ptr<PlannerStages> Create(const StageOptions& options = {});

  KvBlockPool& pool() { return pool_; }
  SessionTable& sessions() { return sessions_; }
  AttendPlanner& attend_planner() { return attend_planner_; }
  AppendPlanner& append_planner() { return append_planner_; }

  // CreateSession through the table (CreateSeq).
  std::unique_ptr<Seq> NewSeq(absl::string_view model, int heads, SinkMode sinks, uint64_t salt,
                              int idle_ttl_seconds = 0, absl::Time now = kT0,
                              const std::vector<float>& sink_values = {});
  // Positions first..first+count-1 of every layer, planned and committed
  // at `now` (AppendSeq).
  absl::Status Append(Seq& seq, int32_t first, int32_t count, absl::Time now = kT0,
                      const std::function<void(AppendRequest&)>& change = nullptr);

  // `m` as the scheduler hands it over, with its arrival: answered into
  // `regions` when given, `admit` asked about its new pages when set.
  const ReceivedAttend& Receive(const Message& m,
                                std::optional<AnswerRegions> regions = std::nullopt,
                                AdmitAttendPages admit = nullptr);
  // The plan of `m` alone in its wave.
  absl::StatusOr<AttendPlan> PlanAlone(const Message& m,
                                       std::optional<AnswerRegions> regions = std::nullopt);
  // `m` alone in its wave, committed at `now` if it may run (its model
  // advanced); the plan's status.
  absl::Status Attend(const Message& m, absl::Time now = kT0);

  Snapshot Snap(absl::Time now = kT0) const;
  // Not const: SessionTable::Find hands out sessions to change.
  StageState State(absl::Time now = kT0);
  void ExpectListed(const std::vector<const Seq*>& seqs) const;

 private:
  PlannerStages(std::unique_ptr<MemoryOnlyBackend> backend, KvBlockPool pool,
                const StageOptions& options);

  std::unique_ptr<MemoryOnlyBackend> backend_;
  KvBlockPool pool_;
  ThreadPool threads_;
  SessionTable sessions_;
  AttendPlanner attend_planner_;
  AppendPlanner append_planner_;
  std::deque<ReceivedAttend> received_;
};

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_PLANNER_STAGES_H_
