#include "client/host_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace mla::client {

absl::StatusOr<std::unique_ptr<HostRegion>> HostRegion::Create(Client& client, int64_t bytes,
                                                               const CallOptions& call) {
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HostRegion: ", bytes, " bytes; give the size of the region, at least 1"));
  }
  std::random_device random;
  const std::string name = absl::StrCat("/mla-", getpid(), "-", absl::Hex(random()),
                                        absl::Hex(random(), absl::kZeroPad8));
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("HostRegion: shm_open(", name, "): ", std::strerror(errno)));
  }
  void* data = MAP_FAILED;
  if (ftruncate(fd, bytes) == 0) {
    data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int error = errno;
  close(fd);
  if (data == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::InternalError(absl::StrCat("HostRegion: ", bytes, " bytes of ", name, ": ",
                                            std::strerror(error)));
  }
  // From here the destructor undoes it all (it unregisters only an id).
  std::unique_ptr<HostRegion> region(
      new HostRegion(client, name, static_cast<uint8_t*>(data), bytes));
  absl::StatusOr<uint64_t> id = client.RegisterRegion(name, bytes, call);
  if (!id.ok()) return id.status();
  region->id_ = *id;
  return region;
}

HostRegion::HostRegion(Client& client, std::string name, uint8_t* data, int64_t bytes)
    : client_(client), name_(std::move(name)), data_(data), bytes_(bytes) {}

HostRegion::~HostRegion() {
  if (id_ != 0) client_.UnregisterRegion(id_).IgnoreError();
  munmap(data_, static_cast<size_t>(bytes_));
  shm_unlink(name_.c_str());
}

absl::StatusOr<RegionRef> HostRegion::Ref(int64_t offset, int64_t bytes) const {
  return RegionRef::Within(id_, bytes_, offset, bytes, absl::StrCat("HostRegion ", name_));
}

}  // namespace mla::client
