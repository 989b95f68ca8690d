// MLA_CUDA_DECODE: which decode kernels each value selects, and that the
// CUDA backend refuses a value that names none, before it looks for a device
// (so these tests need no GPU and run in CI).
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kernels.h"

namespace mla {
namespace {

TEST(DecodeChoiceTest, NamesTheKernelsOfEachValue) {
  EXPECT_STREQ(cuda::DecodeKernelsFor(nullptr), "wgmma");
  EXPECT_STREQ(cuda::DecodeKernelsFor(""), "wgmma");
  EXPECT_STREQ(cuda::DecodeKernelsFor("wgmma"), "wgmma");
  EXPECT_STREQ(cuda::DecodeKernelsFor("mma"), "mma");
  EXPECT_STREQ(cuda::DecodeKernelsFor("simt"), "simt");
  EXPECT_EQ(cuda::DecodeKernelsFor("WGMMA"), nullptr);
  EXPECT_EQ(cuda::DecodeKernelsFor("fastest"), nullptr);
}

TEST(DecodeChoiceTest, BackendRefusesAnUnknownValue) {
  const char* before = std::getenv("MLA_CUDA_DECODE");
  const std::string saved = before == nullptr ? "" : before;
  setenv("MLA_CUDA_DECODE", "fastest", 1);
  CudaBackend backend(0);
  if (before == nullptr) {
    unsetenv("MLA_CUDA_DECODE");
  } else {
    setenv("MLA_CUDA_DECODE", saved.c_str(), 1);
  }
  EXPECT_EQ(backend.init_status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend.init_status().message().find("MLA_CUDA_DECODE=fastest names no decode kernels"),
            absl::string_view::npos)
      << backend.init_status();
}

}  // namespace
}  // namespace mla
