#include "server/engine/host_buffer_pool.h"

#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"

namespace mla {
namespace {

// Counts the host buffers asked for; fails them when told to.
class CountingBackend : public CpuBackend {
 public:
  CountingBackend() : CpuBackend(1) {}
  int host_allocations = 0;
  bool fail_host = false;
  absl::StatusOr<DeviceBuffer> AllocateHost(int64_t bytes) override {
    if (fail_host) return absl::ResourceExhaustedError("no pinned memory left");
    ++host_allocations;
    return ComputeBackend::AllocateHost(bytes);
  }
};

constexpr int64_t kMiB = int64_t{1} << 20;

// A buffer that comes back (here from another thread, as gRPC's do) is lent
// again: the same memory, no new allocation.
TEST(HostBufferPoolTest, ABufferThatComesBackIsLentAgain) {
  CountingBackend backend;
  HostBufferPool pool(backend, 64 * kMiB);
  absl::StatusOr<std::shared_ptr<uint8_t>> first = pool.Take(kMiB + 5);
  ASSERT_TRUE(first.ok()) << first.status();
  std::memset(first->get(), 7, kMiB + 5);  // all of it is usable
  const uint8_t* memory = first->get();
  EXPECT_EQ(pool.pooled_bytes(), 2 * kMiB) << "sizes are powers of two";
  EXPECT_EQ(pool.idle_bytes(), 0);
  std::thread([buffer = *std::move(first)]() mutable { buffer.reset(); }).join();
  EXPECT_EQ(pool.idle_bytes(), 2 * kMiB);
  absl::StatusOr<std::shared_ptr<uint8_t>> again = pool.Take(2 * kMiB);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->get(), memory);
  EXPECT_EQ(backend.host_allocations, 1);
  EXPECT_EQ(pool.idle_bytes(), 0);
}

// Buffers lent at once are distinct; a buffer shared by several answers
// comes back only when the last one goes.
TEST(HostBufferPoolTest, BuffersLentTogetherAreDistinctAndSharedOnesComeBackLast) {
  CountingBackend backend;
  HostBufferPool pool(backend, 64 * kMiB);
  absl::StatusOr<std::shared_ptr<uint8_t>> a = pool.Take(100);
  absl::StatusOr<std::shared_ptr<uint8_t>> b = pool.Take(100);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->get(), b->get());
  std::shared_ptr<void> answer_one = *a;
  std::shared_ptr<void> answer_two = *a;
  a->reset();
  answer_one.reset();
  EXPECT_EQ(pool.idle_bytes(), 0) << "an answer still holds the buffer";
  answer_two.reset();
  EXPECT_EQ(pool.idle_bytes(), 64 * 1024);
}

// Past the limit the pool lends heap memory of its own, which it does not
// keep: the backend memory it holds stays at the limit.
TEST(HostBufferPoolTest, PastItsLimitThePoolLendsHeapMemory) {
  CountingBackend backend;
  HostBufferPool pool(backend, 4 * kMiB);
  std::vector<std::shared_ptr<uint8_t>> lent;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::shared_ptr<uint8_t>> buffer = pool.Take(2 * kMiB);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    std::memset(buffer->get(), i, 2 * kMiB);
    lent.push_back(*std::move(buffer));
  }
  EXPECT_EQ(backend.host_allocations, 2);
  EXPECT_EQ(pool.pooled_bytes(), 4 * kMiB);
  lent.clear();
  EXPECT_EQ(pool.pooled_bytes(), 4 * kMiB);
  EXPECT_EQ(pool.idle_bytes(), 4 * kMiB);
}

// A failed allocation is the backend's status, and claims nothing.
TEST(HostBufferPoolTest, AFailedAllocationClaimsNothing) {
  CountingBackend backend;
  HostBufferPool pool(backend, 64 * kMiB);
  backend.fail_host = true;
  absl::StatusOr<std::shared_ptr<uint8_t>> buffer = pool.Take(kMiB);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.pooled_bytes(), 0);
  EXPECT_FALSE(pool.Take(-1).ok());
}

// An answer may outlive the engine and its pool: its buffer stays usable
// and is freed when it goes.
TEST(HostBufferPoolTest, ABufferMayOutliveThePool) {
  CountingBackend backend;
  std::shared_ptr<uint8_t> kept;
  {
    HostBufferPool pool(backend, 64 * kMiB);
    absl::StatusOr<std::shared_ptr<uint8_t>> buffer = pool.Take(kMiB);
    ASSERT_TRUE(buffer.ok());
    kept = *std::move(buffer);
    absl::StatusOr<std::shared_ptr<uint8_t>> idle = pool.Take(kMiB);
    ASSERT_TRUE(idle.ok());
  }
  kept.get()[0] = 1;
  kept.reset();
}

}  // namespace
}  // namespace mla
