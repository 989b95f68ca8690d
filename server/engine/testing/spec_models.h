// The two built-in models as spec section 1 states them, written down here
// rather than read from kernels/model_profile.h, so that a test holds the
// profiles to the spec (spec_models_test.cc), and the first layers of each
// kind the tests attend. Immutable; thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_SPEC_MODELS_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_SPEC_MODELS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mla::engine_testing {

inline constexpr char kFlash[] = "deepseek-v4-flash";
inline constexpr char kPro[] = "deepseek-v4-pro";

// First layers of each kind, and the MTP layers.
inline constexpr int kFlashSwa = 0, kFlashC4a = 2, kFlashC128a = 3, kFlashMtpC4a = 42,
                     kFlashMtpSwa = 43;
inline constexpr int kProC128a = 0, kProC4a = 2, kProMidC128a = 33, kProMtpSwa = 61;

struct SpecModel {
  std::string name;
  int h_total;
  int topk;
  std::vector<int> ratios;  // per attention layer, MTP last

  int layers() const { return static_cast<int>(ratios.size()); }
};

// kFlash or kPro.
const SpecModel& Spec(absl::string_view name);

// Section 6: H rounded up to a multiple of 8.
inline int SpecPadded(int heads) { return (heads + 7) / 8 * 8; }

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_SPEC_MODELS_H_
