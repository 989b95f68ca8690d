// How many query rows a prologue warp handles (PrologueRowsPerWarp): host
// code only, so these tests need no GPU and run in CI.
#include <cstdint>

#include "gtest/gtest.h"
#include "kernels/cuda/kernels.h"

namespace mla {
namespace {

constexpr int kSms = 132;  // an H200: half of it is 66 CTAs of 8 warps

TEST(PrologueRowsPerWarpTest, FourRowsWhileHalfTheSmsStillGetACta) {
  // H = 64, b = 128: 8192 rows, 256 CTAs of four-row warps.
  EXPECT_EQ(cuda::PrologueRowsPerWarp(128 * 64, kSms), 4);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(4096 * 16, kSms), 4);
  // 66 CTAs of 32 rows exactly: still four.
  EXPECT_EQ(cuda::PrologueRowsPerWarp(66 * 32, kSms), 4);
}

TEST(PrologueRowsPerWarpTest, TwoRowsWhenFourWouldLeaveMoreThanHalfIdle) {
  // H = 16, b = 128: 2048 rows would be 64 CTAs of four-row warps.
  EXPECT_EQ(cuda::PrologueRowsPerWarp(128 * 16, kSms), 2);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(66 * 32 - 8, kSms), 2);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(66 * 16, kSms), 2);
}

TEST(PrologueRowsPerWarpTest, OneRowForSmallBatches) {
  EXPECT_EQ(cuda::PrologueRowsPerWarp(66 * 16 - 8, kSms), 1);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(8, kSms), 1);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(0, kSms), 1);
}

TEST(PrologueRowsPerWarpTest, FollowsTheSmCount) {
  // The same batch on a GPU with twice the SMs gets fewer rows a warp.
  EXPECT_EQ(cuda::PrologueRowsPerWarp(128 * 64, 2 * kSms), 4);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(128 * 32, 2 * kSms), 2);
  EXPECT_EQ(cuda::PrologueRowsPerWarp(128 * 16, 2 * kSms), 1);
}

}  // namespace
}  // namespace mla
