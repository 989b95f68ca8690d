// Bytes that a launch sends from device memory (a client's CUDA IPC region)
// into the device's copy of its staging (server/engine/packed_arrays.h): the host
// cannot copy them into the staging, so they are noted while it is filled
// and copied on the device after the staging's own upload, which they
// overwrite. Add() may be called from several threads at once; Queue() from
// one, after the last Add().
#ifndef MLA_OFFLOAD_SERVER_ENGINE_DEVICE_COPIES_H_
#define MLA_OFFLOAD_SERVER_ENGINE_DEVICE_COPIES_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace mla {

class DeviceCopies {
 public:
  // `bytes` at `src` (device memory) go to `at` bytes into the staging.
  void Add(size_t at, const uint8_t* src, int64_t bytes);
  // Enqueues the copies on `backend`'s copy queue into `device`, the
  // device's copy of the staging; the first failure.
  absl::Status Queue(ComputeBackend& backend, uint8_t* device) const;

 private:
  struct Copy {
    size_t at;
    const uint8_t* src;
    int64_t bytes;
  };
  std::mutex mutex_;
  std::vector<Copy> copies_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_DEVICE_COPIES_H_
