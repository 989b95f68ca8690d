// For tests of the same-host data plane: SharedMemory, a POSIX
// shared-memory object made as a client makes one (shm_open, ftruncate,
// mmap), filled with a pattern, and unmapped and unlinked when it goes (the
// server's mapping outlives the name); and the options of a region
// registry whose clock the test moves. Not for production code.
#ifndef MLA_OFFLOAD_SERVER_REGIONS_TESTING_REGIONS_H_
#define MLA_OFFLOAD_SERVER_REGIONS_TESTING_REGIONS_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/regions/region_registry.h"

namespace mla {

class SharedMemory {
 public:
  explicit SharedMemory(int64_t bytes)
      : name_(absl::StrCat("/mla-region-test-", getpid(), "-", counter_++)) {
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << name_;
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    EXPECT_NE(data, MAP_FAILED);
    data_ = static_cast<uint8_t*>(data);
    bytes_ = bytes;
    for (int64_t i = 0; i < bytes; ++i) data_[i] = static_cast<uint8_t>(i * 7 + 1);
  }
  ~SharedMemory() {
    munmap(data_, bytes_);
    shm_unlink(name_.c_str());
  }
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  static inline std::atomic<int> counter_{0};
  std::string name_;
  uint8_t* data_ = nullptr;
  int64_t bytes_ = 0;
};

// The time of a registry's clock, which the test moves.
struct TestClock {
  absl::Time now = absl::UnixEpoch();
};

// A grace period of 30 s on `clock`, which must outlive the registry.
inline RegionRegistryOptions GraceOnClock(TestClock& clock) {
  RegionRegistryOptions options;
  options.grace = absl::Seconds(30);
  options.clock = [&clock] { return clock.now; };
  return options;
}

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_REGIONS_TESTING_REGIONS_H_
