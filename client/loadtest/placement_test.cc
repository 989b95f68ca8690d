#include "client/loadtest/placement.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mla::loadtest {
namespace {

std::vector<std::string> Targets(int n) {
  std::vector<std::string> targets;
  for (int i = 0; i < n; ++i) targets.push_back(absl::StrCat("10.0.0.", i + 1, ":50051"));
  return targets;
}

TEST(PlacementTest, EmptyAndSingle) {
  EXPECT_EQ(RendezvousPlace("k", {}), -1);
  EXPECT_EQ(RendezvousPlace("k", Targets(1)), 0);
}

TEST(PlacementTest, SpreadsKeysEvenly) {
  const std::vector<std::string> targets = Targets(4);
  std::vector<int> counts(4, 0);
  for (int k = 0; k < 8000; ++k) ++counts[RendezvousPlace(absl::StrCat("node0/session", k), targets)];
  for (int c : counts) EXPECT_NEAR(c, 2000, 200);
}

TEST(PlacementTest, OrderOfTargetsDoesNotMatter) {
  std::vector<std::string> targets = Targets(5);
  std::vector<std::string> reversed(targets.rbegin(), targets.rend());
  for (int k = 0; k < 500; ++k) {
    const std::string key = absl::StrCat("key", k);
    EXPECT_EQ(targets[RendezvousPlace(key, targets)], reversed[RendezvousPlace(key, reversed)]);
  }
}

TEST(PlacementTest, RemovingATargetMovesOnlyItsKeys) {
  const std::vector<std::string> all = Targets(5);
  std::vector<std::string> fewer = all;
  fewer.erase(fewer.begin() + 2);
  int moved = 0;
  for (int k = 0; k < 2000; ++k) {
    const std::string key = absl::StrCat("key", k);
    const std::string& before = all[RendezvousPlace(key, all)];
    const std::string& after = fewer[RendezvousPlace(key, fewer)];
    if (before != all[2]) {
      EXPECT_EQ(before, after) << key;
    } else {
      ++moved;
    }
  }
  EXPECT_GT(moved, 300);  // about a fifth of the keys lived there
}

TEST(PlacementTest, WeightsSeparateKeyFromTarget) {
  EXPECT_NE(RendezvousWeight("ab", "c"), RendezvousWeight("a", "bc"));
  EXPECT_EQ(RendezvousWeight("ab", "c"), RendezvousWeight("ab", "c"));
}

}  // namespace
}  // namespace mla::loadtest
