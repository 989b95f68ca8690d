#include "server/process/host_memory.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace mla {
namespace {

// Number of chunks glibc currently holds as separate mmaps.
size_t MappedChunks() { return mallinfo2().hblks; }

// 48 MiB: above the largest mmap threshold glibc picks by itself (32 MiB), so
// without the settings the block is always its own mmap, unmapped on free.
constexpr size_t kBytes = size_t{48} << 20;

TEST(HostMemoryTest, LargeBuffersComeFromTheHeapAndStayAfterFree) {
  void* before = std::malloc(kBytes);
  ASSERT_NE(before, nullptr);
  const size_t mapped_default = MappedChunks();
  std::free(before);
  ASSERT_EQ(MappedChunks(), mapped_default - 1) << "glibc's default did not mmap a 48 MiB block";

  ASSERT_TRUE(KeepFreedHostMemory());
  const size_t mapped = MappedChunks();
  void* block = std::malloc(kBytes);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  EXPECT_EQ(MappedChunks(), mapped) << "a 48 MiB block still got its own mmap";
  std::free(block);
  // Freed, it stays in the heap (not trimmed back to the kernel).
  EXPECT_GE(mallinfo2().fordblks, kBytes);
}

}  // namespace
}  // namespace mla
