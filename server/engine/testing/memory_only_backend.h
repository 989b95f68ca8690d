// A compute backend that has memory and nothing else, for the stage tests:
// Allocate gives zero-filled host memory and the copies are memcpy (its
// memory is the host's), but it runs no kernel: Prologue, Decode and
// BuildKeyLists fail with FAILED_PRECONDITION, so that a stage test that
// launched anything would fail. A KvBlockPool, which is made of backend
// memory, lives there (NewPool). Like every backend, not thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_MEMORY_ONLY_BACKEND_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_MEMORY_ONLY_BACKEND_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "server/engine/kv_pool.h"

namespace mla::engine_testing {

class MemoryOnlyBackend : public ComputeBackend {
 public:
  std::string Describe() const override { return "memory only (stage tests)"; }
  bool host_accessible() const override { return true; }
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override;
  absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  absl::Status BuildKeyLists(const KeyListBuildParams& params) override { return NoKernels(); }
  absl::Status Prologue(const PrologueParams& params) override { return NoKernels(); }
  absl::Status Decode(const DecodeParams& params) override { return NoKernels(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  static absl::Status NoKernels();
};

// A pool of `blocks` blocks in `backend`'s memory; the test binary ends if
// it cannot be made.
KvBlockPool NewPool(MemoryOnlyBackend& backend, int64_t blocks);

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_MEMORY_ONLY_BACKEND_H_
