// The region registry with real POSIX shared memory made by the test (the
// client's side): registration and its refusals, bounds-checked references
// that cannot overflow, owners that cannot see each other's regions, a
// region unregistered while a slice of it is in use, limits, and an idle
// owner's regions going after the grace period.
#include "server/regions/region_registry.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/regions/testing/regions.h"

namespace mla {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(RegionRegistryTest, ReferencesSeeTheClientsBytesBothWays) {
  SharedMemory memory(1 << 16);
  RegionRegistry registry;
  absl::StatusOr<uint64_t> id = registry.RegisterSharedMemory("ipv4:127.0.0.1:5000", memory.name(),
                                                              1 << 16);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_NE(*id, 0u);
  absl::StatusOr<RegionSlice> slice =
      registry.Resolve("ipv4:127.0.0.1:5000", *id, 100, 1000, "AttendRequest.q");
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_EQ(slice->bytes, 1000);
  EXPECT_EQ(std::memcmp(slice->data, memory.data() + 100, 1000), 0);
  slice->data[0] = 0xab;  // the server writes an answer there
  EXPECT_EQ(memory.data()[100], 0xab) << "one memory, not a copy";
  const std::vector<RegionSummary> list = registry.List("ipv4:127.0.0.1:5000");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].id, *id);
  EXPECT_EQ(list[0].name, memory.name());
  EXPECT_EQ(list[0].bytes, 1 << 16);
  // The whole region, and an empty slice at its end.
  EXPECT_TRUE(registry.Resolve("ipv4:127.0.0.1:5000", *id, 0, 1 << 16, "q").ok());
  EXPECT_TRUE(registry.Resolve("ipv4:127.0.0.1:5000", *id, 1 << 16, 0, "q").ok());
}

TEST(RegionRegistryTest, ReferencesOutsideTheRegionAreRefusedWithoutOverflow) {
  SharedMemory memory(4096);
  RegionRegistry registry;
  absl::StatusOr<uint64_t> id = registry.RegisterSharedMemory("a", memory.name(), 4096);
  ASSERT_TRUE(id.ok()) << id.status();
  for (auto [offset, bytes] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 4097}, {4096, 1}, {4097, 0}, {-1, 10}, {10, -1}, {kMax, 1}, {1, kMax},
           {kMax, kMax}, {std::numeric_limits<int64_t>::min(), 4096}}) {
    absl::StatusOr<RegionSlice> slice = registry.Resolve("a", *id, offset, bytes, "AttendRequest.kv");
    EXPECT_EQ(slice.status().code(), absl::StatusCode::kInvalidArgument) << offset << " " << bytes;
    EXPECT_THAT(std::string(slice.status().message()), HasSubstr("AttendRequest.kv"));
    EXPECT_THAT(std::string(slice.status().message()), HasSubstr("within its 4096 bytes"));
  }
}

// Another owner sees nothing of a region: not in its list, NOT_FOUND to
// resolve or unregister (the same words as for an id nobody registered),
// and the region stays.
TEST(RegionRegistryTest, AnotherOwnersRegionDoesNotExistForIt) {
  SharedMemory memory(4096);
  RegionRegistry registry;
  absl::StatusOr<uint64_t> id = registry.RegisterSharedMemory("a", memory.name(), 4096);
  ASSERT_TRUE(id.ok());
  EXPECT_TRUE(registry.List("b").empty());
  const absl::Status foreign = registry.Resolve("b", *id, 0, 1, "q").status();
  const absl::Status unknown = registry.Resolve("b", *id + 100, 0, 1, "q").status();
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(foreign.message()), HasSubstr("is not registered by this client"));
  EXPECT_EQ(registry.Unregister("b", *id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.Resolve("a", *id, 0, 1, "q").ok()) << "the owner's region is untouched";
}

// Unregistering takes the region away from later references, but a slice a
// step already holds stays mapped; the id is not reused.
TEST(RegionRegistryTest, AnUnregisteredRegionStaysMappedForTheStepUsingIt) {
  RegionRegistry registry;
  absl::StatusOr<RegionSlice> held;
  uint64_t first = 0;
  {
    SharedMemory memory(8192);
    absl::StatusOr<uint64_t> id = registry.RegisterSharedMemory("a", memory.name(), 8192);
    ASSERT_TRUE(id.ok());
    first = *id;
    held = registry.Resolve("a", first, 4096, 4096, "out");
    ASSERT_TRUE(held.ok());
    ASSERT_TRUE(registry.Unregister("a", first).ok());
    EXPECT_EQ(registry.Unregister("a", first).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(registry.Resolve("a", first, 0, 1, "q").status().code(),
              absl::StatusCode::kNotFound);
  }  // the client unmaps and unlinks its object
  std::memset(held->data, 0x5a, held->bytes);  // still the server's to write
  EXPECT_EQ(held->data[held->bytes - 1], 0x5a);
  SharedMemory again(4096);
  absl::StatusOr<uint64_t> next = registry.RegisterSharedMemory("a", again.name(), 4096);
  ASSERT_TRUE(next.ok());
  EXPECT_GT(*next, first) << "ids are never reused";
}

TEST(RegionRegistryTest, BadRegistrationsSayWhatToChangeAndRegisterNothing) {
  SharedMemory memory(4096);
  RegionRegistry registry;
  struct Case {
    std::string name;
    int64_t bytes;
    absl::StatusCode code;
    std::string words;
  };
  for (const Case& c : std::vector<Case>{
           {"no-slash", 16, absl::StatusCode::kInvalidArgument, "POSIX shared-memory name"},
           {"/a/b", 16, absl::StatusCode::kInvalidArgument, "without \"/\""},
           {"/", 16, absl::StatusCode::kInvalidArgument, "1 to 254 characters"},
           {"/" + std::string(300, 'x'), 16, absl::StatusCode::kInvalidArgument, "(301 bytes)"},
           {memory.name(), 0, absl::StatusCode::kInvalidArgument, "at least 1"},
           {memory.name(), -5, absl::StatusCode::kInvalidArgument, "byte_size is -5"},
           {memory.name(), 4097, absl::StatusCode::kInvalidArgument,
            "holds 4096 bytes, fewer than byte_size 4097"},
           {"/mla-region-test-none", 16, absl::StatusCode::kNotFound, "create it (shm_open)"},
       }) {
    absl::StatusOr<uint64_t> id = registry.RegisterSharedMemory("a", c.name, c.bytes);
    EXPECT_EQ(id.status().code(), c.code) << c.name.substr(0, 20) << " " << c.bytes;
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(c.words)) << c.name.substr(0, 20);
  }
  EXPECT_TRUE(registry.List("a").empty());
}

TEST(RegionRegistryTest, LimitsPerOwnerChangeNothing) {
  SharedMemory memory(4096);
  RegionRegistryOptions options;
  options.max_regions_per_owner = 2;
  options.max_bytes_per_owner = 6000;
  RegionRegistry registry(options);
  ASSERT_TRUE(registry.RegisterSharedMemory("a", memory.name(), 4096).ok());
  const absl::Status bytes = registry.RegisterSharedMemory("a", memory.name(), 2000).status();
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(bytes.message()), HasSubstr("more than the 1904 this client may still"));
  ASSERT_TRUE(registry.RegisterSharedMemory("a", memory.name(), 1000).ok());
  const absl::Status count = registry.RegisterSharedMemory("a", memory.name(), 1).status();
  EXPECT_EQ(count.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(count.message()), HasSubstr("holds 2 regions, the most it may"));
  EXPECT_EQ(registry.List("a").size(), 2u);
  EXPECT_TRUE(registry.RegisterSharedMemory("b", memory.name(), 4096).ok()) << "per owner";
}

// An owner that has held no stream and no session for the grace period
// loses its regions; one that keeps touching keeps them.
TEST(RegionRegistryTest, AnIdleOwnersRegionsGoAfterTheGracePeriod) {
  SharedMemory memory(4096);
  TestClock clock;
  RegionRegistry registry(GraceOnClock(clock));
  absl::StatusOr<uint64_t> gone = registry.RegisterSharedMemory("gone", memory.name(), 16);
  absl::StatusOr<uint64_t> busy = registry.RegisterSharedMemory("busy", memory.name(), 16);
  ASSERT_TRUE(gone.ok() && busy.ok());
  clock.now += absl::Seconds(20);
  registry.Touch("busy");
  EXPECT_TRUE(registry.Expire().empty()) << "nobody idle 30 s yet";
  clock.now += absl::Seconds(15);
  EXPECT_EQ(registry.Expire(), std::vector<uint64_t>{*gone});
  EXPECT_TRUE(registry.List("gone").empty());
  EXPECT_EQ(registry.List("busy").size(), 1u);
  clock.now += absl::Seconds(31);
  EXPECT_EQ(registry.Expire(), std::vector<uint64_t>{*busy});
}

// A pinner records what it pins; it can be made to fail.
class RecordingPinner : public HostPinner {
 public:
  explicit RecordingPinner(bool fails) : fails_(fails) {}
  absl::Status Pin(void* data, int64_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex);
    pinned.push_back({data, bytes});
    return fails_ ? absl::ResourceExhaustedError("locked-memory limit") : absl::OkStatus();
  }
  void Unpin(void* data) override {
    std::lock_guard<std::mutex> lock(mutex);
    unpinned.push_back(data);
  }
  std::mutex mutex;
  std::vector<std::pair<void*, int64_t>> pinned;
  std::vector<void*> unpinned;

 private:
  const bool fails_;
};

// With a pinner (a GPU backend's), each mapping is pinned once when it is
// registered and unpinned when the last slice of it goes, after the region
// was unregistered. A mapping that cannot be pinned is still served.
TEST(RegionRegistryTest, MappingsArePinnedWhileMapped) {
  for (bool fails : {false, true}) {
    SharedMemory memory(8192);
    auto pinner = std::make_shared<RecordingPinner>(fails);
    RegionRegistryOptions options;
    options.pinner = pinner;
    RegionRegistry registry(options);
    absl::StatusOr<uint64_t> id = registry.RegisterSharedMemory("a", memory.name(), 8192);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_EQ(pinner->pinned.size(), 1u) << fails;
    EXPECT_EQ(pinner->pinned[0].second, 8192);
    absl::StatusOr<RegionSlice> slice = registry.Resolve("a", *id, 0, 100, "AttendRequest.q");
    ASSERT_TRUE(slice.ok()) << slice.status();
    EXPECT_EQ(static_cast<void*>(slice->data), pinner->pinned[0].first);
    EXPECT_EQ(std::memcmp(slice->data, memory.data(), 100), 0) << fails;
    ASSERT_TRUE(registry.Unregister("a", *id).ok());
    EXPECT_TRUE(pinner->unpinned.empty()) << "unpinned while a step still reads it";
    *slice = RegionSlice();
    if (fails) {
      EXPECT_TRUE(pinner->unpinned.empty()) << "unpinned what was never pinned";
    } else {
      EXPECT_EQ(pinner->unpinned, std::vector<void*>{pinner->pinned[0].first});
    }
  }
}

// Stands in for the CUDA backend's importer: "device memory" of the size a
// handle's first byte names (in KiB), closed when the last slice goes;
// handle "bad" is refused as the driver would.
class FakeImporter : public DeviceImporter {
 public:
  int open = 0;  // imports not yet closed
  absl::StatusOr<ImportedMemory> Import(absl::string_view handle,
                                        absl::string_view device_uuid) override {
    if (handle == "bad") return absl::InvalidArgumentError("cuda_ipc_handle: the driver cannot open it");
    if (device_uuid != "GPU-1") return absl::NotFoundError("device_uuid: no GPU of this host");
    const int64_t bytes = int64_t{static_cast<uint8_t>(handle[0])} << 10;
    auto* memory = new std::vector<uint8_t>(bytes);
    ++open;
    std::shared_ptr<const void> mapping(memory, [this](const void* p) {
      delete static_cast<const std::vector<uint8_t>*>(p);
      --open;
    });
    return ImportedMemory{std::move(mapping), memory->data(), bytes};
  }
};

// CUDA IPC regions: opened once by the backend's importer, bounded by the
// allocation's size, listed as device memory with the GPU's UUID, their
// slices marked as device memory; refusals (no importer, the importer's,
// a size past the allocation, the limits) register nothing and leave
// nothing open; unregistering closes the memory once the last slice goes.
TEST(RegionRegistryTest, CudaIpcRegionsAreOpenedOnceAndBounded) {
  RegionRegistry without;
  absl::StatusOr<uint64_t> refused = without.RegisterCudaIpc("a", "\x04", "GPU-1", 1024);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("REGION_KIND_SYSTEM_SHM"));

  auto importer = std::make_shared<FakeImporter>();
  RegionRegistryOptions options;
  options.importer = importer;
  options.max_bytes_per_owner = 8 << 10;
  RegionRegistry registry(options);
  const std::string handle(1, '\x04');  // 4 KiB
  for (const auto& [what, handle_bytes, uuid, bytes, code, field] :
       std::vector<std::tuple<std::string, std::string, std::string, int64_t, absl::StatusCode,
                              std::string>>{
           {"past the allocation", handle, "GPU-1", 4097, absl::StatusCode::kInvalidArgument,
            "byte_size 4097 is more than the 4096 bytes"},
           {"no size", handle, "GPU-1", 0, absl::StatusCode::kInvalidArgument, "byte_size is 0"},
           {"a handle the driver refuses", "bad", "GPU-1", 16, absl::StatusCode::kInvalidArgument,
            "cuda_ipc_handle"},
           {"another host's GPU", handle, "GPU-2", 16, absl::StatusCode::kNotFound, "device_uuid"},
           {"past the owner's bytes", std::string(1, '\x10'), "GPU-1", 9 << 10,
            absl::StatusCode::kResourceExhausted, "more than the 8192"}}) {
    absl::StatusOr<uint64_t> id = registry.RegisterCudaIpc("a", handle_bytes, uuid, bytes);
    EXPECT_EQ(id.status().code(), code) << what << ": " << id.status();
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(field)) << what;
  }
  EXPECT_TRUE(registry.List("a").empty());
  EXPECT_EQ(importer->open, 0) << "a refused registration left its memory open";

  absl::StatusOr<uint64_t> id = registry.RegisterCudaIpc("a", handle, "GPU-1", 4096);
  ASSERT_TRUE(id.ok()) << id.status();
  const std::vector<RegionSummary> list = registry.List("a");
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0].device);
  EXPECT_EQ(list[0].device_uuid, "GPU-1");
  EXPECT_EQ(list[0].bytes, 4096);
  absl::StatusOr<RegionSlice> slice = registry.Resolve("a", *id, 16, 4080, "AttendRequest.q");
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_TRUE(slice->device);
  EXPECT_EQ(registry.Resolve("a", *id, 16, 4081, "AttendRequest.q").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Resolve("b", *id, 0, 16, "AttendRequest.q").status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry.Unregister("a", *id).ok());
  EXPECT_EQ(importer->open, 1) << "closed while a step's slice still uses it";
  slice = absl::InternalError("let go");
  EXPECT_EQ(importer->open, 0) << "still open once nothing uses it";
}

}  // namespace
}  // namespace mla
