// The decode's key-split plan, seen through DecodeScratchBytes (the bytes of
// split partial results the backend allocates: tokens x Hp x splits rows of
// 512 + 2 floats, or 0 without a split). Host code only, so these tests need
// no GPU and run in CI.
#include <cstddef>
#include <cstdint>
#include <random>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda/decode_kernels.h"
#include "kernels/cuda/kernels.h"

namespace mla {
namespace {

constexpr int kSms = 132;  // an H200
constexpr size_t kPartialBytes = (512 + 2) * sizeof(float);

DecodeParams Shape(int64_t tokens, int padded_heads, int main_width, int extra_width) {
  DecodeParams p;
  p.num_tokens = tokens;
  p.num_heads = padded_heads;
  p.padded_heads = padded_heads;
  p.main.width = main_width;
  p.extra.width = extra_width;
  return p;
}

// The number of key splits a plan chose (0: none).
int64_t Splits(const DecodeParams& p, cuda::DecodeKernels kernels) {
  const size_t bytes = cuda::DecodeScratchBytes(p, kernels, kSms);
  const size_t per_split = static_cast<size_t>(p.num_tokens) * p.padded_heads * kPartialBytes;
  EXPECT_EQ(bytes % per_split, 0u) << "scratch of a whole number of splits";
  return static_cast<int64_t>(bytes / per_split);
}

TEST(DecodePlanTest, ABatchThatFillsTheGpuIsNotSplit) {
  for (int heads : {8, 16, 24, 32, 48, 64, 96, 128}) {
    EXPECT_EQ(Splits(Shape(128, heads, 128, 512), cuda::DecodeKernels::kWgmma), 0) << heads;
    EXPECT_EQ(Splits(Shape(512, heads, 128, 1024), cuda::DecodeKernels::kWgmma), 0) << heads;
  }
}

TEST(DecodePlanTest, ASmallBatchSplitsItsKeysIntoOneWave) {
  // 64 tokens, one CTA each: two splits of five 64-key chunks (132 / 64).
  EXPECT_EQ(Splits(Shape(64, 16, 128, 512), cuda::DecodeKernels::kWgmma), 2);
  // 64 tokens of 128 heads are 128 CTAs already.
  EXPECT_EQ(Splits(Shape(64, 128, 128, 1024), cuda::DecodeKernels::kWgmma), 0);
  // One token: a split a chunk (640 keys: 10, 1152 keys: 18). A CTA's
  // latency over its keys is the time of a small batch: one chunk each
  // took V4-Flash H=16 at b <= 8 from 11.9-12.3 to 10.1-10.8 us
  // (kernels/bench/RESULTS.md).
  EXPECT_EQ(Splits(Shape(1, 8, 128, 512), cuda::DecodeKernels::kWgmma), 10);
  EXPECT_EQ(Splits(Shape(1, 8, 128, 1024), cuda::DecodeKernels::kWgmma), 18);
}

TEST(DecodePlanTest, ShortListsAreNotSplit) {
  EXPECT_EQ(Splits(Shape(1, 16, 0, 0), cuda::DecodeKernels::kWgmma), 0);
  EXPECT_EQ(Splits(Shape(1, 16, 64, 0), cuda::DecodeKernels::kWgmma), 0);    // one chunk
  EXPECT_EQ(Splits(Shape(1, 16, 128, 0), cuda::DecodeKernels::kWgmma), 2);   // two chunks
  EXPECT_EQ(Splits(Shape(1, 16, 64, 65), cuda::DecodeKernels::kWgmma), 3);   // three chunks
}

TEST(DecodePlanTest, TheNarrowKernelKeepsThe64RowKernelsPlan) {
  // At Hp <= 32 the default runs decode_narrow.cu and MLA_CUDA_DECODE=padded
  // decode_wgmma.cu: one CTA a token (and split) in both.
  for (int heads : {8, 16, 32}) {
    for (int64_t tokens : {1, 7, 64, 100, 131, 132, 1000}) {
      const DecodeParams p = Shape(tokens, heads, 128, 1024);
      EXPECT_EQ(cuda::DecodeScratchBytes(p, cuda::DecodeKernels::kWgmma, kSms),
                cuda::DecodeScratchBytes(p, cuda::DecodeKernels::kPadded, kSms))
          << heads << " heads, " << tokens << " tokens";
    }
  }
}

// Whether the narrow kernel's producers take the ring, on the plans of the
// benchmark's shapes (kernels/bench/RESULTS.md measured both).
bool Ring(int64_t tokens, int heads, int extra_width) {
  const cuda::DecodeSplit split =
      cuda::DecodeSplitOf(Shape(tokens, heads, 128, extra_width), cuda::DecodeKernels::kWgmma, kSms);
  return cuda::NarrowUsesRing(heads, split.split_entries);
}

TEST(DecodePlanTest, TheNarrowKernelTakesTheRingWhereACtaHasManyChunks) {
  for (int heads : {8, 16}) {
    // V4-Pro unsplit: 18 chunks a CTA.
    EXPECT_TRUE(Ring(128, heads, 1024)) << heads;
    EXPECT_TRUE(Ring(512, heads, 1024)) << heads;
    // V4-Flash (10 chunks), and V4-Pro split in two at b = 64 (9).
    EXPECT_FALSE(Ring(128, heads, 512)) << heads;
    EXPECT_FALSE(Ring(512, heads, 512)) << heads;
    EXPECT_FALSE(Ring(64, heads, 1024)) << heads;
    EXPECT_FALSE(Ring(1, heads, 1024)) << heads;
  }
  // One producer group always takes it.
  for (int heads : {24, 32}) {
    EXPECT_TRUE(Ring(128, heads, 512)) << heads;
    EXPECT_TRUE(Ring(1, heads, 512)) << heads;
  }
  EXPECT_FALSE(cuda::NarrowUsesRing(16, 13 * 64));
  EXPECT_TRUE(cuda::NarrowUsesRing(16, 13 * 64 + 1));
}

TEST(DecodePlanTest, SplitsStayWithinOneWaveAndTheLimit) {
  std::mt19937 rng(4);
  for (int i = 0; i < 2000; ++i) {
    const int heads = 8 << (rng() % 5);
    const int64_t tokens = 1 + rng() % 300;
    const DecodeParams p = Shape(tokens, heads, rng() % 257, rng() % 2049);
    const int64_t ctas = tokens * ((heads + 63) / 64);
    const int64_t splits = Splits(p, cuda::DecodeKernels::kWgmma);
    const int64_t chunks = (p.main.width + p.extra.width + 63) / 64;
    if (splits == 0) continue;
    EXPECT_GE(splits, 2);
    EXPECT_LE(splits, 32) << "kMaxSplits";
    EXPECT_LE(ctas * splits, kSms) << "a split that fills more than one wave";
    EXPECT_GE(chunks, splits) << "a chunk a split at least";
  }
}

// The keys a chunk of each kernel set at Hp: the 64-head kernels and the
// narrow one 64; mma.sync 32 with 16 heads a CTA (Hp 8, 16), 64 with 32; the
// CUDA-core kernel 512 / its heads a CTA (8 at Hp 8, else 16).
int ChunkKeys(cuda::DecodeKernels kernels, int padded_heads) {
  switch (kernels) {
    case cuda::DecodeKernels::kWgmma:
    case cuda::DecodeKernels::kPadded:
      return 64;
    case cuda::DecodeKernels::kMma:
      return padded_heads >= 32 ? 64 : 32;
    case cuda::DecodeKernels::kSimt:
      return padded_heads >= 16 ? 32 : 64;
  }
  return 0;
}

// Every plan, of every kernel set, gives each entry of the widest list to
// exactly one split: the splits cover the width, none is empty, and split
// boundaries fall on the kernel's chunks. The scratch is for those splits.
TEST(DecodePlanTest, EverySplitPlanCoversTheListsOnceOnWholeChunks) {
  std::mt19937 rng(7);
  int split_plans = 0;
  for (cuda::DecodeKernels kernels :
       {cuda::DecodeKernels::kWgmma, cuda::DecodeKernels::kPadded, cuda::DecodeKernels::kMma,
        cuda::DecodeKernels::kSimt}) {
    for (int i = 0; i < 3000; ++i) {
      const int heads = 8 << (rng() % 5);
      const int64_t tokens = 1 + rng() % (i % 2 == 0 ? 8 : 400);
      const DecodeParams p = Shape(tokens, heads, rng() % 300, rng() % 4100);
      const int width = p.main.width + p.extra.width;
      const cuda::DecodeSplit split = cuda::DecodeSplitOf(p, kernels, kSms);
      SCOPED_TRACE(testing::Message() << cuda::DecodeKernelsName(kernels) << ", " << tokens
                                      << " tokens, Hp " << heads << ", width " << width);
      ASSERT_GE(split.splits, 1);
      ASSERT_GE(split.split_entries, 1);
      EXPECT_EQ(split.chunk_keys, ChunkKeys(kernels, heads));
      EXPECT_GE(int64_t{split.splits} * split.split_entries, width) << "entries past every split";
      if (split.splits == 1) {
        EXPECT_EQ(cuda::DecodeScratchBytes(p, kernels, kSms), 0u);
        continue;
      }
      ++split_plans;
      EXPECT_LT(int64_t{split.splits - 1} * split.split_entries, width) << "an empty split";
      EXPECT_EQ(split.split_entries % split.chunk_keys, 0) << "a split boundary inside a chunk";
      EXPECT_EQ(cuda::DecodeScratchBytes(p, kernels, kSms),
                static_cast<size_t>(tokens) * heads * split.splits * kPartialBytes);
    }
  }
  EXPECT_GT(split_plans, 1000) << "the shapes should split often";
}

}  // namespace
}  // namespace mla
