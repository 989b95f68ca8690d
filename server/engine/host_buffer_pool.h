// Host memory for the answers of launches: buffers from the backend's
// AllocateHost (page-locked on a GPU, so that the read back goes by DMA
// into the memory the response is then serialised from, with no copy in
// between), lent out and taken back for the next launch.
//
// Take() lends a buffer of at least the bytes asked for as a shared_ptr;
// when its last copy goes (on any thread: gRPC's, once the answer is
// written), the buffer comes back to the pool. Buffers come in sizes of a
// power of two (64 KiB at least), so that one serves many launches. The
// pool holds at most `max_pooled_bytes` of backend memory, lent and idle
// together; past that, Take() gives plain heap memory, freed when its last
// copy goes, so that a server whose clients are slow to read does not lock
// ever more of the host's memory. A buffer may outlive the pool (it is then
// freed when it comes back); the backend must outlive the pool but not the
// buffers (backend host memory is freed without the backend).
//
// Take() from one thread at a time (the engine's); buffers come back from
// any thread.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_HOST_BUFFER_POOL_H_
#define MLA_OFFLOAD_SERVER_ENGINE_HOST_BUFFER_POOL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace mla {

class HostBufferPool {
 public:
  HostBufferPool(ComputeBackend& backend, int64_t max_pooled_bytes);
  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // At least `bytes` of host memory, contents undefined.
  absl::StatusOr<std::shared_ptr<uint8_t>> Take(int64_t bytes);

  // Backend memory the pool holds (lent and idle) and of it what is idle.
  int64_t pooled_bytes() const;
  int64_t idle_bytes() const;

 private:
  struct State;

  ComputeBackend& backend_;
  const int64_t max_pooled_bytes_;
  std::shared_ptr<State> state_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_HOST_BUFFER_POOL_H_
