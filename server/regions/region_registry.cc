#include "server/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/engine/requests.h"
#include "server/process/log.h"

namespace mla {
namespace {

absl::Status CheckName(const std::string& name) {
  if (name.size() < 2 || name.size() > 255 || name[0] != '/' ||
      name.find('/', 1) != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region name ", EchoClientText(name),
        ": give a POSIX shared-memory name, \"/\" then 1 to 254 characters without \"/\""));
  }
  return absl::OkStatus();
}

// How errors name a region: its shared-memory name, or the GPU of CUDA IPC
// memory.
std::string Label(const std::string& name, bool device = false) {
  return device ? absl::StrCat("CUDA IPC region on ", EchoClientText(name))
                : absl::StrCat("region ", EchoClientText(name));
}

}  // namespace

RegionRegistry::RegionRegistry(const RegionRegistryOptions& options) : options_(options) {}

RegionRegistry::~RegionRegistry() = default;

absl::StatusOr<uint64_t> RegionRegistry::RegisterSharedMemory(const std::string& owner,
                                                              const std::string& name,
                                                              int64_t bytes) {
  if (absl::Status status = CheckName(name); !status.ok()) return status;
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("region ", EchoClientText(name), ": byte_size is ", bytes,
                     "; give the size of the part to share, at least 1"));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (absl::Status status = CheckLimits(owner, Label(name), bytes); !status.ok()) {
      return status;
    }
  }
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int error = errno;
    const std::string what = absl::StrCat("region ", EchoClientText(name), ": shm_open: ",
                                          std::strerror(error));
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(what, "; create it (shm_open) before registering"));
    }
    if (error == EACCES) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, "; the server's user must be able to read and write it"));
    }
    return absl::InvalidArgumentError(what);
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || info.st_size < bytes) {
    const int64_t size = info.st_size;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("region ", EchoClientText(name), ": it holds ",
                                                   size, " bytes, fewer than byte_size ", bytes));
  }
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (data == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("region ", EchoClientText(name),
                                                     ": mmap of ", bytes,
                                                     " bytes: ", std::strerror(errno)));
  }
  const size_t length = static_cast<size_t>(bytes);
  std::shared_ptr<HostPinner> pinner = options_.pinner;
  if (pinner != nullptr) {
    if (absl::Status pinned = pinner->Pin(data, bytes); !pinned.ok()) {
      Log(LogLevel::kWarning, absl::StrCat("region ", EchoClientText(name),
                                           " is used unpinned (copies are slower): ",
                                           pinned.message()));
      pinner = nullptr;
    }
  }
  // Unpinned before it is unmapped, on whichever thread lets go last.
  std::shared_ptr<const void> mapping(data, [length, pinner](const void* p) {
    if (pinner != nullptr) pinner->Unpin(const_cast<void*>(p));
    munmap(const_cast<void*>(p), length);
  });
  return Add(Region{owner, name, "", bytes, std::move(mapping), static_cast<uint8_t*>(data),
                    false});
}

absl::StatusOr<uint64_t> RegionRegistry::RegisterCudaIpc(const std::string& owner,
                                                         absl::string_view handle,
                                                         const std::string& device_uuid,
                                                         int64_t bytes) {
  if (options_.importer == nullptr) {
    return absl::UnimplementedError(
        "REGION_KIND_CUDA_IPC: this server's compute backend has no device memory (it runs "
        "on the CPU); register host memory (REGION_KIND_SYSTEM_SHM) instead");
  }
  if (bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC region: byte_size is ", bytes, "; give the size of the part to share, at least 1"));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (absl::Status status = CheckLimits(owner, Label(device_uuid, true), bytes); !status.ok()) {
      return status;
    }
  }
  absl::StatusOr<ImportedMemory> memory = options_.importer->Import(handle, device_uuid);
  if (!memory.ok()) return memory.status();
  if (bytes > memory->bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC region: byte_size ", bytes, " is more than the ", memory->bytes,
        " bytes of the allocation the handle exports; give at most that"));
  }
  return Add(
      Region{owner, "", device_uuid, bytes, std::move(memory->mapping), memory->data, true});
}

absl::StatusOr<uint64_t> RegionRegistry::Add(Region region) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The mapping goes with `region` when the limits refuse it now.
  const std::string what =
      region.device ? Label(region.device_uuid, true) : Label(region.name);
  if (absl::Status status = CheckLimits(region.owner, what, region.bytes); !status.ok()) {
    return status;
  }
  const uint64_t id = next_id_++;
  last_seen_[region.owner] = options_.clock();
  regions_[id] = std::move(region);
  return id;
}

absl::Status RegionRegistry::CheckLimits(const std::string& owner, const std::string& what,
                                         int64_t bytes) const {
  int count = 0;
  int64_t held = 0;
  for (const auto& [id, region] : regions_) {
    if (region.owner != owner) continue;
    ++count;
    held += region.bytes;
  }
  if (count >= options_.max_regions_per_owner) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client holds ", count, " regions, the most it may; unregister some first"));
  }
  if (bytes > options_.max_bytes_per_owner - held) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", bytes, " bytes are more than the ",
        options_.max_bytes_per_owner - held, " this client may still register (",
        options_.max_bytes_per_owner, " in all)"));
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::Unregister(const std::string& owner, uint64_t id) {
  // Let go of after the lock: unpinning and unmapping a large region takes
  // time that Resolve on other threads should not wait for.
  std::shared_ptr<const void> mapping;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.owner != owner) {
    return absl::NotFoundError(absl::StrCat("region ", id, " is not registered by this client"));
  }
  mapping = std::move(it->second.mapping);
  regions_.erase(it);
  return absl::OkStatus();
}

std::vector<RegionSummary> RegionRegistry::List(const std::string& owner) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RegionSummary> list;
  for (const auto& [id, region] : regions_) {
    if (region.owner == owner) {
      list.push_back({id, region.device, region.name, region.device_uuid, region.bytes});
    }
  }
  return list;
}

absl::StatusOr<RegionSlice> RegionRegistry::Resolve(const std::string& owner, uint64_t id,
                                                    int64_t offset, int64_t bytes,
                                                    const char* what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = regions_.find(id);
  if (it == regions_.end() || it->second.owner != owner) {
    return absl::NotFoundError(
        absl::StrCat(what, ": region ", id, " is not registered by this client"));
  }
  const Region& region = it->second;
  // offset + bytes <= region.bytes, with both non-negative: no sum formed.
  if (offset < 0 || bytes < 0 || offset > region.bytes || bytes > region.bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": bytes [", offset, ", ", offset, " + ", bytes, ") of region ", id,
        " do not lie within its ", region.bytes, " bytes"));
  }
  return RegionSlice{region.mapping, region.data + offset, bytes, region.device};
}

void RegionRegistry::Touch(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = last_seen_.find(owner);
  if (it != last_seen_.end()) it->second = options_.clock();
}

std::vector<uint64_t> RegionRegistry::Expire() {
  std::vector<std::shared_ptr<const void>> released;  // let go of after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  const absl::Time now = options_.clock();
  std::vector<uint64_t> expired;
  for (auto it = regions_.begin(); it != regions_.end();) {
    const auto seen = last_seen_.find(it->second.owner);
    if (seen != last_seen_.end() && now - seen->second > options_.grace) {
      expired.push_back(it->first);
      released.push_back(std::move(it->second.mapping));
      it = regions_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = last_seen_.begin(); it != last_seen_.end();) {
    bool holds = false;
    for (const auto& [id, region] : regions_) holds |= region.owner == it->first;
    it = holds ? std::next(it) : last_seen_.erase(it);
  }
  return expired;
}

}  // namespace mla
