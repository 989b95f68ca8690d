#include "server/engine/kv_pool.h"

#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"

namespace mla {

absl::StatusOr<KvBlockPool> KvBlockPool::Create(ComputeBackend& backend, int64_t num_blocks) {
  if (num_blocks <= 0 || num_blocks * kBlockTokens > int64_t{1} << 31) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV pool needs between 1 and ", (int64_t{1} << 31) / kBlockTokens,
        " blocks (slots must fit int32); asked for ", num_blocks));
  }
  absl::StatusOr<DeviceBuffer> memory = backend.Allocate(num_blocks * kBlockBytes);
  if (!memory.ok()) return memory.status();
  return KvBlockPool(*std::move(memory), num_blocks);
}

KvBlockPool::KvBlockPool(DeviceBuffer memory, int64_t num_blocks)
    : memory_(std::move(memory)), view_{memory_.as<uint8_t>(), num_blocks}, free_(num_blocks) {
  // Highest ids at the bottom of the stack: a fresh pool hands out 0, 1, 2...
  std::iota(free_.rbegin(), free_.rend(), 0);
}

absl::StatusOr<std::vector<int32_t>> KvBlockPool::Allocate(int64_t count) {
  if (count < 0) {
    return absl::InternalError(absl::StrCat("KV pool: asked for ", count, " blocks"));
  }
  if (count > free_blocks()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache full: ", count, " blocks of ", kBlockTokens, " tokens needed, ", free_blocks(),
        " of ", total_blocks(), " free; close sessions or start the server with a larger "
        "--kv_cache_gb"));
  }
  std::vector<int32_t> blocks(free_.end() - count, free_.end());
  free_.resize(free_.size() - count);
  return blocks;
}

void KvBlockPool::Free(const std::vector<int32_t>& blocks) {
  free_.insert(free_.end(), blocks.begin(), blocks.end());
}

}  // namespace mla
