#include "server/engine/host_buffer_pool.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace mla {
namespace {

constexpr int64_t kSmallestBuffer = int64_t{64} << 10;

// The power of two (at least kSmallestBuffer) that holds `bytes`.
int64_t SizeFor(int64_t bytes) {
  int64_t size = kSmallestBuffer;
  while (size < bytes) size *= 2;
  return size;
}

}  // namespace

struct HostBufferPool::State {
  mutable absl::Mutex mu;
  bool closed ABSL_GUARDED_BY(mu) = false;  // the pool is gone: free what comes back
  int64_t pooled_bytes ABSL_GUARDED_BY(mu) = 0;
  int64_t idle_bytes ABSL_GUARDED_BY(mu) = 0;
  std::map<int64_t, std::vector<DeviceBuffer>> idle ABSL_GUARDED_BY(mu);  // by size
  absl::flat_hash_map<const void*, DeviceBuffer> lent ABSL_GUARDED_BY(mu);

  // A lent buffer came back: idle again, or freed once the pool is gone.
  void GiveBack(const void* data) {
    DeviceBuffer buffer;  // freed after the lock, if it is not kept
    absl::MutexLock lock(&mu);
    auto it = lent.find(data);
    buffer = std::move(it->second);
    lent.erase(it);
    if (closed) {
      pooled_bytes -= buffer.bytes();
      return;
    }
    idle_bytes += buffer.bytes();
    idle[buffer.bytes()].push_back(std::move(buffer));
  }
};

HostBufferPool::HostBufferPool(ComputeBackend& backend, int64_t max_pooled_bytes)
    : backend_(backend), max_pooled_bytes_(max_pooled_bytes), state_(std::make_shared<State>()) {}

HostBufferPool::~HostBufferPool() {
  std::map<int64_t, std::vector<DeviceBuffer>> idle;  // freed after the lock
  absl::MutexLock lock(&state_->mu);
  state_->closed = true;
  idle.swap(state_->idle);
  state_->pooled_bytes -= state_->idle_bytes;
  state_->idle_bytes = 0;
}

absl::StatusOr<std::shared_ptr<uint8_t>> HostBufferPool::Take(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot take a negative size");
  const int64_t size = SizeFor(bytes);
  DeviceBuffer buffer;
  bool pooled = false;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->idle.find(size);
    if (it != state_->idle.end() && !it->second.empty()) {
      buffer = std::move(it->second.back());
      it->second.pop_back();
      state_->idle_bytes -= size;
      pooled = true;
    } else if (state_->pooled_bytes + size <= max_pooled_bytes_) {
      state_->pooled_bytes += size;  // claimed before the allocation, given back if it fails
      pooled = true;
    }
  }
  if (pooled && buffer.data() == nullptr) {
    absl::StatusOr<DeviceBuffer> allocated = backend_.AllocateHost(size);
    if (!allocated.ok()) {
      absl::MutexLock lock(&state_->mu);
      state_->pooled_bytes -= size;
      return allocated.status();
    }
    buffer = *std::move(allocated);
  }
  if (!pooled) {
    return std::shared_ptr<uint8_t>(new uint8_t[size], std::default_delete<uint8_t[]>());
  }
  uint8_t* data = buffer.as<uint8_t>();
  {
    absl::MutexLock lock(&state_->mu);
    state_->lent.emplace(data, std::move(buffer));
  }
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<uint8_t>(data, [state](uint8_t* lent) { state->GiveBack(lent); });
}

int64_t HostBufferPool::pooled_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->pooled_bytes;
}

int64_t HostBufferPool::idle_bytes() const {
  absl::MutexLock lock(&state_->mu);
  return state_->idle_bytes;
}

}  // namespace mla
