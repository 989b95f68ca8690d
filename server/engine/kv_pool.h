// The paged KV cache of one device: a fixed array of MODEL1 blocks (64 tokens,
// 37440 bytes each) in the backend's memory, and the free list over them.
//
// Every pool of the server (SWA rings and compressed pages of every session
// and layer) draws blocks from this one array, so one global slot space
// (block * 64 + offset) addresses every cached row and one kernel launch can
// read rows of any session and layer. Allocation is all-or-nothing:
// RESOURCE_EXHAUSTED leaves the pool as it was. Not thread-safe: the engine
// thread of the device owns it.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_KV_POOL_H_
#define MLA_OFFLOAD_SERVER_ENGINE_KV_POOL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cache_format.h"

namespace mla {

class KvBlockPool {
 public:
  // Takes `num_blocks` blocks of backend memory (zero-filled).
  static absl::StatusOr<KvBlockPool> Create(ComputeBackend& backend, int64_t num_blocks);

  KvBlockPool(KvBlockPool&&) = default;
  KvBlockPool& operator=(KvBlockPool&&) = default;

  // Takes `count` free blocks, or none (RESOURCE_EXHAUSTED naming how many
  // were asked for and how many are free).
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t count);
  // Returns blocks taken by Allocate.
  void Free(const std::vector<int32_t>& blocks);

  int64_t total_blocks() const { return view_.num_blocks; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return total_blocks() - free_blocks(); }
  CachePoolView view() const { return view_; }

 private:
  KvBlockPool(DeviceBuffer memory, int64_t num_blocks);

  DeviceBuffer memory_;
  CachePoolView view_;
  std::vector<int32_t> free_;  // a stack: recently freed blocks are reused first
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_KV_POOL_H_
