// The memory of a load-test node's region on one server
// (--data_plane=shm|cuda_ipc), in which each layer step in flight has a
// slot: the step's q, kv and compressed rows are written there and named by
// reference, and the server writes the answer there.
//
// MakeHostSlots makes a shared-memory region (client::HostRegion);
// MakeCudaSlots device memory on a GPU of this host (client::CudaRegion),
// which needs a build with the CUDA toolkit (UNIMPLEMENTED otherwise) and a
// server with --backend=cuda. Both register with `client`'s server, which
// must outlive the slots. Writes and reads copy between host memory and the
// region (for device memory: cudaMemcpy). One thread at a time per slot.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_SLOT_MEMORY_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_SLOT_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/mla_client.h"

namespace mla::loadtest {

class SlotMemory {
 public:
  virtual ~SlotMemory() = default;
  // Bytes [offset, offset + bytes) of the region, for a message.
  virtual absl::StatusOr<client::RegionRef> Ref(int64_t offset, int64_t bytes) const = 0;
  virtual absl::Status Write(int64_t at, const void* src, int64_t bytes) = 0;
  virtual absl::Status Read(int64_t at, void* dst, int64_t bytes) const = 0;
};

absl::StatusOr<std::unique_ptr<SlotMemory>> MakeHostSlots(client::Client& client, int64_t bytes);
absl::StatusOr<std::unique_ptr<SlotMemory>> MakeCudaSlots(client::Client& client, int device,
                                                          int64_t bytes);

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_SLOT_MEMORY_H_
