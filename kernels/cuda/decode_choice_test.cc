// MLA_CUDA_DECODE: which decode kernels each value selects, that the CUDA
// backend keeps the choice it was made with, and that it refuses a value
// that names none, before it looks for a device (so these tests need no GPU
// and run in CI).
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/decode_kernels.h"

namespace mla {
namespace {

TEST(DecodeChoiceTest, NamesTheKernelsOfEachValue) {
  EXPECT_EQ(cuda::DecodeKernelsFor(nullptr), cuda::DecodeKernels::kWgmma);
  EXPECT_EQ(cuda::DecodeKernelsFor(""), cuda::DecodeKernels::kWgmma);
  EXPECT_EQ(cuda::DecodeKernelsFor("wgmma"), cuda::DecodeKernels::kWgmma);
  EXPECT_EQ(cuda::DecodeKernelsFor("mma"), cuda::DecodeKernels::kMma);
  EXPECT_EQ(cuda::DecodeKernelsFor("simt"), cuda::DecodeKernels::kSimt);
  EXPECT_EQ(cuda::DecodeKernelsFor("padded"), cuda::DecodeKernels::kPadded);
  // The name the narrow kernel had before it became the default's Hp <= 32.
  EXPECT_EQ(cuda::DecodeKernelsFor("narrow"), std::nullopt);
  EXPECT_EQ(cuda::DecodeKernelsFor("WGMMA"), std::nullopt);
  EXPECT_EQ(cuda::DecodeKernelsFor("fastest"), std::nullopt);
  for (cuda::DecodeKernels kernels : {cuda::DecodeKernels::kWgmma, cuda::DecodeKernels::kPadded,
                                      cuda::DecodeKernels::kMma, cuda::DecodeKernels::kSimt}) {
    EXPECT_EQ(cuda::DecodeKernelsFor(cuda::DecodeKernelsName(kernels)), kernels);
  }
}

// A backend made with MLA_CUDA_DECODE=value (the variable restored after).
std::unique_ptr<CudaBackend> BackendWith(const char* value) {
  const char* before = std::getenv("MLA_CUDA_DECODE");
  const std::string saved = before == nullptr ? "" : before;
  setenv("MLA_CUDA_DECODE", value, 1);
  auto backend = std::make_unique<CudaBackend>(0);
  if (before == nullptr) {
    unsetenv("MLA_CUDA_DECODE");
  } else {
    setenv("MLA_CUDA_DECODE", saved.c_str(), 1);
  }
  return backend;
}

TEST(DecodeChoiceTest, BackendKeepsTheChoiceItWasMadeWith) {
  // Read when the backend is made, before the device is looked for: later
  // changes to the variable do not move a backend to other kernels.
  const std::unique_ptr<CudaBackend> backend = BackendWith("simt");
  EXPECT_EQ(backend->decode_kernels(), cuda::DecodeKernels::kSimt);
  EXPECT_EQ(BackendWith("mma")->decode_kernels(), cuda::DecodeKernels::kMma);
  EXPECT_EQ(BackendWith("padded")->decode_kernels(), cuda::DecodeKernels::kPadded);
  EXPECT_EQ(BackendWith("")->decode_kernels(), cuda::DecodeKernels::kWgmma);
  EXPECT_EQ(backend->decode_kernels(), cuda::DecodeKernels::kSimt);
}

TEST(DecodeChoiceTest, BackendRefusesAnUnknownValue) {
  const std::unique_ptr<CudaBackend> backend = BackendWith("fastest");
  EXPECT_EQ(backend->init_status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend->init_status().message().find("MLA_CUDA_DECODE=fastest names no decode kernels"),
            absl::string_view::npos)
      << backend->init_status();
  // It lists what to use instead.
  EXPECT_NE(backend->init_status().message().find(
                "use wgmma (the default), padded, mma or simt"),
            absl::string_view::npos)
      << backend->init_status();
}

TEST(DecodeChoiceTest, TheChoicesListEveryValue) {
  EXPECT_EQ(cuda::DecodeKernelsChoices(), "wgmma (the default), padded, mma or simt");
}

}  // namespace
}  // namespace mla
