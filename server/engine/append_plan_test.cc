// Tests of the append planner (server/engine/append_plan.h) over the session
// table and a pool in the memory of a backend that runs no kernel: every
// refusal, with its code and the field it names, changes nothing; the pages
// an append adds are asked about and taken only after every check, and go
// back when its launch fails; a commit advances every layer.
#include "server/engine/append_plan.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/geometry.h"
#include "proto/views.h"
#include "server/engine/testing/expect_error.h"
#include "server/engine/testing/messages.h"
#include "server/engine/testing/planner_stages.h"
#include "server/engine/testing/rows.h"
#include "server/engine/testing/session_model.h"
#include "server/engine/testing/spec_models.h"

namespace mla {
namespace {

using namespace engine_testing;  // NOLINT(build/namespaces): the shared test fixtures
using Code = absl::StatusCode;

std::unique_ptr<PlannerStages> NewStages(int64_t blocks, int32_t max_position = kMaxPosition) {
  StageOptions options;
  options.kv_blocks = blocks;
  options.limits.max_position = max_position;
  return PlannerStages::Create(options);
}

// Bad AppendKV requests fail with their code and field and change nothing.
TEST(AppendPlannerTest, BadRequestsChangeNothing) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 4, SinkMode::kRank, 111);
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(stages->Append(*seq, 0, 100).ok());

  // AppendKV 100..299: garbage variants of the correct request.
  auto request = [&](uint64_t seed) {
    Seq garbage = *seq;
    garbage.salt = 55555;  // rows that are not the session's
    return BuildAppend(garbage, 100, 200, seed);
  };
  auto index_of = [](const AppendRequest& r, int layer) {
    for (size_t e = 0; e < r.input.layers.size(); ++e) {
      if (r.input.layers[e].layer == layer) return static_cast<int>(e);
    }
    return -1;
  };
  struct AppendCase {
    std::string name;
    std::unique_ptr<AppendRequest> request;
    Code code;
    std::string field;
  };
  std::vector<AppendCase> cases;
  auto add = [&](std::string name, uint64_t seed, auto change, Code code, std::string field) {
    std::unique_ptr<AppendRequest> r = request(seed);
    change(*r);
    cases.push_back({std::move(name), std::move(r), code, std::move(field)});
  };
  add(
      "unknown session", 1, [](AppendRequest& r) { r.input.session_id = "x"; }, Code::kNotFound,
      "session");
  add(
      "first_position 99", 2, [](AppendRequest& r) { r.input.first_position = 99; },
      Code::kFailedPrecondition, "first_position");
  add(
      "first_position 101", 3, [](AppendRequest& r) { r.input.first_position = 101; },
      Code::kFailedPrecondition, "first_position");
  add(
      "num_positions 0", 4, [](AppendRequest& r) { r.input.num_positions = 0; },
      Code::kInvalidArgument, "num_positions");
  add(
      "a layer missing", 5, [](AppendRequest& r) { r.input.layers.pop_back(); },
      Code::kInvalidArgument, "layers");
  add(
      "a layer twice", 6, [](AppendRequest& r) { r.input.layers[7] = r.input.layers[8]; },
      Code::kInvalidArgument, "layers[layer=");
  add(
      "layer 44", 7, [](AppendRequest& r) { r.input.layers[3].layer = 44; }, Code::kInvalidArgument,
      "layers[layer=44]");
  add(
      "layer -1", 8, [](AppendRequest& r) { r.input.layers[3].layer = -1; }, Code::kInvalidArgument,
      "layers[layer=-1]");
  add(
      "swa_kv of 199 rows", 9,
      [&](AppendRequest& r) {
        const int e = index_of(r, kFlashC128a);
        r.input.layers[e].swa_kv->shape = {199, kHeadDim};
      },
      Code::kInvalidArgument, absl::StrCat("layers[layer=", kFlashC128a, "].swa_kv"));
  add(
      "swa_kv missing", 10,
      [&](AppendRequest& r) { r.input.layers[index_of(r, kFlashSwa)].swa_kv = std::nullopt; },
      Code::kInvalidArgument, absl::StrCat("layers[layer=", kFlashSwa, "].swa_kv"));
  add(
      "compressed rows one short", 11,
      [&](AppendRequest& r) {
        const int e = index_of(r, kFlashC4a);
        r.input.layers[e].compressed_kv->shape = {49, kHeadDim};
        std::vector<wire::Piece>& pieces = r.input.layers[e].compressed_kv->pieces;
        pieces = {wire::Piece(pieces.front().data(), 49 * kRowBytes)};
      },
      Code::kInvalidArgument, absl::StrCat("layers[layer=", kFlashC4a, "].compressed_kv"));
  add(
      "compressed rows missing", 12,
      [&](AppendRequest& r) {
        r.input.layers[index_of(r, kFlashC128a)].compressed_kv = std::nullopt;
      },
      Code::kInvalidArgument, absl::StrCat("layers[layer=", kFlashC128a, "].compressed_kv"));
  add(
      "compressed rows from row 24", 13,
      [&](AppendRequest& r) { r.input.layers[index_of(r, kFlashC4a)].first_compressed_row = 24; },
      Code::kInvalidArgument, absl::StrCat("layers[layer=", kFlashC4a, "].compressed_kv"));
  add(
      "compressed rows on an SWA layer", 14,
      [&](AppendRequest& r) {
        const int e = index_of(r, kFlashMtpSwa);
        r.compressed[e] = Rows(14, 3);
        r.input.layers[e].compressed_kv =
            Tensor(wire::DType::kBf16, {3, kHeadDim}, r.compressed[e], 14);
      },
      Code::kInvalidArgument, absl::StrCat("layers[layer=", kFlashMtpSwa, "].compressed_kv"));
  add(
      "swa_kv as f32", 15,
      [&](AppendRequest& r) {
        r.input.layers[index_of(r, kFlashSwa)].swa_kv->dtype = wire::DType::kF32;
      },
      Code::kInvalidArgument, "swa_kv");
  add(
      "beyond max_position", 16, [](AppendRequest& r) { r.input.num_positions = 4000; },
      Code::kInvalidArgument, "num_positions");
  // Where first + count would wrap int32.
  add(
      "first_position INT32_MAX", 17,
      [](AppendRequest& r) {
        r.input.first_position = kInt32Max;
        r.input.num_positions = 1;
      },
      Code::kInvalidArgument, "first_position");
  add(
      "num_positions INT32_MAX", 18, [](AppendRequest& r) { r.input.num_positions = kInt32Max; },
      Code::kInvalidArgument, "num_positions");
  add(
      "num_positions INT32_MIN", 19, [](AppendRequest& r) { r.input.num_positions = kInt32Min; },
      Code::kInvalidArgument, "num_positions");

  for (AppendCase& c : cases) {
    const StageState before = stages->State(kT0 + absl::Seconds(3));
    ExpectError(stages->append_planner().Plan(c.request->input).status(), c.code, c.field, c.name);
    EXPECT_EQ(stages->State(kT0 + absl::Seconds(3)), before) << c.name;
  }
  ASSERT_TRUE(stages->Append(*seq, 100, 200).ok());
  stages->ExpectListed({seq.get()});
  for (int layer : {kFlashSwa, kFlashC4a, kFlashC128a}) {
    MessageOptions o;
    o.seed = 11100 + layer;
    auto m = Build(layer, {{seq.get(), 300}}, o);
    ASSERT_TRUE(stages->Attend(*m).ok()) << "layer " << layer;
  }

  // AppendKV must continue every layer: after an Attend in one layer only,
  // the positions disagree.
  const std::unique_ptr<AppendRequest> behind = BuildAppend(*seq, 300, 10, 3);
  const StageState before_behind = stages->State();
  ExpectError(stages->append_planner().Plan(behind->input).status(), Code::kFailedPrecondition,
              "first_position", "layers at different positions");
  EXPECT_EQ(stages->State(), before_behind);
}

// Positions must stay below the server's max position.
TEST(AppendPlannerTest, PositionsBeyondMaxPosition) {
  std::unique_ptr<PlannerStages> stages = NewStages(400, /*max_position=*/300);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 4, SinkMode::kWhole, 101);
  ASSERT_NE(seq, nullptr);
  const std::unique_ptr<AppendRequest> too_long = BuildAppend(*seq, 0, 301, 1);
  StageState before = stages->State();
  ExpectError(stages->append_planner().Plan(too_long->input).status(), Code::kInvalidArgument,
              "position", "append beyond max_position");
  EXPECT_EQ(stages->State(), before);
  ASSERT_TRUE(stages->Append(*seq, 0, 298).ok());
  ASSERT_TRUE(stages->Append(*seq, 298, 2).ok()) << "the last positions";
  const std::unique_ptr<AppendRequest> at_end = BuildAppend(*seq, 300, 1, 2);
  before = stages->State();
  ExpectError(stages->append_planner().Plan(at_end->input).status(), Code::kInvalidArgument,
              "position", "append at max_position");
  EXPECT_EQ(stages->State(), before);
  stages->ExpectListed({seq.get()});
}

// first_compressed_row says where the rows a layer brings start; with no
// rows to bring it means nothing, and whatever it holds is accepted.
TEST(AppendPlannerTest, FirstCompressedRowIsIgnoredWithoutRows) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> a = stages->NewSeq(kFlash, 4, SinkMode::kWhole, 181);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(stages->Append(*a, 0, 256).ok());
  // 256..258 complete no compressed row (C4A's row 64 is due at 259, C128A's
  // row 2 at 383); 259..263 complete C4A rows 64 and 65, no C128A row.
  EXPECT_EQ(stages->Append(*a, 256, 3, kT0, GarbageFirstCompressedRows({4, 128})), absl::OkStatus())
      << "no rows";
  EXPECT_EQ(stages->Append(*a, 259, 5, kT0, GarbageFirstCompressedRows({128})), absl::OkStatus())
      << "no C128A rows";
  stages->ExpectListed({a.get()});
}

// The pages an append adds are asked about (a tenant's limit) after every
// check and before any is taken; a refusal there, or a pool without them,
// takes none. 100 positions bring rows 0..24 of each of flash's 21 C4A
// layers, a page each, and no C128A row.
TEST(AppendPlannerTest, NewPagesAreAdmittedAndTakenAllAtOnce) {
  constexpr int64_t kRings = 44 * 4, kC4aLayers = 21;
  std::unique_ptr<PlannerStages> stages = NewStages(kRings + kC4aLayers - 1);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 4, SinkMode::kNone, 191);
  ASSERT_NE(seq, nullptr);
  const std::unique_ptr<AppendRequest> request = BuildAppend(*seq, 0, 100, 7);
  const StageState before = stages->State();
  std::vector<int64_t> asked;
  auto refuse = [&](int64_t pages) {
    asked.push_back(pages);
    return absl::ResourceExhaustedError("tenant over its KV block limit");
  };
  ExpectError(stages->append_planner().Plan(request->input, refuse).status(),
              Code::kResourceExhausted, "tenant over its KV block limit", "refused pages");
  EXPECT_EQ(asked, std::vector<int64_t>{kC4aLayers});
  EXPECT_EQ(stages->State(), before);
  // A request that fails a check is not asked about.
  const std::unique_ptr<AppendRequest> bad = BuildAppend(*seq, 1, 100, 8);
  EXPECT_EQ(stages->append_planner().Plan(bad->input, refuse).status().code(),
            Code::kFailedPrecondition);
  EXPECT_EQ(asked.size(), 1u);
  // Admitted, but one page short: none taken.
  ExpectError(stages->append_planner().Plan(request->input).status(), Code::kResourceExhausted,
              "KV cache full", "one page short");
  EXPECT_EQ(stages->State(), before);
  // Positions 0..2 complete no compressed row (C4A's row 0 is due at 3):
  // the same pool takes them.
  ASSERT_TRUE(stages->Append(*seq, 0, 3).ok());
  stages->ExpectListed({seq.get()});
}

// A plan holds the pages it took until its launch is done: ReturnPages
// after a failed launch leaves everything as before the plan (the session's
// positions never moved), and the same request then runs and commits:
// every layer at its end, the compressed rows its positions complete, the
// session used at the commit's time.
TEST(AppendPlannerTest, ReturnedPagesLeaveTheSessionAsBefore) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kPro, 8, SinkMode::kNone, 192);
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(stages->Append(*seq, 0, 200).ok());
  const StageState before = stages->State();
  const std::unique_ptr<AppendRequest> request = BuildAppend(*seq, 200, 60, 9);
  absl::StatusOr<AppendPlan> plan = stages->append_planner().Plan(request->input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->first, 200);
  EXPECT_EQ(plan->end, 260);
  EXPECT_EQ(plan->SwaFrom(), 200);
  // 260 positions: C4A rows 0..64, a second page on each of pro's 30 C4A
  // layers; C128A rows 0..1 fit the page each of its layers has.
  EXPECT_EQ(stages->pool().used_blocks(), before.outside.used + 30);
  stages->append_planner().ReturnPages(*plan);
  EXPECT_EQ(stages->State(), before);

  ASSERT_TRUE(stages->Append(*seq, 200, 60, kT0 + absl::Seconds(4)).ok());
  stages->ExpectListed({seq.get()});
  absl::StatusOr<Session*> session = stages->sessions().Find(seq->id);
  ASSERT_TRUE(session.ok());
  EXPECT_EQ((*session)->last_used, kT0 + absl::Seconds(4));
  for (int layer = 0; layer < seq->spec->layers(); ++layer) {
    const LayerKv& kv = (*session)->layers[layer];
    EXPECT_EQ(kv.next_position, 260) << layer;
    EXPECT_EQ(kv.compressed_rows, seq->ratio(layer) == 0 ? 0 : 260 / seq->ratio(layer)) << layer;
  }
}

}  // namespace
}  // namespace mla
