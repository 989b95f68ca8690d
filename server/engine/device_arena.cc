#include "server/engine/device_arena.h"

#include <algorithm>
#include <utility>

namespace mla {

absl::StatusOr<uint8_t*> DeviceArena::Reserve(Slot slot, int64_t bytes) {
  DeviceBuffer& buffer = buffers_[slot];
  if (!Fits(slot, bytes)) {
    const int64_t size = std::max<int64_t>(bytes, buffer.bytes() * 2);
    absl::StatusOr<DeviceBuffer> bigger =
        IsStaging(slot) ? backend_.AllocateHost(size) : backend_.Allocate(size);
    if (!bigger.ok()) return bigger.status();
    buffer = *std::move(bigger);
  }
  return buffer.as<uint8_t>();
}

}  // namespace mla
