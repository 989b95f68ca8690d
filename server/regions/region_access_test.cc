// The service's side of the regions without gRPC: which peers are on this
// host, an Attend message's references resolved into a real shared-memory
// region (and each refusal naming its field), and what keeps an owner's
// regions registered. RegionOwnerOf needs a call: service_test covers it.
#include "server/regions/region_access.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/regions/testing/regions.h"

namespace mla {
namespace {

using ::testing::HasSubstr;

// The peers gRPC writes (proto/addresses_test has every form of address).
TEST(RegionAccessTest, OnlyLoopbackAndUnixPeersAreOnThisHost) {
  for (const char* peer : {"unix:", "unix:/tmp/x.sock", "unix-abstract:name", "ipv4:127.0.0.1:5",
                           "ipv4:127.255.0.9:65535", "ipv6:[::1]:5", "ipv6:%5B::1%5D:5",
                           "ipv6:%5B::ffff:127.0.0.1%5D:5"}) {
    EXPECT_TRUE(IsSameHostPeer(peer)) << peer;
  }
  for (const char* peer : {"ipv4:192.0.2.2:5", "ipv4:10.0.0.1:5", "ipv4:128.0.0.1:5",
                           "ipv6:%5B::2%5D:5", "ipv6:%5Bfd00::2%5D:5", "ipv6:%5B::ffff:10.0.0.1%5D:5",
                           "ipv4:127.0.0.1", "", "fd:4"}) {
    EXPECT_FALSE(IsSameHostPeer(peer)) << peer;
  }
}

class ResolveTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBytes = 1 << 16;

  void SetUp() override {
    absl::StatusOr<uint64_t> id = registry_.RegisterSharedMemory("a", memory_.name(), kBytes);
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
  }

  // A tensor of `bytes` at `offset` of the region.
  wire::TensorView InRegion(int64_t offset, int64_t bytes) const {
    wire::TensorView tensor;
    tensor.dtype = wire::DType::kBf16;
    tensor.shape = {bytes / 2};
    tensor.region = wire::RegionRefView{id_, offset, bytes};
    return tensor;
  }

  absl::Status Refusal(wire::AttendRequestView request, const std::string& owner = "a") const {
    return ResolveRegionReferences(registry_, owner, request).status();
  }

  SharedMemory memory_{kBytes};
  RegionRegistry registry_;
  uint64_t id_ = 0;
};

// q, kv and compressed_kv become views of the region's bytes (no copy),
// which keep it mapped; out and lse become the answer regions; the view
// names no region any more.
TEST_F(ResolveTest, ReferencesBecomeTheRegionsBytes) {
  wire::AttendRequestView request;
  request.q = InRegion(0, 4096);
  request.kv = InRegion(4096, 1024);
  request.compressed_kv = InRegion(8192, 0);
  request.return_lse = true;
  request.out_region = wire::RegionRefView{id_, 16384, 4096};
  request.lse_region = wire::RegionRefView{id_, 20484, 64};
  absl::StatusOr<std::optional<AnswerRegions>> regions =
      ResolveRegionReferences(registry_, "a", request);
  ASSERT_TRUE(regions.ok()) << regions.status();
  ASSERT_TRUE(regions->has_value());
  // The server's own mapping of the client's memory.
  ASSERT_EQ(request.q->pieces.size(), 1u);
  EXPECT_EQ(request.q->pieces[0].size(), 4096u);
  EXPECT_EQ(std::memcmp(request.q->pieces[0].data(), memory_.data(), 4096), 0);
  EXPECT_NE(request.q->keep_alive, nullptr);
  EXPECT_FALSE(request.q->region.has_value());
  EXPECT_EQ(std::memcmp(request.kv->pieces[0].data(), memory_.data() + 4096, 1024), 0);
  EXPECT_EQ(request.kv->pieces[0].data(), request.q->pieces[0].data() + 4096);
  EXPECT_TRUE(request.compressed_kv->pieces.empty()) << "no empty piece";
  EXPECT_TRUE(wire::CheckTensor(request.q, "q", wire::DType::kBf16, {2048}).ok());
  EXPECT_EQ((*regions)->out.data, request.q->pieces[0].data() + 16384);
  EXPECT_EQ((*regions)->out.bytes, 4096);
  EXPECT_EQ((*regions)->lse.data, request.q->pieces[0].data() + 20484);
  (*regions)->lse.data[0] = 0xab;
  EXPECT_EQ(memory_.data()[20484], 0xab) << "the answer lands in the client's memory";
  EXPECT_FALSE(request.out_region.has_value());
  EXPECT_FALSE(UsesRegions(request)) << "resolved";
}

TEST_F(ResolveTest, EachBadReferenceIsRefusedNamingItsField) {
  struct Case {
    std::string what;
    wire::AttendRequestView request;
    absl::StatusCode code;
    std::string words;
  };
  std::vector<Case> cases(9);
  cases[0] = {"top-k", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.topk.region: the top-k must travel inline"};
  cases[0].request.topk = InRegion(0, 64);
  cases[1] = {"past the end", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.q.region: bytes [65536, 65536 + 2) of region"};
  cases[1].request.q = InRegion(kBytes, 2);
  cases[2] = {"unknown", {}, absl::StatusCode::kNotFound,
              "AttendRequest.kv.region: region 99 is not registered by this client"};
  cases[2].request.kv = InRegion(0, 2);
  cases[2].request.kv->region->region_id = 99;
  cases[3] = {"data and region", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.compressed_kv: it carries both data and a region"};
  cases[3].request.compressed_kv = InRegion(0, 2);
  cases[3].request.compressed_kv->pieces.emplace_back(memory_.data(), 2);
  cases[4] = {"lse without out", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.lse_region: only with out_region and return_lse"};
  cases[4].request.return_lse = true;
  cases[4].request.lse_region = wire::RegionRefView{id_, 0, 4};
  cases[5] = {"lse asked, no lse region", {}, absl::StatusCode::kInvalidArgument,
              "return_lse needs an lse_region too"};
  cases[5].request.return_lse = true;
  cases[5].request.out_region = wire::RegionRefView{id_, 0, 1024};
  cases[6] = {"odd out", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_region.offset: 7 is not a multiple of 2"};
  cases[6].request.out_region = wire::RegionRefView{id_, 7, 1024};
  cases[7] = {"lse not a multiple of 4", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.lse_region.offset: 2050 is not a multiple of 4"};
  cases[7].request.return_lse = true;
  cases[7].request.out_region = wire::RegionRefView{id_, 0, 1024};
  cases[7].request.lse_region = wire::RegionRefView{id_, 2050, 4};
  cases[8] = {"negative offset", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_region: bytes [-2, -2 + 1024)"};
  cases[8].request.out_region = wire::RegionRefView{id_, -2, 1024};
  for (const Case& c : cases) {
    const absl::Status status = Refusal(c.request);
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.words)) << c.what;
  }
}

// The FP8 output's answer: out holds its e4m3 bytes (one a value, so any
// offset of a shared-memory region), out_scales_region its scales.
TEST_F(ResolveTest, Fp8AnswersTakeAnOutScalesRegion) {
  wire::AttendRequestView request;
  request.fp8_output = true;
  request.out_region = wire::RegionRefView{id_, 7, 512};
  request.out_scales_region = wire::RegionRefView{id_, 1024, 4};
  wire::AttendRequestView scales_only;
  scales_only.out_scales_region = request.out_scales_region;
  EXPECT_TRUE(UsesRegions(scales_only));
  absl::StatusOr<std::optional<AnswerRegions>> regions =
      ResolveRegionReferences(registry_, "a", request);
  ASSERT_TRUE(regions.ok()) << regions.status();
  ASSERT_TRUE(regions->has_value());
  EXPECT_EQ((*regions)->out.bytes, 512);
  EXPECT_EQ((*regions)->scales.data, (*regions)->out.data - 7 + 1024);
  EXPECT_EQ((*regions)->scales.bytes, 4);
  EXPECT_EQ((*regions)->lse.data, nullptr);
  (*regions)->scales.data[3] = 0x69;
  EXPECT_EQ(memory_.data()[1027], 0x69) << "the scales land in the client's memory";
  EXPECT_FALSE(request.out_scales_region.has_value());
  EXPECT_FALSE(UsesRegions(request)) << "resolved";
}

TEST_F(ResolveTest, EachBadFp8ReferenceIsRefusedNamingItsField) {
  struct Case {
    std::string what;
    wire::AttendRequestView request;
    absl::StatusCode code;
    std::string words;
  };
  std::vector<Case> cases(6);
  cases[0] = {"scales without fp8_output", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_scales_region: only with out_region and fp8_output; drop it, "
              "or set both"};
  cases[0].request.out_region = wire::RegionRefView{id_, 0, 1024};
  cases[0].request.out_scales_region = wire::RegionRefView{id_, 2048, 4};
  cases[1] = {"scales without out_region", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_scales_region: only with out_region and fp8_output"};
  cases[1].request.fp8_output = true;
  cases[1].request.out_scales_region = wire::RegionRefView{id_, 2048, 4};
  cases[2] = {"fp8 into out_region, no scales region", {}, absl::StatusCode::kInvalidArgument,
              "so fp8_output needs an out_scales_region too ([T, H, 4] UE8M0 scales)"};
  cases[2].request.fp8_output = true;
  cases[2].request.out_region = wire::RegionRefView{id_, 0, 512};
  cases[3] = {"scales not a multiple of 4", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_scales_region.offset: 2054 is not a multiple of 4"};
  cases[3].request.fp8_output = true;
  cases[3].request.out_region = wire::RegionRefView{id_, 0, 512};
  cases[3].request.out_scales_region = wire::RegionRefView{id_, 2054, 4};
  cases[4] = {"scales past the end", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_scales_region: bytes [65536, 65536 + 4) of region"};
  cases[4].request.fp8_output = true;
  cases[4].request.out_region = wire::RegionRefView{id_, 0, 512};
  cases[4].request.out_scales_region = wire::RegionRefView{id_, kBytes, 4};
  cases[5] = {"scales at an offset that overflows", {}, absl::StatusCode::kInvalidArgument,
              "AttendRequest.out_scales_region: bytes [9223372036854775804, "
              "9223372036854775804 + 8)"};
  cases[5].request.fp8_output = true;
  cases[5].request.out_region = wire::RegionRefView{id_, 0, 512};
  cases[5].request.out_scales_region =
      wire::RegionRefView{id_, std::numeric_limits<int64_t>::max() - 3, 8};
  for (const Case& c : cases) {
    const absl::Status status = Refusal(c.request);
    EXPECT_EQ(status.code(), c.code) << c.what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.words)) << c.what;
  }
}

// Another owner's region is unknown to it, with the same words.
TEST_F(ResolveTest, AnotherOwnersRegionIsNotFound) {
  wire::AttendRequestView request;
  request.q = InRegion(0, 2);
  const absl::Status status = Refusal(request, "b");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("is not registered by this client"));
}

// An owner keeps its regions while it holds a stream or a session that
// still exists; once it holds neither, they go after the grace period.
TEST(RegionOwnersTest, StreamsAndLiveSessionsKeepRegions) {
  SharedMemory memory(4096);
  TestClock clock;
  RegionRegistry registry(GraceOnClock(clock));
  ASSERT_TRUE(registry.RegisterSharedMemory("streaming", memory.name(), 16).ok());
  ASSERT_TRUE(registry.RegisterSharedMemory("with session", memory.name(), 16).ok());
  ASSERT_TRUE(registry.RegisterSharedMemory("idle", memory.name(), 16).ok());
  RegionOwners owners;
  owners.StreamOpened("streaming");
  owners.SessionCreated("with session", "s1");
  std::vector<SessionSummary> sessions(1);
  sessions[0].session_id = "s1";
  int listed = 0;
  const auto list = [&] {
    ++listed;
    return sessions;
  };
  clock.now += absl::Seconds(31);
  EXPECT_EQ(owners.Sweep(registry, list).size(), 1u);
  EXPECT_TRUE(registry.List("idle").empty());
  EXPECT_EQ(registry.List("with session").size(), 1u);
  EXPECT_EQ(registry.List("streaming").size(), 1u);
  EXPECT_EQ(listed, 1);
  sessions.clear();  // s1 expired or was closed
  owners.StreamClosed("streaming");
  clock.now += absl::Seconds(20);
  EXPECT_TRUE(owners.Sweep(registry, list).empty()) << "within the grace period";
  clock.now += absl::Seconds(11);
  EXPECT_EQ(owners.Sweep(registry, list).size(), 2u);
  EXPECT_TRUE(registry.List("with session").empty());
  EXPECT_TRUE(registry.List("streaming").empty());
  EXPECT_EQ(listed, 2) << "no sessions to look for any more";
  owners.Sweep(registry, list);
  EXPECT_EQ(listed, 2);
}

}  // namespace
}  // namespace mla
