// The same-host data plane's regions: memory a
// client on this host shares with the server once, so that its messages can
// carry (region, offset, bytes) references instead of tensor bytes.
//
// A region belongs to the client that registered it (its owner: the
// client's identity as the service names it, server/regions/region_access.h; the
// tenant once authentication exists); every call
// names the owner, and another owner's region is NOT_FOUND, so existence
// never leaks. Kinds: POSIX shared memory by name (shm_open), mapped
// read-write once at registration; device memory another process exported
// (a CUDA IPC handle), opened once at registration by the compute backend's
// DeviceImporter, whose slices are device memory (RegionSlice::device).
//
// Resolve() bounds-checks a reference with arithmetic that cannot overflow
// and returns a RegionSlice (server/engine/requests.h) that keeps the mapping
// alive: a region unregistered while a step uses it stays mapped until that
// step's slices are gone, and later references to it are NOT_FOUND. The
// bytes may change under the server while it reads them (the client owns
// them); a client that does so can corrupt only its own answer, which is why
// index tensors (top-k) never come from a region.
//
// Regions go when their owner unregisters them, when the owner has held no
// stream and no session for `grace` (Expire, with the owner's last activity
// from Touch), and when the registry goes. Limits per owner (regions, bytes)
// give RESOURCE_EXHAUSTED and change nothing.
//
// Thread-safe.
#ifndef MLA_OFFLOAD_SERVER_REGIONS_REGION_REGISTRY_H_
#define MLA_OFFLOAD_SERVER_REGIONS_REGION_REGISTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/backend.h"
#include "server/engine/requests.h"
#include "server/process/clock.h"

namespace mla {

struct RegionRegistryOptions {
  int max_regions_per_owner = 64;
  int64_t max_bytes_per_owner = int64_t{64} << 30;
  absl::Duration grace = absl::Seconds(30);  // an owner idle this long loses its regions
  Clock clock = MonotonicNow;
  // Pins each mapping for the device's copies (ComputeBackend::MakeHostPinner)
  // while it is mapped; null: none. A region that cannot be pinned (the
  // host's locked-memory limit) is registered unpinned, with a log line: its
  // copies are slower, not wrong.
  std::shared_ptr<HostPinner> pinner;
  // Opens CUDA IPC handles (ComputeBackend::MakeDeviceImporter); null: a
  // backend without device memory, which refuses them (UNIMPLEMENTED).
  std::shared_ptr<DeviceImporter> importer;
};

struct RegionSummary {
  uint64_t id = 0;
  bool device = false;      // a CUDA IPC region
  std::string name;         // shared memory: its name
  std::string device_uuid;  // CUDA IPC: the GPU it lies on
  int64_t bytes = 0;
};

class RegionRegistry {
 public:
  explicit RegionRegistry(const RegionRegistryOptions& options = {});
  ~RegionRegistry();
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;

  // Maps the POSIX shared-memory object `name` ("/" then 1 to 254
  // characters, none of them "/"), which must hold at least `bytes` bytes
  // (1 or more); its id (never 0, never reused). INVALID_ARGUMENT for a bad
  // name or size, NOT_FOUND for an object that does not exist,
  // PERMISSION_DENIED where the server may not open it read-write.
  absl::StatusOr<uint64_t> RegisterSharedMemory(const std::string& owner, const std::string& name,
                                                int64_t bytes);
  // Opens the first `bytes` (1 or more) of the device memory that `handle`
  // (a cudaIpcMemHandle_t's bytes) exports, on the GPU `device_uuid`; its
  // id. UNIMPLEMENTED without an importer; the importer's errors;
  // INVALID_ARGUMENT for a size past the allocation's end; the limits as
  // for shared memory.
  absl::StatusOr<uint64_t> RegisterCudaIpc(const std::string& owner, absl::string_view handle,
                                           const std::string& device_uuid, int64_t bytes);
  // NOT_FOUND unless `owner` registered `id` and has not unregistered it.
  absl::Status Unregister(const std::string& owner, uint64_t id);
  std::vector<RegionSummary> List(const std::string& owner) const;

  // Bytes [offset, offset + bytes) of region `id` of `owner`; `what` names
  // the reference in errors (e.g. "AttendRequest.q"). INVALID_ARGUMENT for
  // a negative offset or size or one past the region's end, NOT_FOUND for
  // an unknown or foreign region.
  absl::StatusOr<RegionSlice> Resolve(const std::string& owner, uint64_t id, int64_t offset,
                                      int64_t bytes, const char* what) const;

  // `owner` held a stream or a session now.
  void Touch(const std::string& owner);
  // Unregisters the regions of owners idle past the grace period; their ids.
  std::vector<uint64_t> Expire();

 private:
  struct Region {
    std::string owner;
    std::string name;         // shared memory
    std::string device_uuid;  // CUDA IPC
    int64_t bytes = 0;
    // Unmapped (or closed) when the last slice goes.
    std::shared_ptr<const void> mapping;
    uint8_t* data = nullptr;
    bool device = false;
  };

  // RESOURCE_EXHAUSTED when `owner` may not register `bytes` more, naming
  // the region as `what`; with mutex_.
  absl::Status CheckLimits(const std::string& owner, const std::string& what, int64_t bytes) const;
  // Checks the limits again (another registration may have come in since
  // the first check) and adds `region`; its id.
  absl::StatusOr<uint64_t> Add(Region region);

  RegionRegistryOptions options_;
  mutable std::mutex mutex_;
  std::map<uint64_t, Region> regions_;
  std::map<std::string, absl::Time> last_seen_;  // owners with regions
  uint64_t next_id_ = 1;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_REGIONS_REGION_REGISTRY_H_
