#include "server/engine/device_copies.h"

namespace mla {

void DeviceCopies::Add(size_t at, const uint8_t* src, int64_t bytes) {
  if (bytes <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  copies_.push_back({at, src, bytes});
}

absl::Status DeviceCopies::Queue(ComputeBackend& backend, uint8_t* device) const {
  // After the last Add (the caller's order): no lock needed to read.
  for (const Copy& copy : copies_) {
    if (absl::Status status = backend.CopyToDeviceQueued(device + copy.at, copy.src, copy.bytes);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace mla
