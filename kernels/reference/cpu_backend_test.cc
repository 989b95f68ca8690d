// Holds the CPU backend (kernels/cpu_backend.h) to the float64 reference of
// kernels/reference/ under the tolerances of spec section 7.
//
// Inputs are random with fixed seeds, never zero, with magnitudes that vary
// from tile to tile so that scales differ; every output is poisoned before a
// run (bf16 0xffff and NaN lse) and compared in full afterwards, and pool bytes
// that must not be written hold random garbage that must survive. Memory goes
// through the ComputeBackend interface only (Allocate, CopyToDevice,
// CopyToHost), as it would for any backend.
#include "kernels/cpu_backend.h"

#include <functional>
#include <memory>

#include "gtest/gtest.h"
#include "kernels/geometry.h"
#include "kernels/reference/backend_test_support.h"

namespace mla {
namespace {

using namespace backend_test;  // NOLINT(build/namespaces): the shared test
                               // support

constexpr int kThreads = 2;

absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend() {
  return std::make_unique<CpuBackend>(kThreads);
}

TEST(LayerCasesTest, BothProfilesHaveEveryKind) { EXPECT_EQ(LayerCases().size(), 6u); }

class PrologueTest : public ::testing::TestWithParam<PrologueCase> {};

TEST_P(PrologueTest, MatchesReference) {
  CpuBackend backend(kThreads);
  RunPrologueCase(backend, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllLayerKindsAndHeadCounts, PrologueTest,
                         ::testing::ValuesIn(PrologueCases()),
                         [](const ::testing::TestParamInfo<PrologueCase>& info) {
                           return absl::StrCat(info.param.layer.Name(), "_h", info.param.heads);
                         });

class DecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeTest, MatchesReference) {
  CpuBackend backend(kThreads);
  RunDecodeCase(backend, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllLayerKindsAndHeadCounts, DecodeTest, ::testing::ValuesIn(DecodeCases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.Name();
                         });

INSTANTIATE_TEST_SUITE_P(Fp8Output, DecodeTest, ::testing::ValuesIn(Fp8DecodeCases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.Name();
                         });

// ---- One realistic layer step: prologue, then decode over what it wrote.

class LayerStepTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerStepTest, PrologueThenDecodeMatchReference) {
  CpuBackend backend(kThreads);
  RunLayerStep(backend, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllLayerKinds, LayerStepTest, ::testing::ValuesIn(LayerCases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) {
                           return info.param.Name();
                         });

// ---- Bad parameters: InvalidArgument, nothing written.

TEST(PrologueRejectTest, AcceptsTheUnbrokenInputs) {
  const absl::Status status = RunBrokenPrologue(MakeBackend, PrologueInputs(), NoChange);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(PrologueRejectTest, RejectsBadHeadCounts) { ExpectPrologueRejectsBadHeadCounts(MakeBackend); }

TEST(PrologueRejectTest, RejectsNullPointersAndNegativeCounts) {
  ExpectPrologueRejectsNullPointersAndNegativeCounts(MakeBackend);
}

TEST(PrologueRejectTest, RejectsBadSlotsAndPositions) {
  struct Breakage {
    const char* what;
    std::function<void(PrologueInputs&)> apply;
  };
  const Breakage breakages[] = {
      {"swa slot -2", [](PrologueInputs& in) { in.swa.slots[1] = -2; }},
      {"swa slot past the pool", [](PrologueInputs& in) { in.swa.slots[2] = kBlockTokens; }},
      {"compressed slot past the pool", [](PrologueInputs& in) { in.compressed.slots[0] = 1000; }},
      {"duplicate swa slot", [](PrologueInputs& in) { in.swa.slots[2] = in.swa.slots[0]; }},
      {"duplicate compressed slot",
       [](PrologueInputs& in) { in.compressed.slots[1] = in.compressed.slots[0]; }},
      {"query position past the table", [](PrologueInputs& in) { in.positions[1] = 1000; }},
      {"query position -1", [](PrologueInputs& in) { in.positions[2] = -1; }},
      {"swa position past the table", [](PrologueInputs& in) { in.swa.positions[0] = 1000; }},
      {"compressed position past the table",
       [](PrologueInputs& in) { in.compressed.positions[1] = 128 * 1000; }},
  };
  for (const Breakage& breakage : breakages) {
    PrologueInputs inputs;
    breakage.apply(inputs);
    ExpectPrologueRejected(MakeBackend, inputs, NoChange, breakage.what);
  }
}

TEST(DecodeRejectTest, AcceptsTheUnbrokenInputs) {
  const absl::Status status =
      RunBrokenDecode(MakeBackend, DecodeInputsForRejects(), NoDecodeChange);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(DecodeRejectTest, RejectsBadHeadCounts) { ExpectDecodeRejectsBadHeadCounts(MakeBackend); }

TEST(DecodeRejectTest, RejectsNullPointersAndNegativeCounts) {
  ExpectDecodeRejectsNullPointersAndNegativeCounts(MakeBackend);
}

TEST(DecodeRejectTest, RejectsMisalignedOutputs) {
  ExpectDecodeRejectsMisalignedOutputs(MakeBackend);
}

TEST(DecodeRejectTest, RejectsBadIndicesLengthsAndPositions) {
  struct Breakage {
    const char* what;
    std::function<void(DecodeInputsForRejects&)> apply;
  };
  const Breakage breakages[] = {
      {"main index -2", [](DecodeInputsForRejects& in) { in.main.indices[3] = -2; }},
      {"main index past the pool",
       [](DecodeInputsForRejects& in) { in.main.indices[9] = kBlockTokens; }},
      {"extra index past the pool",
       [](DecodeInputsForRejects& in) { in.extra.indices[11] = 1 << 30; }},
      {"extra index -5", [](DecodeInputsForRejects& in) { in.extra.indices[0] = -5; }},
      {"main length past the width", [](DecodeInputsForRejects& in) { in.main.lengths[2] = 9; }},
      {"extra length -1", [](DecodeInputsForRejects& in) { in.extra.lengths[1] = -1; }},
      {"position past the table", [](DecodeInputsForRejects& in) { in.positions[1] = 1000; }},
  };
  for (const Breakage& breakage : breakages) {
    DecodeInputsForRejects inputs;
    breakage.apply(inputs);
    ExpectDecodeRejected(MakeBackend, inputs, NoDecodeChange, breakage.what);
  }
}

TEST(DecodeRejectTest, IgnoresEntriesPastTheLength) {
  ExpectDecodeIgnoresEntriesPastTheLength(MakeBackend);
}

}  // namespace
}  // namespace mla
