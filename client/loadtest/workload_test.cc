#include "client/loadtest/workload.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/model_profile.h"

namespace mla::loadtest {
namespace {

const ModelProfile& Flash() { return **FindModelProfile("deepseek-v4-flash"); }

TEST(WorkloadTest, RowsArePureFunctionsOfTheirIdentity) {
  const Workload a(Flash(), 1024, 1), b(Flash(), 1024, 1);
  const uint64_t salt = Workload::SessionSalt(7, 0, 3);
  EXPECT_EQ(salt, Workload::SessionSalt(7, 0, 3));
  EXPECT_NE(salt, Workload::SessionSalt(7, 0, 4));
  EXPECT_NE(salt, Workload::SessionSalt(8, 0, 3));
  for (int32_t p = 0; p < 50; ++p) {
    EXPECT_EQ(std::vector<uint16_t>(a.SwaRow(salt, 2, p), a.SwaRow(salt, 2, p) + 512),
              std::vector<uint16_t>(b.SwaRow(salt, 2, p), b.SwaRow(salt, 2, p) + 512));
  }
  // Different identities pick different rows (almost always).
  int same = 0;
  for (int32_t p = 0; p < 200; ++p) same += a.SwaRow(salt, 2, p) == a.SwaRow(salt, 3, p);
  EXPECT_LT(same, 5);
  EXPECT_NE(a.SwaRow(salt, 2, 9), a.CompressedRow(salt, 2, 9));
}

TEST(WorkloadTest, PoolHoldsNoZerosAndVariedScales) {
  const Workload workload(Flash(), 256, 3);
  std::set<int> exponents;
  for (int64_t r = 0; r < 256; ++r) {
    const uint16_t* row = workload.SwaRow(r, 0, 0);
    for (int i = 0; i < 512; ++i) {
      ASSERT_NE(row[i] & 0x7fff, 0);
      ASSERT_TRUE(std::isfinite(Bf16ToFloat(row[i])));
    }
    // The first tile's largest magnitude: its power-of-two scale shows.
    float amax = 0;
    for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(Bf16ToFloat(row[i])));
    exponents.insert(std::ilogb(amax));
  }
  EXPECT_GE(exponents.size(), 4u);
}

TEST(WorkloadTest, QueryIsAContiguousRunOfThePool) {
  const Workload workload(Flash(), 4096, 3);
  const absl::Span<const uint16_t> q = workload.Query(Workload::MessageKey(1, 2, 3, 4, 0), 128, 16);
  EXPECT_EQ(q.size(), 128u * 16 * 512);
  EXPECT_EQ(q.data(), workload.Query(Workload::MessageKey(1, 2, 3, 4, 0), 128, 16).data());
  EXPECT_NE(q.data(), workload.Query(Workload::MessageKey(1, 2, 4, 4, 0), 128, 16).data());
  // The whole pool as one query is the only run there is.
  EXPECT_EQ(workload.Query(99, 256, 16).size(), 4096u * 512);
  EXPECT_EQ(workload.Bytes(5, 1000).size(), 1000u);
  EXPECT_EQ(workload.Bytes(5, 4096u * 1024).size(), 4096u * 1024);
}

TEST(WorkloadTest, TopKListsDistinctExistingRowsThenPads) {
  const Workload workload(Flash(), 64, 3);
  const int width = Flash().indexer_topk;  // 512
  for (int32_t position : {0, 2, 3, 10, 2047, 2048, 2051, 5000}) {
    std::vector<int32_t> topk;
    workload.AppendTopK(11, 2, position, &topk);
    ASSERT_EQ(topk.size(), static_cast<size_t>(width));
    const int32_t rows = (position + 1) / 4;
    const int valid = std::min(rows, width);
    std::set<int32_t> seen;
    for (int i = 0; i < width; ++i) {
      if (i < valid) {
        EXPECT_GE(topk[i], 0);
        EXPECT_LT(topk[i], rows);
        seen.insert(topk[i]);
      } else {
        EXPECT_EQ(topk[i], -1);
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(valid)) << position;
  }
}

TEST(WorkloadTest, SinksLookLikeTheModelsAndMatchOneByOne) {
  const Workload workload(Flash(), 64, 3);
  const std::vector<float> sinks = workload.Sinks(5);
  ASSERT_EQ(sinks.size(),
            static_cast<size_t>(Flash().num_attention_layers()) * Flash().num_query_heads);
  int infinite = 0;
  for (size_t i = 0; i < sinks.size(); ++i) {
    if (std::isinf(sinks[i])) {
      ++infinite;
      EXPECT_LT(sinks[i], 0);
    } else {
      EXPECT_GE(sinks[i], 2.0f);
      EXPECT_LE(sinks[i], 7.0f);
    }
    EXPECT_EQ(sinks[i], workload.Sink(5, static_cast<int>(i / 64), static_cast<int>(i % 64)));
  }
  EXPECT_NEAR(infinite, sinks.size() / 13.0, 2);
}

}  // namespace
}  // namespace mla::loadtest
