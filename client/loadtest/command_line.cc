#include "client/loadtest/command_line.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace mla::loadtest {

std::vector<std::string> RepeatedFlagValues(int argc, char** argv, absl::string_view name) {
  std::vector<std::string> values;
  auto add = [&values](absl::string_view value) {
    for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
      values.emplace_back(absl::StripAsciiWhitespace(part));
    }
  };
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--") && !absl::ConsumePrefix(&arg, "-")) continue;
    if (!absl::ConsumePrefix(&arg, name)) continue;
    if (absl::ConsumePrefix(&arg, "=")) {
      add(arg);
    } else if (arg.empty() && i + 1 < argc) {
      add(argv[++i]);
    }
  }
  return values;
}

}  // namespace mla::loadtest
