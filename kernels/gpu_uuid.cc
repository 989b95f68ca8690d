#include "kernels/gpu_uuid.h"

namespace mla {

std::string FormatGpuUuid(const std::array<uint8_t, kGpuUuidBytes>& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text = "GPU-";
  for (int i = 0; i < kGpuUuidBytes; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += kHex[bytes[i] >> 4];
    text += kHex[bytes[i] & 15];
  }
  return text;
}

}  // namespace mla
