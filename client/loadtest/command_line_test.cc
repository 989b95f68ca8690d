#include "client/loadtest/command_line.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Values(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return RepeatedFlagValues(static_cast<int>(argv.size()), argv.data(), "target");
}

TEST(CommandLineTest, CollectsEveryOccurrenceAndCommaList) {
  EXPECT_THAT(Values({"prog", "--target=a:1", "--tp=4", "-target", "b:2, c:3", "--target=d:4,"}),
              ElementsAre("a:1", "b:2", "c:3", "d:4"));
}

TEST(CommandLineTest, IgnoresOtherFlagsPrefixesAndAfterDoubleDash) {
  EXPECT_THAT(
      Values({"prog", "--targets=x:1", "--target_file=y", "target=z:1", "--", "--target=w:1"}),
      ElementsAre());
  EXPECT_THAT(Values({"prog", "--target"}), ElementsAre());
}

}  // namespace
}  // namespace mla::loadtest
