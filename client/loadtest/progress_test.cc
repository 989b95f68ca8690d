#include "client/loadtest/progress.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

using ::testing::HasSubstr;

// Everything a display wrote to a memory stream.
class Captured {
 public:
  Captured() : file_(open_memstream(&data_, &size_)) {}
  ~Captured() {
    std::fclose(file_);
    std::free(data_);
  }
  std::FILE* file() { return file_; }
  std::string text() {
    std::fflush(file_);
    return std::string(data_, size_);
  }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
  std::FILE* file_;
};

ProgressSnapshot Measuring() {
  ProgressSnapshot s;
  s.elapsed_s = 4;
  s.window_s = 3.2;
  s.planned_s = 10;
  s.layer_steps = 1234;
  s.recent_rate = 246.8;
  s.recent_p50_ns = 1230000;
  s.recent_p99_ns = 4560000;
  s.in_flight = 8;
  s.errors = 2;
  s.layers = 4;
  return s;
}

TEST(ProgressTest, FormatsOneLine) {
  const std::string line = FormatProgress(Measuring());
  EXPECT_EQ(line,
            "attend: measure 3.2/10.0 s | 1234 layer steps (246.8/s = 61.70 decode steps/s) | "
            "p50 1.23 ms p99 4.56 ms | in flight 8 | errors 2");
  ProgressSnapshot warm;
  warm.warming_up = true;
  warm.elapsed_s = 0.5;
  EXPECT_THAT(FormatProgress(warm), HasSubstr("warm-up 0.5 s"));
  EXPECT_THAT(FormatProgress(warm), HasSubstr("p50 - p99 -"));
  EXPECT_EQ(FormatProgress(warm).find('\n'), std::string::npos);
}

TEST(ProgressTest, TerminalRewritesTheLineInPlace) {
  Captured out;
  ProgressDisplay display(out.file(), /*tty=*/true, 0.25, 5.0);
  ProgressSnapshot s = Measuring();
  display.Update(s, 0.0);
  display.Update(s, 0.1);  // too soon: nothing
  s.errors = 0;
  s.recent_p50_ns = s.recent_p99_ns = 0;  // a shorter line
  display.Update(s, 0.3);
  display.Finish();
  const std::string text = out.text();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\r'), 2);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1);
  EXPECT_EQ(text.back(), '\n');
  // The second line is padded to the first one's width.
  const size_t second = text.rfind('\r');
  EXPECT_EQ(text.size() - 1 - second - 1, text.find('\r', 1) - 1);
}

TEST(ProgressTest, PlainOutputPrintsWholeLinesEveryFewSeconds) {
  Captured out;
  ProgressDisplay display(out.file(), /*tty=*/false, 0.25, 5.0);
  const ProgressSnapshot s = Measuring();
  for (double t = 0; t < 12; t += 0.25) display.Update(s, t);
  display.Finish();
  const std::string text = out.text();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);  // at 0, 5 and 10 s
}

}  // namespace
}  // namespace mla::loadtest
