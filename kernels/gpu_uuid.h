// A GPU's UUID as nvidia-smi -L prints it, "GPU-" then 36 characters
// (8-4-4-4-12 lower-case hex digits of its 16 bytes in order): how the wire
// names the GPU a CUDA IPC region lies on (RegisterRegionRequest.device_uuid)
// and how the CUDA backend finds it among the host's GPUs. Pure functions;
// thread-safe.
#ifndef MLA_OFFLOAD_KERNELS_GPU_UUID_H_
#define MLA_OFFLOAD_KERNELS_GPU_UUID_H_

#include <array>
#include <cstdint>
#include <string>

namespace mla {

inline constexpr int kGpuUuidBytes = 16;

std::string FormatGpuUuid(const std::array<uint8_t, kGpuUuidBytes>& bytes);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_GPU_UUID_H_
