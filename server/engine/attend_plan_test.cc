// Tests of the attend planner (server/engine/attend_plan.h) over the session
// table and a pool in the memory of a backend that runs no kernel: every
// refusal, with its code and the field it names, and that it changes
// nothing (positions, compressed rows, pages, last use); the pages a
// message adds, asked about and taken only after every check, and given
// back; the deferral of a message to the next wave; and the launch groups.
#include "server/engine/attend_plan.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "proto/views.h"
#include "server/engine/requests.h"
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
constexpr Code kInvalid = Code::kInvalidArgument;

std::unique_ptr<PlannerStages> NewStages(int64_t blocks, int32_t max_tokens = 1024,
                                         int64_t max_answer_bytes = 0) {
  StageOptions options;
  options.kv_blocks = blocks;
  options.limits.max_tokens_per_message = max_tokens;
  options.limits.max_answer_bytes = max_answer_bytes;
  return PlannerStages::Create(options);
}

// Every bad Attend message fails with its code and a message naming the
// field, and changes nothing: the pool, the sessions' layers, their last
// use and the session layers the wave writes. The correct messages
// planned afterwards run, and take exactly the page they need.
TEST(AttendPlannerTest, BadMessagesChangeNothing) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000, /*max_tokens=*/100);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 4, SinkMode::kWhole, 81);
  std::unique_ptr<Seq> other = stages->NewSeq(kFlash, 4, SinkMode::kNone, 82);
  std::unique_ptr<Seq> pro = stages->NewSeq(kPro, 4, SinkMode::kNone, 83);
  ASSERT_TRUE(seq && other && pro);
  // At 255: C4A row 63 and C128A row 1 due.
  ASSERT_TRUE(stages->Append(*seq, 0, 255).ok());
  ASSERT_TRUE(stages->Append(*other, 0, 255).ok());
  ASSERT_TRUE(stages->Append(*pro, 0, 255).ok());

  auto good = [&](int layer, int32_t p, uint64_t seed) {
    return CorrectMessage(*seq, layer, p, seed);
  };
  auto bad = [&](int layer, int32_t p, uint64_t seed) {
    return GarbageMessage(*seq, layer, p, seed);
  };
  std::vector<BadCase> cases;
  auto add = [&](std::string name, std::unique_ptr<Message> m, Code code, std::string field) {
    cases.push_back({std::move(name), std::move(m), code, std::move(field)});
  };
  for (int layer : {kFlashC4a, kFlashC128a, kFlashSwa}) {
    const uint64_t s = 8000 + layer * 100;
    const std::string l = absl::StrCat("layer ", layer, ": ");
    add(l + "unknown session",
        With(bad(layer, 255, s + 1), [](Message& m) { m.input.segments[0].session_id = "nope"; }),
        Code::kNotFound, "segments[0]");
    add(l + "layer -1", With(bad(layer, 255, s + 2), [](Message& m) { m.input.layer = -1; }),
        kInvalid, "layer");
    add(l + "layer 44", With(bad(layer, 255, s + 3), [](Message& m) { m.input.layer = 44; }),
        kInvalid, "layer");
    add(l + "q as f32",
        With(bad(layer, 255, s + 4), [](Message& m) { m.input.q->dtype = wire::DType::kF32; }),
        kInvalid, "q");
    add(l + "q [1, 4, 256]",
        With(bad(layer, 255, s + 5),
             [](Message& m) {
               m.input.q->shape = {1, 4, 256};
             }),
        kInvalid, "q");
    add(l + "q short of bytes",
        With(bad(layer, 255, s + 6),
             [](Message& m) {
               auto& pieces = m.input.q->pieces;
               wire::Piece& largest = *std::max_element(
                   pieces.begin(), pieces.end(),
                   [](const wire::Piece& x, const wire::Piece& y) { return x.size() < y.size(); });
               largest = largest.subspan(0, largest.size() - 2);
             }),
        kInvalid, "q");
    add(l + "q with 8 heads",
        With(bad(layer, 255, s + 7),
             [](Message& m) {
               m.q = Rows(1, 8);
               m.input.q = Tensor(wire::DType::kBf16, {1, 8, kHeadDim}, m.q, 7);
             }),
        kInvalid, "q");
    add(l + "head_offset -1",
        With(bad(layer, 255, s + 8), [](Message& m) { m.input.head_offset = -1; }), kInvalid,
        "head_offset");
    add(l + "head_offset 61",
        With(bad(layer, 255, s + 9), [](Message& m) { m.input.head_offset = 61; }), kInvalid,
        "head_offset");
    add(l + "position 256 (ahead)", bad(layer, 256, s + 10), Code::kFailedPrecondition, "position");
    add(l + "position 253 (behind)", bad(layer, 253, s + 11), Code::kFailedPrecondition,
        "position");
    add(l + "position -1",
        With(bad(layer, 255, s + 12), [](Message& m) { m.input.segments[0].position = -1; }),
        kInvalid, "position");
    add(l + "no kv", With(bad(layer, 255, s + 13), [](Message& m) { m.input.kv = std::nullopt; }),
        kInvalid, "kv");
    add(l + "kv [2, 512]",
        With(bad(layer, 255, s + 14),
             [](Message& m) {
               m.input.kv->shape = {2, kHeadDim};
             }),
        kInvalid, "kv");
    add(l + "kv as i32",
        With(bad(layer, 255, s + 15), [](Message& m) { m.input.kv->dtype = wire::DType::kI32; }),
        kInvalid, "kv");
    add(l + "0 tokens",
        With(bad(layer, 255, s + 16), [](Message& m) { m.input.segments[0].num_tokens = 0; }),
        kInvalid, "num_tokens");
    add(l + "130 tokens", bad(layer, 255, s + 17), kInvalid, "num_tokens");
    cases.back().message->input.segments[0].num_tokens = 130;
    add(l + "101 tokens (the limit is 100)", GarbageMessage(*seq, layer, 255, s + 18, 101),
        kInvalid, "segments");
    add(l + "no segments",
        With(bad(layer, 255, s + 19), [](Message& m) { m.input.segments.clear(); }), kInvalid,
        "segments");
    {
      MessageOptions o;
      o.seed = s + 20;
      o.garbage = kGarbageRows;
      add(l + "session twice", Build(layer, {{seq.get(), 255}, {seq.get(), 255}}, o), kInvalid,
          "segments[1]");
      add(l + "two models", Build(layer, {{seq.get(), 255}, {pro.get(), 255}}, o), kInvalid,
          "segments[1]");
      add(l + "bad second segment", Build(layer, {{other.get(), 255}, {seq.get(), 256}}, o),
          Code::kFailedPrecondition, "segments[1].position");
      add(l + "unknown second session",
          With(Build(layer, {{other.get(), 255}, {seq.get(), 255}}, o),
               [](Message& m) { m.input.segments[1].session_id = "gone"; }),
          Code::kNotFound, "segments[1]");
    }
    add(l + "position beyond max_position",
        With(bad(layer, 255, s + 21), [](Message& m) { m.input.segments[0].position = 4096; }),
        kInvalid, "position");
    // Where int32 arithmetic on the fields would wrap. A head range that
    // wraps past INT32_MAX must not pass for one inside the model: with
    // whole-model sinks the engine would read sinks[head_offset + h].
    for (int32_t offset : {kInt32Max - 3, kInt32Max, kInt32Min}) {
      for (Seq* on : {seq.get(), other.get()}) {
        add(absl::StrCat(l, "head_offset ", offset,
                         on == seq.get() ? " (whole-model sinks)" : " (no sinks)"),
            With(GarbageMessage(*on, layer, 255, s + 22),
                 [offset](Message& m) { m.input.head_offset = offset; }),
            kInvalid, "head_offset");
      }
    }
    add(l + "position INT32_MAX",
        With(bad(layer, 255, s + 23), [](Message& m) { m.input.segments[0].position = kInt32Max; }),
        kInvalid, "position");
    for (int32_t tokens : {kInt32Min, kInt32Max}) {
      add(absl::StrCat(l, "num_tokens ", tokens),
          With(bad(layer, 255, s + 24),
               [tokens](Message& m) { m.input.segments[0].num_tokens = tokens; }),
          kInvalid, "num_tokens");
    }
    // A shape whose element count overflows int64 (2^74 bytes) does not
    // match the message's tokens and heads.
    add(l + "q [2^33, 2^31, 512]",
        With(bad(layer, 255, s + 25),
             [](Message& m) {
               m.input.q->shape = {int64_t{1} << 33, int64_t{1} << 31, kHeadDim};
             }),
        kInvalid, "q: expected");
    add(l + "num_compressed_rows INT32_MAX",
        With(bad(layer, 255, s + 36),
             [](Message& m) { m.input.segments[0].num_compressed_rows = kInt32Max; }),
        kInvalid, "num_compressed_rows");
    if (layer != kFlashSwa) {
      add(l + "compressed rows missing",
          With(bad(layer, 255, s + 30),
               [](Message& m) {
                 m.input.segments[0].num_compressed_rows = 0;
                 m.input.compressed_kv = std::nullopt;
               }),
          kInvalid, "num_compressed_rows");
      add(l + "an extra compressed row",
          With(
              bad(layer, 255, s + 31),
              [](Message& m) {
                m.input.segments[0].num_compressed_rows = 2;
                m.compressed = Rows(31, 2);
                m.input.compressed_kv = Tensor(wire::DType::kBf16, {2, kHeadDim}, m.compressed, 31);
              }),
          kInvalid, "num_compressed_rows");
      add(l + "wrong first compressed row",
          With(bad(layer, 255, s + 32),
               [](Message& m) { m.input.segments[0].first_compressed_row += 1; }),
          kInvalid, "first_compressed_row");
      add(l + "compressed_kv missing",
          With(bad(layer, 255, s + 33), [](Message& m) { m.input.compressed_kv = std::nullopt; }),
          kInvalid, "compressed_kv");
      add(l + "compressed_kv [2, 512] for one row",
          With(
              bad(layer, 255, s + 34),
              [](Message& m) {
                m.compressed = Rows(34, 2);
                m.input.compressed_kv = Tensor(wire::DType::kBf16, {2, kHeadDim}, m.compressed, 34);
              }),
          kInvalid, "compressed_kv");
      // Row numbers near INT32_MAX: rows_now + count, first + count would wrap.
      add(l + "first_compressed_row INT32_MAX with 1 row",
          With(bad(layer, 255, s + 37),
               [](Message& m) { m.input.segments[0].first_compressed_row = kInt32Max; }),
          kInvalid, "first_compressed_row/num_compressed_rows");
      // A rank repeating step 254 (the session is at 255).
      add(l + "a repeated step with num_compressed_rows INT32_MAX",
          With(bad(layer, 254, s + 38),
               [](Message& m) {
                 m.input.segments[0].first_compressed_row = 1;
                 m.input.segments[0].num_compressed_rows = kInt32Max;
               }),
          kInvalid, "first_compressed_row");
      add(l + "a repeated step with first_compressed_row INT32_MAX",
          With(
              bad(layer, 254, s + 39),
              [](Message& m) {
                m.input.segments[0].first_compressed_row = kInt32Max;
                m.input.segments[0].num_compressed_rows = 1;
                m.compressed = Rows(39, 1);
                m.input.compressed_kv = Tensor(wire::DType::kBf16, {1, kHeadDim}, m.compressed, 39);
              }),
          kInvalid, "first_compressed_row");
    } else {
      add(l + "compressed rows on an SWA-only layer",
          With(
              bad(layer, 255, s + 35),
              [](Message& m) {
                m.input.segments[0].num_compressed_rows = 1;
                m.compressed = Rows(35, 1);
                m.input.compressed_kv = Tensor(wire::DType::kBf16, {1, kHeadDim}, m.compressed, 35);
              }),
          kInvalid, "num_compressed_rows");
    }
    if (layer == kFlashC4a) {
      auto topk = [&](uint64_t seed, int width, std::vector<int32_t> values) {
        auto m = bad(layer, 255, seed);
        m->topk = std::move(values);
        m->topk_width = width;
        m->input.topk = Tensor(wire::DType::kI32, {1, width}, m->topk, seed);
        return m;
      };
      add(l + "topk row 64 of 64", topk(s + 40, 3, {0, 64, -1}), kInvalid, "topk[0][1]");
      add(l + "topk row -2", topk(s + 41, 3, {5, -1, -2}), kInvalid, "topk[0][2]");
      add(l + "topk width 513", topk(s + 42, 513, std::vector<int32_t>(513, -1)), kInvalid, "topk");
      add(l + "topk width 0", topk(s + 43, 0, {}), kInvalid, "topk");
      // [1, 2^62] int32 is 2^64 bytes: no data can match it.
      add(l + "topk [1, 2^62] without data",
          With(bad(layer, 255, s + 48),
               [](Message& m) {
                 m.input.topk->shape = {1, int64_t{1} << 62};
                 m.input.topk->pieces.clear();
               }),
          kInvalid, "topk: shape [1, 4611686018427387904] needs more than 2^63 bytes");
      add(l + "topk as bf16",
          With(bad(layer, 255, s + 44),
               [](Message& m) { m.input.topk->dtype = wire::DType::kBf16; }),
          kInvalid, "topk");
      add(l + "topk for 2 tokens",
          With(bad(layer, 255, s + 45),
               [](Message& m) {
                 m.topk.resize(2 * m.topk_width, 0);
                 m.input.topk = Tensor(wire::DType::kI32, {2, m.topk_width}, m.topk, 45);
               }),
          kInvalid, "topk");
      add(l + "topk missing on a C4A layer",
          With(bad(layer, 255, s + 47), [](Message& m) { m.input.topk = std::nullopt; }), kInvalid,
          "topk");
    } else {
      add(l + "topk on a non-C4A layer",
          With(bad(layer, 255, s + 46),
               [](Message& m) {
                 m.topk = {0, 1, -1};
                 m.input.topk = Tensor(wire::DType::kI32, {1, 3}, m.topk, 46);
               }),
          kInvalid, "topk");
    }
  }

  for (BadCase& c : cases) {
    const StageState before = stages->State();
    WrittenLayers written;
    const absl::StatusOr<AttendPlan> plan =
        stages->attend_planner().Plan(stages->Receive(*c.message), written);
    ExpectError(plan.status(), c.code, c.field, c.name);
    EXPECT_TRUE(written.empty()) << c.name;
    EXPECT_EQ(stages->State(), before) << c.name;
  }
  // The correct messages after all that.
  for (int layer : {kFlashC4a, kFlashC128a, kFlashSwa}) {
    auto m = good(layer, 255, 8900 + layer);
    EXPECT_TRUE(stages->Attend(*m).ok()) << "layer " << layer << " after the bad messages";
  }
  stages->ExpectListed({seq.get(), other.get(), pro.get()});

  // At 259 a C4A message needs a new page: a bad one takes none.
  for (int32_t p = 256; p < 259; ++p) {
    auto m = good(kFlashC4a, p, 8950 + p);
    ASSERT_TRUE(stages->Attend(*m).ok()) << "C4A p=" << p;
  }
  const StageState before = stages->State();
  std::vector<std::unique_ptr<Message>> at_page;
  // (The tensors point into the message's vectors: changing a value there
  // changes what is sent.)
  at_page.push_back(With(bad(kFlashC4a, 259, 8960), [](Message& m) { m.topk[0] = 65; }));
  at_page.push_back(With(bad(kFlashC4a, 259, 8961), [](Message& m) {
    m.input.q->shape = {1, 4, 511};
  }));
  at_page.push_back(
      With(bad(kFlashC4a, 259, 8962), [](Message& m) { m.input.compressed_kv = std::nullopt; }));
  at_page.push_back(With(bad(kFlashC4a, 259, 8963), [](Message& m) { m.input.kv = std::nullopt; }));
  for (const auto& m : at_page) {
    const absl::Status status = stages->PlanAlone(*m).status();
    EXPECT_EQ(status.code(), kInvalid) << status;
    EXPECT_EQ(stages->State(), before) << status;
  }
  auto at_page_good = good(kFlashC4a, 259, 8970);
  ASSERT_TRUE(stages->Attend(*at_page_good).ok()) << "C4A p=259 after the bad messages";
  EXPECT_EQ(stages->pool().used_blocks(), before.outside.used + 1);
  stages->ExpectListed({seq.get(), other.get(), pro.get()});
}

// Regions of another size than the answer's are refused, naming the field,
// and change nothing: out, lse (only when asked) and, with the FP8 output,
// out_scales. Regions of the answer's sizes are the plan's.
TEST(AttendPlannerTest, AnswerRegionsOfAnotherSizeAreRefused) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 16, SinkMode::kWhole, 96);
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(stages->Append(*seq, 0, 255).ok());
  // The planner checks sizes only: no byte of the regions is read.
  std::vector<uint8_t> memory(4 * 16 * kRowBytes);
  const int64_t bf16_bytes = 16 * kRowBytes;
  const int64_t fp8_bytes = 16 * kFp8RowBytes;
  struct RegionCase {
    bool fp8;
    int64_t out, scales, lse;
    std::string field;
  };
  const std::vector<RegionCase> cases = {
      {false, bf16_bytes - 1, 0, 64,
       "out_region.byte_size: the answer's out [T, H, 512] bf16 is 16384 bytes (T = 1, H = 16); "
       "the reference names 16383: name exactly 16384"},
      {false, bf16_bytes + 2, 0, 64, "out_region.byte_size"},
      {false, bf16_bytes, 0, 63, "lse_region.byte_size"},
      {false, bf16_bytes, 0, 0, "lse_region.byte_size"},
      {true, fp8_bytes * 2, 64, 64,
       "out_region.byte_size: the answer's out [T, H, 512] e4m3fn is 8192 bytes (T = 1, H = 16); "
       "the reference names 16384: name exactly 8192"},
      {true, fp8_bytes - 1, 64, 64, "out_region.byte_size"},
      {true, fp8_bytes, 63, 64,
       "out_scales_region.byte_size: the answer's out_scales [T, H, 4] UE8M0 is 64 bytes (T = 1, "
       "H = 16); the reference names 63"},
      {true, fp8_bytes, 0, 64, "out_scales_region.byte_size"}};
  auto regions_of = [&](const RegionCase& c) {
    const int64_t out_bytes = c.fp8 ? fp8_bytes : bf16_bytes;
    AnswerRegions regions;
    regions.out = {nullptr, memory.data(), c.out};
    if (c.fp8) regions.scales = {nullptr, memory.data() + 2 * out_bytes, c.scales};
    regions.lse = {nullptr, memory.data() + 2 * out_bytes + (c.fp8 ? 64 : 0), c.lse};
    return regions;
  };
  for (const RegionCase& c : cases) {
    MessageOptions o;
    o.seed = c.fp8 ? 9950 : 9700;
    o.fp8 = c.fp8;
    const auto m = Build(kFlashSwa, {{seq.get(), 255}}, o);
    const StageState before = stages->State();
    ExpectError(stages->PlanAlone(*m, regions_of(c)).status(), kInvalid, c.field, c.field);
    EXPECT_EQ(stages->State(), before) << c.field;
  }
  for (const bool fp8 : {false, true}) {
    for (const bool lse : {true, false}) {
      MessageOptions o;
      o.seed = 9960;
      o.fp8 = fp8;
      o.lse = lse;
      const auto m = Build(kFlashSwa, {{seq.get(), 255}}, o);
      // Without lse its region is not looked at.
      const RegionCase exact = {fp8, fp8 ? fp8_bytes : bf16_bytes, 64, lse ? 64 : 0, ""};
      const ReceivedAttend& received = stages->Receive(*m, regions_of(exact));
      WrittenLayers written;
      const absl::StatusOr<AttendPlan> plan = stages->attend_planner().Plan(received, written);
      ASSERT_TRUE(plan.ok()) << (fp8 ? "fp8" : "bf16") << ", lse " << lse << ": " << plan.status();
      EXPECT_EQ(plan->answer_regions, &*received.answer_regions);
    }
  }
}

// An answer larger than the server's limit (out, lse and about a kilobyte
// of framing) is RESOURCE_EXHAUSTED before anything changes: the service
// could not send it. An answer written into regions is not sent, so the
// limit does not apply to it.
TEST(AttendPlannerTest, AnAnswerAboveTheLimitIsRefused) {
  // 2 tokens x 16 heads of bf16 out and lse: 2 * 16 * (1024 + 4) + 1024.
  constexpr int64_t kTwoTokens = 33920;
  std::unique_ptr<PlannerStages> stages =
      NewStages(1000, /*max_tokens=*/1024, /*max_answer_bytes=*/kTwoTokens - 1);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 16, SinkMode::kNone, 97);
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(stages->Append(*seq, 0, 255).ok());
  MessageOptions o;
  o.seed = 9970;
  const auto two = Build(kFlashSwa, {{seq.get(), 255, 2}}, o);
  const StageState before = stages->State();
  ExpectError(stages->PlanAlone(*two).status(), Code::kResourceExhausted,
              "the answer to this message would be about 33920 bytes (2 tokens x 16 heads), "
              "above the server's limit of 33919 bytes (--max_message_mb)",
              "two tokens");
  EXPECT_EQ(stages->State(), before);
  o.lse = false;  // 2 * 16 * 1024 + 1024
  EXPECT_TRUE(stages->PlanAlone(*Build(kFlashSwa, {{seq.get(), 255, 2}}, o)).ok()) << "no lse";
  o.lse = true;
  o.fp8 = true;  // 2 * 16 * (512 + 4 + 4) + 1024
  EXPECT_TRUE(stages->PlanAlone(*Build(kFlashSwa, {{seq.get(), 255, 2}}, o)).ok()) << "FP8";
  std::vector<uint8_t> memory(2 * 16 * (kRowBytes + 4));
  AnswerRegions regions;
  regions.out = {nullptr, memory.data(), 2 * 16 * kRowBytes};
  regions.lse = {nullptr, memory.data() + 2 * 16 * kRowBytes, 2 * 16 * 4};
  EXPECT_TRUE(stages->PlanAlone(*two, regions).ok()) << "into regions";
}

// A top-k of 129 x 512 entries is checked in token ranges on the host
// threads: entries out of range in two ranges, the error names the first
// in token order; the message changed nothing, and repaired it runs.
TEST(AttendPlannerTest, ALargeTopkIsCheckedInTokenRanges) {
  std::unique_ptr<PlannerStages> stages = NewStages(1400);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> pro = stages->NewSeq(kPro, 8, SinkMode::kWhole, 53);
  ASSERT_NE(pro, nullptr);
  ASSERT_TRUE(stages->Append(*pro, 0, 250).ok());
  MessageOptions o;
  o.seed = 5106;
  o.head_offset = 4;
  o.topk_width = 96;
  auto pro_c4a = Build(kProC4a, {{pro.get(), 250, 129}}, o);
  ASSERT_TRUE(stages->Attend(*pro_c4a).ok());
  o.seed++;
  o.topk_width = 512;
  auto large = Build(kProC4a, {{pro.get(), 250 + 129, 129}}, o);
  const int32_t saved_late = large->topk[100 * 512 + 7];
  const int32_t saved_early = large->topk[20 * 512 + 300];
  large->topk[100 * 512 + 7] = 1 << 20;
  large->topk[20 * 512 + 300] = -5;
  const StageState before = stages->State();
  ExpectError(stages->PlanAlone(*large).status(), kInvalid, "topk[20][300]: -5 is not -1",
              "a large top-k with two bad entries");
  EXPECT_EQ(stages->State(), before);
  large->topk[100 * 512 + 7] = saved_late;
  large->topk[20 * 512 + 300] = saved_early;
  absl::StatusOr<AttendPlan> plan = stages->PlanAlone(*large);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->topk_width, 512);
  EXPECT_EQ(plan->num_tokens, 129);
}

// A message touching a session layer that an earlier message of the wave
// writes waits for the next wave: the next position, and another rank
// repeating the step. It is checked no further than its positions (a bad
// top-k does not show yet) and takes no page. Other layers and other
// sessions run beside the writer. In the next wave the repeat writes
// nothing, so the next position runs beside it.
TEST(AttendPlannerTest, AMessageOnALayerTheWaveWritesWaitsForTheNextWave) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> a = stages->NewSeq(kFlash, 16, SinkMode::kWhole, 61);
  std::unique_ptr<Seq> b = stages->NewSeq(kFlash, 16, SinkMode::kNone, 62);
  ASSERT_TRUE(a && b);
  // At 259 C4A row 64, on a new page, is due.
  ASSERT_TRUE(stages->Append(*a, 0, 259).ok());
  ASSERT_TRUE(stages->Append(*b, 0, 259).ok());
  MessageOptions o;
  o.seed = 6100;
  auto first = Build(kFlashC4a, {{a.get(), 259}}, o);
  o.seed++;
  auto swa = Build(kFlashSwa, {{a.get(), 259}}, o);
  o.seed++;
  auto other_session = Build(kFlashC4a, {{b.get(), 259}}, o);
  o.seed++;
  o.head_offset = 16;
  o.kv = false;
  auto repeat = Build(kFlashC4a, {{a.get(), 259, 1, false}}, o);
  o = MessageOptions();
  o.seed = 6110;
  auto next = Build(kFlashC4a, {{a.get(), 260}}, o);
  o.seed++;
  auto next_bad_topk =
      With(Build(kFlashC4a, {{a.get(), 260}}, o), [](Message& m) { m.topk[0] = 1000; });
  o.seed++;
  o.head_offset = 61;
  auto next_bad_heads = Build(kFlashC4a, {{a.get(), 260}}, o);

  const int64_t used = stages->pool().used_blocks();
  WrittenLayers written;
  std::vector<AttendPlan> wave;
  auto plan = [&](const Message& m) {
    return stages->attend_planner().Plan(stages->Receive(m), written);
  };
  for (const Message* m : {first.get(), swa.get(), other_session.get()}) {
    absl::StatusOr<AttendPlan> p = plan(*m);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_FALSE(p->defer);
    wave.push_back(*std::move(p));
  }
  EXPECT_EQ(written.size(), 3u);
  EXPECT_EQ(stages->pool().used_blocks(), used + 2) << "the C4A pages of a and b";
  for (const Message* m : {repeat.get(), next.get(), next_bad_topk.get()}) {
    absl::StatusOr<AttendPlan> p = plan(*m);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(p->defer) << "request " << m->input.request_id;
    EXPECT_EQ(p->pages.missing(), 0);
  }
  ExpectError(plan(*next_bad_heads).status(), kInvalid, "head_offset",
              "heads are checked before the wave's layers");
  EXPECT_EQ(written.size(), 3u);
  EXPECT_EQ(stages->pool().used_blocks(), used + 2);
  for (const AttendPlan& p : wave) AttendPlanner::Commit(p, kT0);
  for (const Message* m : {first.get(), swa.get(), other_session.get()}) Advance(*m);

  // The next wave.
  written.clear();
  absl::StatusOr<AttendPlan> repeated = plan(*repeat);
  ASSERT_TRUE(repeated.ok()) << repeated.status();
  EXPECT_FALSE(repeated->defer);
  EXPECT_EQ(repeated->inserts, std::vector<bool>{false});
  EXPECT_TRUE(written.empty()) << "a repeat writes nothing";
  absl::StatusOr<AttendPlan> continued = plan(*next);
  ASSERT_TRUE(continued.ok()) << continued.status();
  EXPECT_FALSE(continued->defer);
  EXPECT_EQ(continued->inserts, std::vector<bool>{true});
  // (Beside `continued` it would wait again.)
  written.clear();
  ExpectError(plan(*next_bad_topk).status(), kInvalid, "topk[0][0]",
              "checked in a wave of its own");
  AttendPlanner::Commit(*repeated, kT0);
  AttendPlanner::Commit(*continued, kT0);
  Advance(*next);
  stages->ExpectListed({a.get(), b.get()});
}

// A plan holds the pages its new rows need until its launch is done: a
// failed launch gives them back (everything as before the plan); a
// successful one commits: each segment's layer continues past its tokens
// with the rows they complete, and its session is used at that time.
TEST(AttendPlannerTest, ACommitAdvancesAndReturnedPagesChangeNothing) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> a = stages->NewSeq(kFlash, 4, SinkMode::kWhole, 71);
  std::unique_ptr<Seq> b = stages->NewSeq(kFlash, 4, SinkMode::kWhole, 72);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(stages->Append(*a, 0, 255).ok());
  ASSERT_TRUE(stages->Append(*b, 0, 259).ok());
  // a: 255..259 bring rows 63 and 64 (a new page); b: 259 brings row 64.
  MessageOptions o;
  o.seed = 7100;
  auto m = Build(kFlashC4a, {{a.get(), 255, 5}, {b.get(), 259}}, o);
  const StageState before = stages->State();
  absl::StatusOr<AttendPlan> failed = stages->PlanAlone(*m);
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(stages->pool().used_blocks(), before.outside.used + 2);
  stages->attend_planner().ReturnPages(*failed);
  EXPECT_EQ(stages->State(), before);

  absl::StatusOr<AttendPlan> plan = stages->PlanAlone(*m);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_tokens, 6);
  EXPECT_EQ(plan->num_heads, 4);
  EXPECT_EQ(plan->padded_heads, 8);
  EXPECT_EQ(plan->topk_width, 24);
  EXPECT_EQ(plan->inserts, (std::vector<bool>{true, true}));
  EXPECT_EQ(plan->rows_after, (std::vector<int32_t>{65, 65}));
  AttendPlanner::Commit(*plan, kT0 + absl::Seconds(7));
  Advance(*m);
  stages->ExpectListed({a.get(), b.get()});
  for (const Seq* seq : {a.get(), b.get()}) {
    absl::StatusOr<Session*> session = stages->sessions().Find(seq->id);
    ASSERT_TRUE(session.ok());
    EXPECT_EQ((*session)->last_used, kT0 + absl::Seconds(7));
    EXPECT_EQ((*session)->layers[kFlashC4a].next_position, 260);
    EXPECT_EQ((*session)->layers[kFlashC4a].compressed_rows, 65);
    EXPECT_EQ((*session)->layers[kFlashC4a].compressed_blocks.size(), 2u);
    EXPECT_EQ((*session)->layers[kFlashSwa].next_position, seq == a.get() ? 255 : 259);
  }
}

// The pages a message's new rows need are asked about (a tenant's limit)
// after every check and before any is taken, with the sessions as they
// are; a refusal there changes nothing. A message that adds no page, or
// fails a check, is not asked about.
TEST(AttendPlannerTest, NewPagesAreAdmittedBeforeTheyAreTaken) {
  std::unique_ptr<PlannerStages> stages = NewStages(1000);
  ASSERT_NE(stages, nullptr);
  std::unique_ptr<Seq> seq = stages->NewSeq(kFlash, 4, SinkMode::kNone, 75);
  ASSERT_NE(seq, nullptr);
  ASSERT_TRUE(stages->Append(*seq, 0, 259).ok());  // C4A row 64 (a new page) due at 259
  std::vector<std::pair<int64_t, size_t>> asked;   // new pages, sessions listed
  absl::Status answer = absl::ResourceExhaustedError("tenant over its KV block limit");
  const AdmitAttendPages admit = [&](int64_t new_pages,
                                     absl::FunctionRef<std::vector<SessionSummary>()> sessions) {
    asked.emplace_back(new_pages, sessions().size());
    return answer;
  };
  MessageOptions o;
  o.seed = 7500;
  auto needs_page = Build(kFlashC4a, {{seq.get(), 259}}, o);
  auto bad = With(Build(kFlashC4a, {{seq.get(), 259}}, o), [](Message& m) { m.topk[0] = 65; });
  auto no_page = Build(kFlashSwa, {{seq.get(), 259}}, o);
  auto plan = [&](const Message& m) {
    WrittenLayers written;
    return stages->attend_planner().Plan(stages->Receive(m, std::nullopt, admit), written);
  };
  const StageState before = stages->State();
  ExpectError(plan(*needs_page).status(), Code::kResourceExhausted,
              "tenant over its KV block limit", "refused");
  EXPECT_EQ(stages->State(), before);
  EXPECT_EQ(plan(*bad).status().code(), kInvalid);
  EXPECT_TRUE(plan(*no_page).ok());
  EXPECT_EQ(asked, (std::vector<std::pair<int64_t, size_t>>{{1, 1}}));
  answer = absl::OkStatus();
  EXPECT_TRUE(plan(*needs_page).ok());
  EXPECT_EQ(stages->pool().used_blocks(), before.outside.used + 1);
}

// Plans share a launch only with plans of the same model, head counts,
// RoPE kind and output flags; the groups come in the order of those keys,
// the plans of each in batch order with their tokens summed.
TEST(GroupForLaunchTest, PlansShareALaunchOnlyWithTheSameKey) {
  const ModelProfile* flash = *FindModelProfile(kFlash);
  const ModelProfile* pro = *FindModelProfile(kPro);
  struct PlanCase {
    const ModelProfile* profile;
    int layer;
    int heads;
    bool derotate;
    bool fp8;
    int64_t tokens;
  };
  const std::vector<PlanCase> cases = {
      {flash, kFlashC4a, 16, false, false, 2},    // 0
      {flash, kFlashSwa, 16, false, false, 1},    // 1: plain RoPE
      {flash, kFlashC128a, 16, false, false, 3},  // 2: YaRN too, beside 0
      {pro, kProC4a, 16, false, false, 1},        // 3: another model
      {flash, kFlashC4a, 16, true, false, 1},     // 4: de-rotated
      {flash, kFlashC4a, 16, false, true, 1},     // 5: FP8
      {flash, kFlashC4a, 12, false, false, 1},    // 6: 12 heads padded to 16
      {flash, kFlashC4a, 16, false, false, 4},    // 7: beside 0
  };
  std::vector<wire::AttendRequestView> inputs(cases.size());
  std::vector<AttendPlan> plans(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    inputs[i].layer = cases[i].layer;
    inputs[i].derotate_output = cases[i].derotate;
    inputs[i].fp8_output = cases[i].fp8;
    plans[i].index = static_cast<int>(i);
    plans[i].input = &inputs[i];
    plans[i].profile = cases[i].profile;
    plans[i].num_heads = cases[i].heads;
    plans[i].padded_heads = SpecPadded(cases[i].heads);
    plans[i].num_tokens = cases[i].tokens;
  }
  const std::vector<LaunchGroup> groups = GroupForLaunch(plans);
  using Group = std::tuple<std::vector<int>, int, int, RopeKind, bool, bool, int64_t>;
  std::vector<Group> got;
  for (const LaunchGroup& group : groups) {
    std::vector<int> members;
    for (const AttendPlan* plan : group.plans) members.push_back(plan->index);
    got.emplace_back(members, group.num_heads, group.padded_heads, group.rope, group.derotate,
                     group.fp8_output, group.num_tokens);
  }
  const std::vector<Group> expected = {
      {{6}, 12, 16, RopeKind::kYarn, false, false, 1},
      {{1}, 16, 16, RopeKind::kPlain, false, false, 1},
      {{0, 2, 7}, 16, 16, RopeKind::kYarn, false, false, 9},
      {{5}, 16, 16, RopeKind::kYarn, false, true, 1},
      {{4}, 16, 16, RopeKind::kYarn, true, false, 1},
      {{3}, 16, 16, RopeKind::kYarn, false, false, 1},
  };
  EXPECT_EQ(got, expected);
}

}  // namespace
}  // namespace mla
