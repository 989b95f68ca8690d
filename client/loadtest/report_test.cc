#include "client/loadtest/report.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

RunReport SampleReport() {
  RunReport report;
  RunConfig& c = report.config;
  c.targets = {"127.0.0.1:5000"};
  c.server_version = "mla-offload test";
  c.backend = "cpu (2 threads)";
  c.model = "deepseek-v4-flash";
  c.tp = 8;
  c.heads = 8;
  c.padded_heads = 8;
  c.layers = 4;
  c.model_layers = 44;
  c.streams = 2;
  c.sessions = 3;
  c.tokens_per_step = 1;
  c.prompt = 256;
  c.mode = "closed";
  c.concurrency = 2;
  c.warmup_s = 0.5;
  c.duration_s = 2;
  report.attend.stop_reason = "--duration_s";
  report.prompt_seconds = 1.25;
  PhaseStats& a = report.attend;
  a.name = "attend";
  a.seconds = 2.0;
  for (int i = 1; i <= 400; ++i) a.latency.Record(int64_t{i} * 10000);  // 10 us .. 4 ms
  a.ok = 400;
  a.tokens = 400 * 3;
  a.bytes_in = 400 * 30000;
  a.bytes_out = 400 * 24576;
  // Means already (count 400): queue, plan, upload, prologue, decode,
  // readback, total, tokens per batch, then serialise.
  a.server = {400, 100, 20, 10, 50, 800, 5, 1000, 6, 7};
  for (int i = 1; i <= 400; ++i)
    a.latency_by_kind[i % 2 ? "c4a" : "swa"].Record(int64_t{i} * 10000);
  report.kv = {10000, 0, 1000, 1010, 0, 64, 584, 37440};
  return report;
}

TEST(ReportTest, DerivedRates) {
  const RunReport report = SampleReport();
  EXPECT_DOUBLE_EQ(report.attend.LayerStepsPerSecond(), 200.0);
  EXPECT_DOUBLE_EQ(report.DecodeStepsPerSecond(), 50.0);  // 4 layers a step
  EXPECT_DOUBLE_EQ(report.TokensPerSecond(), 150.0);      // 3 sessions x 1 token
  EXPECT_DOUBLE_EQ(report.attend.GBpsIn(), 400 * 30000 / 2.0 / 1e9);
  EXPECT_EQ(report.LatencyOverhead(), 0);  // no echo phase
}

TEST(ReportTest, TextShowsEveryFigure) {
  RunReport report = SampleReport();
  const std::string text = FormatReport(report);
  EXPECT_THAT(text,
              HasSubstr("deepseek-v4-flash TP8 (H=8 per rank, runs at 8), 2 nodes x 3 sessions"));
  EXPECT_THAT(text, HasSubstr("p50 2.00 ms"));
  EXPECT_THAT(text, HasSubstr("p99 3.96 ms"));
  EXPECT_THAT(text, HasSubstr("max 4.00 ms"));
  EXPECT_THAT(text, HasSubstr("    by layer kind          c4a p50 1.99 ms p99 3.95 ms (n=200), swa "
                              "p50 2.00 ms p99 3.96 ms (n=200)\n"));
  EXPECT_THAT(text, HasSubstr("200.0 layer steps/s = 50.00 decode steps/s = 150.0 tokens/s"));
  EXPECT_THAT(text, HasSubstr("queue 100 us, plan 20 us, upload 10 us, prologue 50 us, decode "
                              "800 us, readback 5 us, other 15 us"));
  // The mean latency is 2005 us (10 us .. 4 ms).
  EXPECT_THAT(text, HasSubstr("total 1000 us; 6.0 tokens per batch; then serialise 7 us; "
                              "transport and client 998 us"));
  EXPECT_THAT(text, HasSubstr("errors                   none (400 OK)"));
  EXPECT_THAT(text, HasSubstr("1010 of 10000 blocks used at the end (10.1%"));
  EXPECT_THAT(text, HasSubstr("6 sessions x 256 tokens created and appended in 1.25 s"));
  EXPECT_THAT(text, Not(HasSubstr("echo baseline")));
  EXPECT_THAT(text, Not(HasSubstr("fell behind")));
  EXPECT_THAT(text, Not(HasSubstr("verify")));

  report.config.mode = "open";
  report.config.rate = 400;
  report.attend.planned_seconds = 1.5;  // answers came 0.5 s after the schedule's end
  report.attend.errors["RESOURCE_EXHAUSTED"] = 3;
  report.attend.errors["FAILED_PRECONDITION"] = 1;
  report.echo = PhaseStats();
  report.echo->seconds = 2;
  report.echo->ok = 1000;
  for (int i = 0; i < 1000; ++i) report.echo->latency.Record(500000);  // 0.5 ms
  report.verify.enabled = true;
  report.verify.layer_steps = 5;
  report.verify.tokens = 15;
  report.verify.bit_identical = 15;
  report.verify.max_excess = 0.25;
  const std::string more = FormatReport(report);
  EXPECT_THAT(more, HasSubstr("4 of 404: FAILED_PRECONDITION 1, RESOURCE_EXHAUSTED 3"));
  EXPECT_THAT(more, HasSubstr("open loop, Poisson arrivals at 400.0 layer steps/s"));
  EXPECT_THAT(more, HasSubstr("(the window's last answer came 0.50 s after its end"));
  EXPECT_THAT(more, HasSubstr("(50% of the target rate answered)"));
  EXPECT_THAT(more, HasSubstr("p50 latency x4.00 of pure transport"));
  EXPECT_THAT(more, HasSubstr("echo moves x2.50 the layer steps/s"));
  EXPECT_THAT(more, HasSubstr("PASSED: 5 layer steps (15 tokens)"));

  report.verify.failed_tokens = 2;
  report.verify.first_failure = "out[0,1,7]";
  EXPECT_THAT(FormatReport(report), HasSubstr("FAILED: 2 of 15 tokens out of tolerance"));
  EXPECT_FALSE(report.verify.passed());
}

TEST(ReportTest, CleanupErrorsAreWarnedInTextAndJson) {
  RunReport report = SampleReport();
  EXPECT_THAT(FormatReport(report), Not(HasSubstr("WARNING")));
  EXPECT_TRUE(ReportJson(report)["cleanup_errors"].empty());

  report.cleanup_errors = {"closing sessions: 2 of 6 failed, first: NOT_FOUND: gone",
                           "reading KV use after closing the sessions: UNAVAILABLE: down"};
  report.kv.used_after_close = -1;
  const std::string text = FormatReport(report);
  EXPECT_THAT(text, HasSubstr("  WARNING                  closing sessions: 2 of 6 failed, "
                              "first: NOT_FOUND: gone\n"));
  EXPECT_THAT(text, HasSubstr("  WARNING                  reading KV use after closing"));
  EXPECT_THAT(text, HasSubstr("1010 of 10000 blocks used at the end"));  // the figures stand
  const nlohmann::json json = nlohmann::json::parse(ReportJson(report).dump());
  ASSERT_EQ(json["cleanup_errors"].size(), 2u);
  EXPECT_EQ(json["cleanup_errors"][0], "closing sessions: 2 of 6 failed, first: NOT_FOUND: gone");
  EXPECT_TRUE(json["kv"]["used_after_close"].is_null());
  EXPECT_EQ(json["kv"]["used_at_end"], 1010);

  report.kv.used_at_end = -1;
  EXPECT_THAT(FormatReport(report), HasSubstr("KV cache                 not read at the end"));
  EXPECT_TRUE(ReportJson(report)["kv"]["used_at_end"].is_null());
}

TEST(ReportTest, SeveralServersShowWhereTheSessionsAre) {
  RunReport report = SampleReport();
  report.config.targets = {"a:1", "b:2"};
  report.config.sessions_per_target = {2, 4};
  EXPECT_THAT(FormatReport(report),
              HasSubstr("servers                  a:1 (2 sessions), b:2 (4 sessions): "));
  EXPECT_EQ(ReportJson(report)["config"]["sessions_per_target"][1], 4);
}

TEST(ReportTest, JsonHoldsTheNumbers) {
  RunReport report = SampleReport();
  report.verify.enabled = true;
  report.verify.layer_steps = 2;
  report.verify.tokens = 6;
  const nlohmann::json json = nlohmann::json::parse(ReportJson(report).dump());
  EXPECT_EQ(json["config"]["model"], "deepseek-v4-flash");
  EXPECT_EQ(json["config"]["targets"][0], "127.0.0.1:5000");
  EXPECT_EQ(json["attend"]["layer_steps_ok"], 400);
  EXPECT_EQ(json["attend"]["layer_steps_failed"], 0);
  EXPECT_DOUBLE_EQ(json["attend"]["decode_steps_per_s"].get<double>(), 50.0);
  EXPECT_DOUBLE_EQ(json["attend"]["latency"]["max_us"].get<double>(), 4000.0);
  const nlohmann::json& timing = json["attend"]["server_timing_mean_us"];
  for (const auto& [stage, us] : std::vector<std::pair<std::string, double>>{
           {"queue", 100}, {"plan", 20}, {"upload", 10}, {"prologue", 50}, {"decode", 800},
           {"readback", 5}, {"other", 15}, {"total", 1000}, {"serialize", 7},
           {"transport_and_client", 998}}) {
    EXPECT_DOUBLE_EQ(timing[stage].get<double>(), us) << stage;
  }
  EXPECT_LE(json["attend"]["latency"]["p50_us"].get<double>(),
            json["attend"]["latency"]["p99_us"].get<double>());
  int64_t bucket_total = 0;
  for (const auto& bucket : json["attend"]["latency"]["buckets_us"])
    bucket_total += bucket[2].get<int64_t>();
  EXPECT_EQ(bucket_total, 400);
  EXPECT_EQ(json["kv"]["used_at_end"], 1010);
  EXPECT_EQ(json["attend"]["latency_by_layer_kind"]["c4a"]["count"], 200);
  EXPECT_TRUE(json["verify"]["passed"].get<bool>());
  EXPECT_FALSE(json.contains("echo"));
}

TEST(ReportTest, CsvHasAHeaderAndOneLinePerRecord) {
  std::vector<StepRecord> records(3);
  records[1].phase = 'e';
  records[1].code = 8;
  records[2].latency_us = 1234.5;
  records[2].layer = 7;
  std::ostringstream out;
  WriteStepCsv(records, out);
  const std::vector<std::string> lines = absl::StrSplit(out.str(), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].substr(0, 30), "phase,stream,step,layer,due_s,");
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(lines[i], ',')).size(), header.size());
  }
  EXPECT_THAT(lines[2], HasSubstr("echo,"));
  EXPECT_THAT(lines[2], HasSubstr(",RESOURCE_EXHAUSTED,"));
  EXPECT_THAT(lines[3], HasSubstr(",7,"));
  EXPECT_THAT(lines[3], HasSubstr(",1234.5,OK,"));
}

TEST(ReportTest, Names) {
  EXPECT_EQ(StatusCodeName(0), "OK");
  EXPECT_EQ(StatusCodeName(14), "UNAVAILABLE");
  EXPECT_EQ(StatusCodeName(99), "CODE_99");
  EXPECT_EQ(FormatDuration(999), "999 ns");
  EXPECT_EQ(FormatDuration(12345), "12.3 us");
  EXPECT_EQ(FormatDuration(2500000), "2.50 ms");
  EXPECT_EQ(FormatDuration(123456789), "123 ms");
  EXPECT_EQ(FormatDuration(3210000000), "3.21 s");
}

}  // namespace
}  // namespace mla::loadtest
