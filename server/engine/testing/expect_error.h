// The check every refusal test makes: a status of the expected code whose
// message names the field (or holds the fragment) a person would fix.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_EXPECT_ERROR_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_EXPECT_ERROR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::engine_testing {

// `what` names the case in the failure.
inline void ExpectError(const absl::Status& status, absl::StatusCode code, absl::string_view field,
                        absl::string_view what) {
  EXPECT_EQ(status.code(), code) << what << ": " << status;
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(std::string(field))) << what;
}

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_EXPECT_ERROR_H_
