// Command-line helpers of mla_offload_loadtest that absl flags lack.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_COMMAND_LINE_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mla::loadtest {

// Every value of a flag given several times ("--target=a --target b,c"),
// each split at commas, in order, empty parts dropped: absl keeps only the
// last occurrence of a flag, --target is meant to repeat. Stops at "--".
std::vector<std::string> RepeatedFlagValues(int argc, char** argv, absl::string_view name);

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_COMMAND_LINE_H_
