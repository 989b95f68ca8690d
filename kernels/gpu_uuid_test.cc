#include "kernels/gpu_uuid.h"

#include "gtest/gtest.h"

namespace mla {
namespace {

// nvidia-smi -L's spelling: lower-case hex, the bytes in order, grouped
// 8-4-4-4-12.
TEST(GpuUuidTest, SpellsTheBytesAsNvidiaSmiDoes) {
  std::array<uint8_t, kGpuUuidBytes> bytes;
  for (int i = 0; i < kGpuUuidBytes; ++i) bytes[i] = static_cast<uint8_t>(0x10 * i + 0x0a - i);
  EXPECT_EQ(FormatGpuUuid(bytes), "GPU-0a192837-4655-6473-8291-a0afbecddceb");
}

}  // namespace
}  // namespace mla
