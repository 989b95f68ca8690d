#include "server/engine/testing/memory_only_backend.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace mla::engine_testing {

absl::StatusOr<DeviceBuffer> MemoryOnlyBackend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
  return DeviceBuffer(new uint8_t[std::max<int64_t>(bytes, 1)](), bytes,
                      [](void* data) { delete[] static_cast<uint8_t*>(data); });
}

absl::Status MemoryOnlyBackend::CopyToDevice(void* device_dst, const void* host_src,
                                             int64_t bytes) {
  std::memcpy(device_dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status MemoryOnlyBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  std::memcpy(host_dst, device_src, bytes);
  return absl::OkStatus();
}

absl::Status MemoryOnlyBackend::NoKernels() {
  return absl::FailedPreconditionError("a memory-only backend runs no kernel");
}

KvBlockPool NewPool(MemoryOnlyBackend& backend, int64_t blocks) {
  absl::StatusOr<KvBlockPool> pool = KvBlockPool::Create(backend, blocks);
  return *std::move(pool);
}

}  // namespace mla::engine_testing
