#include "server/engine/testing/planner_stages.h"

#include <utility>

#include "gtest/gtest.h"
#include "kernels/model_profile.h"
#include "server/engine/testing/spec_models.h"

namespace mla::engine_testing {
namespace {

std::vector<const ModelProfile*> BothModels() {
  std::vector<const ModelProfile*> models;
  for (const char* name : {kFlash, kPro}) models.push_back(*FindModelProfile(name));
  return models;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const StageState& state) {
  return os << state.outside << "; layers " << ::testing::PrintToString(state.layers);
}

std::unique_ptr<PlannerStages> PlannerStages::Create(const StageOptions& options) {
  auto backend = std::make_unique<MemoryOnlyBackend>();
  absl::StatusOr<KvBlockPool> pool = KvBlockPool::Create(*backend, options.kv_blocks);
  EXPECT_TRUE(pool.ok()) << pool.status();
  if (!pool.ok()) return nullptr;
  return std::unique_ptr<PlannerStages>(
      new PlannerStages(std::move(backend), *std::move(pool), options));
}

PlannerStages::PlannerStages(std::unique_ptr<MemoryOnlyBackend> backend, KvBlockPool pool,
                             const StageOptions& options)
    : backend_(std::move(backend)),
      pool_(std::move(pool)),
      threads_(options.threads),
      sessions_(pool_, BothModels(), options.default_idle_ttl, options.max_idle_ttl),
      attend_planner_(sessions_, pool_, options.limits, threads_),
      append_planner_(sessions_, pool_, options.limits.max_position) {}

std::unique_ptr<Seq> PlannerStages::NewSeq(absl::string_view model, int heads, SinkMode sinks,
                                           uint64_t salt, int idle_ttl_seconds, absl::Time now,
                                           const std::vector<float>& sink_values) {
  return CreateSeq(
      [&](const wire::CreateSessionRequestView& input) { return sessions_.Create(input, now); },
      model, heads, sinks, salt, idle_ttl_seconds, sink_values);
}

absl::Status PlannerStages::Append(Seq& seq, int32_t first, int32_t count, absl::Time now,
                                   const std::function<void(AppendRequest&)>& change) {
  return AppendSeq(
      [&](const wire::AppendKVRequestView& input) -> absl::StatusOr<AppendResult> {
        absl::StatusOr<AppendPlan> plan = append_planner_.Plan(input);
        if (!plan.ok()) return plan.status();
        return AppendPlanner::Commit(*plan, now);
      },
      seq, first, count, change);
}

const ReceivedAttend& PlannerStages::Receive(const Message& m, std::optional<AnswerRegions> regions,
                                             AdmitAttendPages admit) {
  return received_.emplace_back(
      ReceivedAttend{m.input, m.arrival, std::move(regions), std::move(admit)});
}

absl::StatusOr<AttendPlan> PlannerStages::PlanAlone(const Message& m,
                                                    std::optional<AnswerRegions> regions) {
  WrittenLayers written;
  return attend_planner_.Plan(Receive(m, std::move(regions)), written);
}

absl::Status PlannerStages::Attend(const Message& m, absl::Time now) {
  absl::StatusOr<AttendPlan> plan = PlanAlone(m);
  if (!plan.ok()) return plan.status();
  AttendPlanner::Commit(*plan, now);
  Advance(m);
  return absl::OkStatus();
}

Snapshot PlannerStages::Snap(absl::Time now) const {
  return engine_testing::Snap(pool_.used_blocks(), sessions_.size(), sessions_.List(now));
}

StageState PlannerStages::State(absl::Time now) {
  StageState state{Snap(now), {}};
  for (const SessionSummary& summary : sessions_.List(now)) {
    absl::StatusOr<Session*> session = sessions_.Find(summary.session_id);
    if (!session.ok()) continue;
    std::vector<StageState::Layer>& layers = state.layers[summary.session_id];
    for (const LayerKv& layer : (*session)->layers) {
      layers.emplace_back(layer.next_position, layer.compressed_rows, layer.compressed_blocks);
    }
  }
  return state;
}

void PlannerStages::ExpectListed(const std::vector<const Seq*>& seqs) const {
  engine_testing::ExpectListed(sessions_.List(kT0), pool_.used_blocks(), seqs);
}

}  // namespace mla::engine_testing
