// Rendezvous placement of sessions over servers, without servers: the
// documented weight formula, stability, spread, and that losing or adding a
// server moves only the keys it loses or wins. Cluster's bookkeeping (lost
// servers, bad target lists) needs no server either: channels connect lazily.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/mla_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mla::client {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> Targets(int count) {
  std::vector<std::string> targets;
  for (int i = 0; i < count; ++i) targets.push_back(absl::StrCat("10.0.0.", i + 1, ":50051"));
  return targets;
}

std::string Key(int i) { return absl::StrCat("seq-", i); }

// The formula of the header, computed independently (Python's integers):
// SplitMix64(Fnv1a64(key) ^ SplitMix64(Fnv1a64(target))). Another client
// (Python) must place keys where this one does.
TEST(RendezvousTest, WeightIsTheDocumentedFormula) {
  EXPECT_EQ(RendezvousWeight("seq-1", "10.0.0.1:50051"), 0x113ccf9de930ee00ull);
  EXPECT_EQ(RendezvousWeight("seq-1", "10.0.0.2:50051"), 0xec7174ddbad5afabull);
  EXPECT_EQ(RendezvousWeight("", ""), 0xa0490b007fca3c4bull);
  const std::vector<std::string> targets = Targets(3);
  EXPECT_EQ(RendezvousPlace("seq-1", targets), 1);
  EXPECT_EQ(RendezvousPlace("seq-2", targets), 2);
  EXPECT_EQ(RendezvousPlace("seq-3", targets), 0);
  EXPECT_EQ(RendezvousPlace("request-42", targets), 0);
}

// A StatefulSet's pod names behind its headless Service; the Python
// client's statefulset_targets gives the same.
TEST(StatefulSetTargetsTest, NamesEveryPod) {
  StatefulSetPods pods;
  pods.name = "mla-offload";
  pods.replicas = 2;
  absl::StatusOr<std::vector<std::string>> targets = StatefulSetTargets(pods);
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_EQ(*targets, (std::vector<std::string>{"mla-offload-0.mla-offload-headless:50051",
                                                "mla-offload-1.mla-offload-headless:50051"}));
  pods = {"s", 1, "h", "gpu", "cluster.local", 7000};
  targets = StatefulSetTargets(pods);
  ASSERT_TRUE(targets.ok()) << targets.status();
  EXPECT_EQ(*targets, std::vector<std::string>{"s-0.h.gpu.svc.cluster.local:7000"});
  for (auto [field, change] : std::vector<std::pair<std::string, void (*)(StatefulSetPods&)>>{
           {"name", [](StatefulSetPods& p) { p.name.clear(); }},
           {"replicas", [](StatefulSetPods& p) { p.replicas = 0; }},
           {"port", [](StatefulSetPods& p) { p.port = 70000; }},
           {"cluster_domain", [](StatefulSetPods& p) { p.name_space.clear(); }}}) {
    StatefulSetPods bad{"s", 1, "", "ns", "cluster.local", 50051};
    change(bad);
    absl::StatusOr<std::vector<std::string>> refused = StatefulSetTargets(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr(field));
  }
}

TEST(RendezvousTest, NoTargetsPlacesNowhere) {
  EXPECT_EQ(RendezvousPlace("seq-1", {}), -1);
}

// The same key goes to the same target whatever the order of the list.
TEST(RendezvousTest, PlacementIsStableAndIgnoresListOrder) {
  const std::vector<std::string> targets = Targets(5);
  std::vector<std::string> reversed(targets.rbegin(), targets.rend());
  for (int i = 0; i < 2000; ++i) {
    const int first = RendezvousPlace(Key(i), targets);
    ASSERT_GE(first, 0);
    EXPECT_EQ(RendezvousPlace(Key(i), targets), first);
    EXPECT_EQ(reversed[RendezvousPlace(Key(i), reversed)], targets[first]) << Key(i);
  }
}

TEST(RendezvousTest, KeysSpreadEvenlyOverTargets) {
  const std::vector<std::string> targets = Targets(4);
  std::vector<int> counts(targets.size(), 0);
  const int keys = 20000;
  for (int i = 0; i < keys; ++i) ++counts[RendezvousPlace(Key(i), targets)];
  for (size_t t = 0; t < targets.size(); ++t) {
    // 5000 expected; a binomial standard deviation is about 61.
    EXPECT_GT(counts[t], 4700) << targets[t];
    EXPECT_LT(counts[t], 5300) << targets[t];
  }
}

// Losing a server moves exactly its keys, spread over the others; the rest
// stay where they were.
TEST(RendezvousTest, LosingATargetMovesOnlyItsKeys) {
  const std::vector<std::string> all = Targets(4);
  std::vector<std::string> without = all;
  without.erase(without.begin() + 2);
  std::map<std::string, int> moved_to;
  int moved = 0;
  for (int i = 0; i < 8000; ++i) {
    const std::string& before = all[RendezvousPlace(Key(i), all)];
    const std::string& after = without[RendezvousPlace(Key(i), without)];
    if (before == all[2]) {
      ++moved;
      ++moved_to[after];
    } else {
      EXPECT_EQ(after, before) << Key(i) << " moved though its server stayed";
    }
  }
  EXPECT_GT(moved, 1700);
  EXPECT_LT(moved, 2300);
  ASSERT_EQ(moved_to.size(), 3u) << "the lost server's keys went to fewer than the 3 others";
  for (const auto& [target, count] : moved_to) EXPECT_GT(count, moved / 5) << target;
}

TEST(RendezvousTest, AddingATargetMovesOnlyKeysItWins) {
  const std::vector<std::string> before = Targets(3);
  const std::vector<std::string> after = Targets(4);
  int won = 0;
  for (int i = 0; i < 8000; ++i) {
    const std::string& old_home = before[RendezvousPlace(Key(i), before)];
    const std::string& new_home = after[RendezvousPlace(Key(i), after)];
    if (new_home == after[3]) {
      ++won;
    } else {
      EXPECT_EQ(new_home, old_home) << Key(i);
    }
  }
  EXPECT_GT(won, 1700);
  EXPECT_LT(won, 2300);
}

TEST(ClusterTest, PlacesLikeRendezvousAndSkipsLostServers) {
  const std::vector<std::string> targets = Targets(3);
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Connect(targets);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  ASSERT_EQ(c.size(), 3);
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<int> server = c.Place(Key(i));
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(*server, RendezvousPlace(Key(i), targets));
    EXPECT_EQ(c.target(*server), targets[*server]);
    EXPECT_EQ(c.client(*server).target(), targets[*server]);
  }
  c.MarkLost(1);
  EXPECT_FALSE(c.alive(1));
  const std::vector<std::string> live = {targets[0], targets[2]};
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<int> server = c.Place(Key(i));
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_NE(*server, 1);
    EXPECT_EQ(c.target(*server), live[RendezvousPlace(Key(i), live)]);
  }
  c.MarkLost(0);
  c.MarkLost(2);
  absl::StatusOr<int> none = c.Place("seq-1");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(none.status().message(), HasSubstr("marked lost"));
  c.MarkAlive(1);
  EXPECT_TRUE(c.alive(1));
  EXPECT_EQ(*c.Place("seq-1"), 1);
}

// The targets the server would see as same-host peers, and only those.
TEST(SameHostTest, UnixSocketsAndLoopbackAddressesOnly) {
  for (const char* target : {"unix:/run/mla.sock", "unix-abstract:mla", "localhost:50051",
                             "127.0.0.1:50051", "127.255.0.9:1", "ipv4:127.0.0.1:5",
                             "[::1]:50051", "ipv6:[::1]:50051", "dns:///localhost:50051"}) {
    EXPECT_TRUE(IsSameHostTarget(target)) << target;
  }
  for (const char* target :
       {"10.0.0.1:50051", "192.168.1.2:1", "mla-offload-0.mla-offload-headless:50051",
        "128.0.0.1:5", "127.0.0:5", "127.0.0.256:5", "127.0.0.1", "127.0.0.01a:5", "[::2]:5",
        "xlocalhost:5", "", "unixx:/a", "127.0.0.-1:5"}) {
    EXPECT_FALSE(IsSameHostTarget(target)) << target;
  }
}

// Sessions whose tensors go through shared memory are placed only on the
// servers of this host, by rendezvous over those; with none of them live the
// error says what to change.
TEST(ClusterTest, SameHostSessionsGoOnlyToServersOfThisHost) {
  const std::vector<std::string> targets = {"10.0.0.1:50051", "127.0.0.1:50052",
                                            "10.0.0.2:50051", "unix:/tmp/mla-test.sock"};
  absl::StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Connect(targets);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  const std::vector<std::string> local = {targets[1], targets[3]};
  int on_each[4] = {0, 0, 0, 0};
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<int> server = c.Place(Key(i), {.same_host = true});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ(c.target(*server), local[RendezvousPlace(Key(i), local)]);
    ++on_each[*server];
  }
  EXPECT_EQ(on_each[0] + on_each[2], 0);
  EXPECT_GT(on_each[1], 100);
  EXPECT_GT(on_each[3], 100);
  c.MarkLost(1);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(*c.Place(Key(i), {.same_host = true}), 3);
  c.MarkLost(3);
  absl::StatusOr<int> lost = c.Place("seq-1", {.same_host = true});
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(lost.status().message(), HasSubstr("of this host are marked lost"));
  EXPECT_TRUE(c.Place("seq-1").ok()) << "any server still takes sessions";

  absl::StatusOr<std::unique_ptr<Cluster>> remote =
      Cluster::Connect({"10.0.0.1:50051", "10.0.0.2:50051"});
  ASSERT_TRUE(remote.ok());
  absl::StatusOr<PlacedSession> none =
      (*remote)->CreateSession("seq-1", SessionOptions(), {}, {.same_host = true});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("unix: or loopback target"));
}

TEST(ClusterTest, RefusesEmptyAndRepeatedTargetLists) {
  absl::StatusOr<std::unique_ptr<Cluster>> empty = Cluster::Connect({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<Cluster>> repeated =
      Cluster::Connect({"a:1", "b:2", "a:1"});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(repeated.status().message(), HasSubstr("a:1 is listed twice"));
}

}  // namespace
}  // namespace mla::client
