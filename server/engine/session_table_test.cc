// Tests of the session table (server/engine/session_table.h) over a pool in
// the memory of a backend that runs no kernel: what CreateSession refuses
// (and that a refusal takes nothing), the idle TTLs and their cap, and the
// sessions' lifetime: listed, used, expired, closed. Where a session is used
// or given compressed pages, the planners of testing/planner_stages.h do
// it, as the engine would, with no launch.
#include "server/engine/session_table.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::unique_ptr<PlannerStages> NewStages(int64_t blocks,
                                         absl::Duration idle_ttl = absl::Minutes(10)) {
  StageOptions options;
  options.kv_blocks = blocks;
  options.default_idle_ttl = idle_ttl;
  return PlannerStages::Create(options);
}

// Bad CreateSession requests fail with INVALID_ARGUMENT naming the field
// and change nothing.
TEST(SessionTableTest, BadCreateRequestsChangeNothing) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 4, SinkMode::kRank, 111);
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(stages->Append(*seq, 0, 100).ok());

  const std::vector<float> sinks_5(44 * 5, 1.0f);
  const std::vector<float> sinks_44x4(44 * 4, 1.0f);
  struct CreateCase {
    std::string name;
    wire::CreateSessionRequestView input;
    std::string field;
  };
  std::vector<CreateCase> creates;
  auto create = [&](std::string name, std::string model, int heads, std::string field) {
    wire::CreateSessionRequestView input;
    input.model = std::move(model);
    input.num_heads = heads;
    creates.push_back({std::move(name), input, std::move(field)});
    return &creates.back().input;
  };
  create("unknown model", "deepseek-v5", 4, "model");
  create("H = 0", kFlash, 0, "num_heads");
  create("H = 129 (pro)", kPro, 129, "num_heads");
  create("H = 65 (flash)", kFlash, 65, "num_heads");
  create("H = -4", kFlash, -4, "num_heads");
  create("sinks [44, 5] for H = 4", kFlash, 4, "sinks")->sinks =
      Tensor(wire::DType::kF32, {44, 5}, sinks_5, 1);
  create("sinks [43, 4]", kFlash, 4, "sinks")->sinks =
      Tensor(wire::DType::kF32, {43, 4}, sinks_44x4, 2);
  create("sinks as bf16", kFlash, 4, "sinks")->sinks =
      Tensor(wire::DType::kBf16, {44, 4}, sinks_44x4, 3);
  create("sinks [44, 4] for pro", kPro, 4, "sinks")->sinks =
      Tensor(wire::DType::kF32, {44, 4}, sinks_44x4, 4);
  create("negative TTL", kFlash, 4, "idle_ttl_seconds")->idle_ttl_seconds = -1;
  // A NaN or +inf sink is no logit (spec section 5: -inf is no sink): every
  // output of its head would be NaN or 0. Whole-model and per-rank shapes.
  auto with_sink = [](std::vector<float> sinks, int heads, int layer, int head, float value) {
    sinks[layer * heads + head] = value;
    return sinks;
  };
  const std::vector<float> whole_nan = with_sink(RandomSinks(5, 44 * 64), 64, 3, 17, std::nanf(""));
  const std::vector<float> whole_inf = with_sink(RandomSinks(6, 44 * 64), 64, 43, 63, kInf);
  const std::vector<float> rank_nan = with_sink(RandomSinks(7, 44 * 4), 4, 0, 0, -std::nanf(""));
  const std::vector<float> rank_inf = with_sink(RandomSinks(8, 44 * 4), 4, 20, 2, kInf);
  const std::vector<float> pro_inf = with_sink(RandomSinks(9, 62 * 128), 128, 61, 127, kInf);
  create("NaN sink, [44, 64]", kFlash, 4, "sinks[3][17]")->sinks =
      Tensor(wire::DType::kF32, {44, 64}, whole_nan, 5);
  create("+inf sink, [44, 64]", kFlash, 4, "sinks[43][63]")->sinks =
      Tensor(wire::DType::kF32, {44, 64}, whole_inf, 6);
  create("-NaN sink, [44, 4]", kFlash, 4, "sinks[0][0]")->sinks =
      Tensor(wire::DType::kF32, {44, 4}, rank_nan, 7);
  create("+inf sink, [44, 4]", kFlash, 4, "sinks[20][2]")->sinks =
      Tensor(wire::DType::kF32, {44, 4}, rank_inf, 8);
  create("+inf sink, pro [62, 128]", kPro, 16, "sinks[61][127]")->sinks =
      Tensor(wire::DType::kF32, {62, 128}, pro_inf, 9);
  for (const CreateCase& c : creates) {
    const StageState before = stages->State();
    ExpectError(stages->sessions().Create(c.input, kT0).status(),
                absl::StatusCode::kInvalidArgument, c.field, c.name);
    EXPECT_EQ(stages->State(), before) << c.name;
  }
  stages->ExpectListed({seq.get()});
}

// A pool without room for a new session's rings: RESOURCE_EXHAUSTED, no
// block taken; once another session is closed, there is room.
TEST(SessionTableTest, APoolWithoutRoomForTheRingsTakesNone) {
  // A flash session: 44 rings of 4 blocks.
  std::unique_ptr<PlannerStages> stages = NewStages(176 + 175);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> a = stages->NewSeq(kFlash, 4, SinkMode::kNone, 161);
  ASSERT_NE(a, nullptr);
  const StageState before = stages->State();
  wire::CreateSessionRequestView create;
  create.model = kFlash;
  create.num_heads = 4;
  ExpectError(stages->sessions().Create(create, kT0).status(), absl::StatusCode::kResourceExhausted,
              "KV cache full", "a second session");
  EXPECT_EQ(stages->State(), before);
  absl::StatusOr<int64_t> freed = stages->sessions().Close(a->id);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, 176);
  std::unique_ptr<Seq> b = stages->NewSeq(kFlash, 4, SinkMode::kNone, 162);
  ASSERT_NE(b, nullptr);
  stages->ExpectListed({b.get()});
}

// A session keeps its sinks in the shape they came in (every head of the
// model, or one rank's slice that every rank shares), and each of its
// layers a ring of blocks of its own.
TEST(SessionTableTest, ASessionKeepsItsSinksAndARingPerLayer) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> whole = stages->NewSeq(kFlash, 12, SinkMode::kWhole, 171);
  std::unique_ptr<Seq> rank = stages->NewSeq(kPro, 24, SinkMode::kRank, 172);
  std::unique_ptr<Seq> none = stages->NewSeq(kFlash, 4, SinkMode::kNone, 173);
  ASSERT_TRUE(whole && rank && none);
  std::set<int32_t> blocks;
  for (const Seq* seq : {whole.get(), rank.get(), none.get()}) {
    absl::StatusOr<Session*> session = stages->sessions().Find(seq->id);
    ASSERT_TRUE(session.ok()) << session.status();
    EXPECT_EQ((*session)->num_heads, seq->heads);
    EXPECT_EQ((*session)->padded_heads, seq->padded());
    EXPECT_EQ((*session)->sink_heads, seq->sink_heads);
    ASSERT_EQ((*session)->layers.size(), static_cast<size_t>(seq->spec->layers()));
    for (int layer = 0; layer < seq->spec->layers(); ++layer) {
      const int last_offset = seq->spec->h_total - seq->heads;
      for (int offset : {0, last_offset}) {
        for (int h = 0; h < seq->heads; ++h) {
          const float expected = seq->Sink(layer, offset, h);
          const float kept = (*session)->Sink(layer, offset, h);
          EXPECT_TRUE(kept == expected) << "layer " << layer << " offset " << offset << " head "
                                        << h << ": " << kept << ", sent " << expected;
        }
      }
      const LayerKv& kv = (*session)->layers[layer];
      EXPECT_EQ(kv.swa_blocks.size(), 4u);
      EXPECT_THAT(kv.compressed_blocks, IsEmpty());
      for (int32_t block : kv.swa_blocks) {
        EXPECT_TRUE(blocks.insert(block).second) << "block " << block << " held twice";
      }
    }
  }
  stages->ExpectListed({whole.get(), rank.get(), none.get()});
}

// An id the table does not hold is NOT_FOUND, saying why a session may be
// gone and what to do; the id is quoted escaped, and cut when long.
TEST(SessionTableTest, UnknownIdsAreNotFound) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  ExpectError(stages->sessions().Find("nope").status(), absl::StatusCode::kNotFound,
              "session 'nope' does not exist (closed, expired after its idle TTL, or never "
              "created on this server); create a session and append its KV again",
              "unknown id");
  const std::string long_id = "'" + std::string(99, 'x');
  const absl::Status close = stages->sessions().Close(long_id).status();
  ExpectError(close, absl::StatusCode::kNotFound,
              absl::StrCat("session '\\'", std::string(63, 'x'), "... (100 bytes)' does not exist"),
              "a long id");
  EXPECT_THAT(std::string(close.message()), ::testing::Not(HasSubstr(std::string(64, 'x'))));
  const absl::Status in_segment = InSegment(3, SessionNotFound("x"));
  EXPECT_EQ(in_segment.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(in_segment.message(), absl::StrCat("segments[3]: ", SessionNotFound("x").message()));
}

// A session that asks for a longer idle TTL than the server's cap gets the
// cap, says so, and is closed once idle past it; one that asks for less, or
// for none (the default), gets what it asked.
TEST(SessionTableTest, AnIdleTtlAboveTheCapGetsTheCap) {
  std::unique_ptr<PlannerStages> stages = NewStages(2000, /*idle_ttl=*/absl::Seconds(60));
  ASSERT_NE(stages, nullptr);
  const struct {
    int asked;
    int32_t got;
  } cases[] = {{1000000, 3600}, {100, 100}, {0, 60}, {3600, 3600}};
  std::vector<std::string> ids;
  for (const auto& c : cases) {
    wire::CreateSessionRequestView input;
    input.model = kFlash;
    input.num_heads = 4;
    input.idle_ttl_seconds = c.asked;
    absl::StatusOr<CreateSessionResult> created = stages->sessions().Create(input, kT0);
    ASSERT_TRUE(created.ok()) << created.status();
    EXPECT_EQ(created->idle_ttl_seconds, c.got) << "asked " << c.asked;
    ids.push_back(created->session_id);
  }
  // An hour and a second later every one is gone: the first did not keep
  // its million seconds.
  EXPECT_EQ(stages->sessions().ExpireIdle(kT0 + absl::Seconds(3599)).size(), 2u);
  EXPECT_EQ(stages->sessions().ExpireIdle(kT0 + absl::Seconds(3601)).size(), 2u);
  EXPECT_EQ(stages->sessions().size(), 0);
}

// Sessions listed as they are, idle since their last successful request,
// expired after their TTL, closed; a closed or expired session is gone for
// every request, and its blocks are back in the pool.
TEST(SessionTableTest, CloseExpireAndList) {
  std::unique_ptr<PlannerStages> stages = NewStages(2000, /*idle_ttl=*/absl::Seconds(60));
  ASSERT_NE(stages, nullptr);
  SessionTable& table = stages->sessions();
  EXPECT_EQ(stages->pool().used_blocks(), 0);
  EXPECT_TRUE(table.List(kT0).empty());
  std::unique_ptr<Seq> a = stages->NewSeq(kFlash, 4, SinkMode::kNone, 141, 10);
  std::unique_ptr<Seq> b = stages->NewSeq(kFlash, 4, SinkMode::kNone, 142, 10);
  std::unique_ptr<Seq> c = stages->NewSeq(kPro, 8, SinkMode::kWhole, 143);  // default 60 s
  std::unique_ptr<Seq> d = stages->NewSeq(kPro, 4, SinkMode::kNone, 144, 100);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(table.size(), 4);
  stages->ExpectListed({a.get(), b.get(), c.get(), d.get()});
  EXPECT_EQ(stages->pool().used_blocks(), 2 * 44 * 4 + 2 * 62 * 4);
  ASSERT_TRUE(stages->Append(*a, 0, 130).ok());
  ASSERT_TRUE(stages->Append(*c, 0, 300, kT0 + absl::Seconds(2)).ok());
  stages->ExpectListed({a.get(), b.get(), c.get(), d.get()});

  // a is used at +5 s: idle 7 s at +12 s, when b (idle 12 s > 10 s) expires.
  MessageOptions o;
  o.seed = 14100;
  auto m = Build(kFlashSwa, {{a.get(), 130}}, o);
  ASSERT_TRUE(stages->Attend(*m, kT0 + absl::Seconds(5)).ok());
  for (const SessionSummary& s : table.List(kT0 + absl::Seconds(12))) {
    const double expected = s.session_id == a->id ? 7 : s.session_id == c->id ? 10 : 12;
    EXPECT_DOUBLE_EQ(s.idle_seconds, expected) << s.session_id;
  }
  // A failed request does not count as use.
  auto bad = Build(kFlashSwa, {{b.get(), 5}}, o);
  EXPECT_FALSE(stages->Attend(*bad, kT0 + absl::Seconds(9)).ok());

  EXPECT_FALSE(table.AnyIdle(kT0 + absl::Seconds(10)));
  EXPECT_THAT(table.ExpireIdle(kT0 + absl::Seconds(10)), IsEmpty());
  EXPECT_TRUE(table.AnyIdle(kT0 + absl::Seconds(12)));
  const int64_t used_before = stages->pool().used_blocks();
  EXPECT_THAT(table.ExpireIdle(kT0 + absl::Seconds(12)), ElementsAre(b->id));
  EXPECT_EQ(stages->pool().used_blocks(), used_before - b->ExpectedBlocks());
  stages->ExpectListed({a.get(), c.get(), d.get()});
  EXPECT_THAT(table.ExpireIdle(kT0 + absl::Seconds(15)), IsEmpty());  // a: 10 s
  EXPECT_THAT(table.ExpireIdle(kT0 + absl::Seconds(16)), ElementsAre(a->id));
  EXPECT_THAT(table.ExpireIdle(kT0 + absl::Seconds(62)), IsEmpty());  // c: 60 s
  EXPECT_THAT(table.ExpireIdle(kT0 + absl::Seconds(63)), ElementsAre(c->id));
  stages->ExpectListed({d.get()});
  // An expired session is gone for every request.
  auto late = Build(kFlashSwa, {{a.get(), 131}}, o);
  ExpectError(stages->Attend(*late), absl::StatusCode::kNotFound, "segments[0]",
              "attend after expiry");
  ExpectError(stages->Append(*a, 131, 1), absl::StatusCode::kNotFound, "session",
              "append after expiry");
  ExpectError(table.Close(a->id).status(), absl::StatusCode::kNotFound, "session",
              "close after expiry");

  // Close frees every block; a second close is NOT_FOUND.
  const int64_t used_before_e = stages->pool().used_blocks();
  std::unique_ptr<Seq> e = stages->NewSeq(kPro, 16, SinkMode::kWhole, 145);
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE(stages->Append(*e, 0, 700).ok());
  MessageOptions eo;
  eo.seed = 14200;
  auto em = Build(kProC4a, {{e.get(), 700}}, eo);
  ASSERT_TRUE(stages->Attend(*em).ok());
  stages->ExpectListed({d.get(), e.get()});
  absl::StatusOr<int64_t> freed = table.Close(e->id);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, e->ExpectedBlocks());
  EXPECT_EQ(stages->pool().used_blocks(), used_before_e);
  ExpectError(table.Close(e->id).status(), absl::StatusCode::kNotFound, "session", "second close");
  stages->ExpectListed({d.get()});
  ASSERT_TRUE(table.Close(d->id).ok());
  EXPECT_EQ(stages->pool().used_blocks(), 0);
  EXPECT_EQ(table.size(), 0);
}

}  // namespace
}  // namespace mla
