// Log lines: their form, one line whatever the text; refusals rate-limited
// per method and code, with the count of those not logged.
#include "server/process/log.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(LogTest, LinesHaveTimeLevelAndOneLineOfText) {
  const absl::Time when = absl::FromUnixMicros(1764640000123456);
  EXPECT_EQ(FormatLogLine(when, LogLevel::kInfo, "serving"),
            "2025-12-02T01:46:40.123456Z I serving");
  EXPECT_EQ(FormatLogLine(when, LogLevel::kWarning, "a\nb\rc"),
            "2025-12-02T01:46:40.123456Z W a b c");
  EXPECT_EQ(FormatLogLine(when, LogLevel::kInfo, std::string(5000, 'x')).size(),
            std::string("2025-12-02T01:46:40.123456Z I ").size() + 2000);
}

TEST(LogTest, RefusalsAreLoggedOncePerWindowWithTheCountOfTheRest) {
  std::vector<std::string> lines;
  absl::Time now = absl::UnixEpoch();
  RefusalLog log(absl::Seconds(10), [&](absl::string_view line) { lines.emplace_back(line); },
                 [&] { return now; });
  const absl::Status full = absl::ResourceExhaustedError("KV cache full");
  log.Note("CreateSession", absl::OkStatus());
  log.Note("CreateSession", full);
  for (int i = 0; i < 5; ++i) log.Note("CreateSession", full);
  log.Note("CreateSession", absl::InvalidArgumentError("num_heads: 0"));  // another code
  log.Note("AppendKV", full);                                           // another method
  now += absl::Seconds(11);
  log.Note("CreateSession", full);
  log.Note("CreateSession", full);
  EXPECT_THAT(lines, ElementsAre("refused CreateSession: RESOURCE_EXHAUSTED: KV cache full",
                                 "refused CreateSession: INVALID_ARGUMENT: num_heads: 0",
                                 "refused AppendKV: RESOURCE_EXHAUSTED: KV cache full",
                                 "refused CreateSession: RESOURCE_EXHAUSTED: KV cache full (and 5 "
                                 "more CreateSession RESOURCE_EXHAUSTED since the last line)"));
}

}  // namespace
}  // namespace mla
