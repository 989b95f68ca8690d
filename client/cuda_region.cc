#include "client/cuda_region.h"

#include <cuda_runtime_api.h>

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/allocation_range.h"
#include "kernels/gpu_uuid.h"

namespace mla::client {
namespace {

absl::Status CudaFailure(cudaError_t error, absl::string_view what) {
  cudaGetLastError();  // not left for the caller's next launch
  return absl::InternalError(absl::StrCat("CudaRegion: ", what, ": ", cudaGetErrorName(error),
                                          " (", cudaGetErrorString(error), ")"));
}

// The offsets the server's kernels can use (proto: REGION_KIND_CUDA_IPC).
constexpr int64_t kAlignment = 16;

}  // namespace

absl::StatusOr<CudaExport> ExportCudaAllocation(const void* device_ptr) {
  cudaPointerAttributes attributes{};
  if (cudaError_t error = cudaPointerGetAttributes(&attributes, device_ptr);
      error != cudaSuccess) {
    return CudaFailure(error, "cudaPointerGetAttributes");
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError(
        "CudaRegion: the pointer is not device memory of this process; give memory cudaMalloc "
        "returned");
  }
  // The handle exports the whole allocation, which the server maps from its
  // start: a pointer inside it would put the server's offsets elsewhere.
  absl::StatusOr<cuda::AllocationRange> range = cuda::AllocationOf(device_ptr);
  if (!range.ok()) return range.status();
  if (range->base != device_ptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaRegion: the pointer is ",
        static_cast<const uint8_t*>(device_ptr) - static_cast<const uint8_t*>(range->base),
        " bytes into its allocation; give the start of the allocation cudaMalloc returned "
        "(and offsets into it in the references)"));
  }
  cudaDeviceProp prop;
  if (cudaError_t error = cudaGetDeviceProperties(&prop, attributes.device);
      error != cudaSuccess) {
    return CudaFailure(error, "cudaGetDeviceProperties");
  }
  cudaIpcMemHandle_t handle{};
  if (cudaError_t error = cudaIpcGetMemHandle(&handle, const_cast<void*>(device_ptr));
      error != cudaSuccess) {
    return CudaFailure(error, "cudaIpcGetMemHandle");
  }
  std::array<uint8_t, kGpuUuidBytes> uuid;
  std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
  return CudaExport{std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)),
                    FormatGpuUuid(uuid)};
}

absl::StatusOr<std::unique_ptr<CudaRegion>> CudaRegion::Create(Client& client, int device,
                                                               int64_t bytes,
                                                               const CallOptions& call) {
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaRegion: ", bytes, " bytes; give the size of the region, at least 1"));
  }
  if (cudaError_t error = cudaSetDevice(device); error != cudaSuccess) {
    return CudaFailure(error, absl::StrCat("cudaSetDevice(", device, ")"));
  }
  void* data = nullptr;
  if (cudaError_t error = cudaMalloc(&data, static_cast<size_t>(bytes)); error != cudaSuccess) {
    return CudaFailure(error, absl::StrCat("cudaMalloc of ", bytes, " bytes"));
  }
  // From here the destructor frees it (and unregisters only an id).
  std::unique_ptr<CudaRegion> region(
      new CudaRegion(client, static_cast<uint8_t*>(data), bytes, device, true));
  if (cudaError_t error = cudaMemset(data, 0, static_cast<size_t>(bytes)); error != cudaSuccess) {
    return CudaFailure(error, "cudaMemset");
  }
  if (absl::Status status = region->Share(call); !status.ok()) return status;
  return region;
}

absl::StatusOr<std::unique_ptr<CudaRegion>> CudaRegion::Register(Client& client, void* device_ptr,
                                                                 int64_t bytes,
                                                                 const CallOptions& call) {
  if (bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaRegion: ", bytes, " bytes; give the size of the region, at least 1"));
  }
  absl::StatusOr<cuda::AllocationRange> range = cuda::AllocationOf(device_ptr);
  if (!range.ok()) return range.status();
  if (bytes > range->bytes) {
    return absl::InvalidArgumentError(absl::StrCat("CudaRegion: ", bytes,
                                                   " bytes are more than the allocation's ",
                                                   range->bytes));
  }
  std::unique_ptr<CudaRegion> region(
      new CudaRegion(client, static_cast<uint8_t*>(device_ptr), bytes, -1, false));
  if (absl::Status status = region->Share(call); !status.ok()) return status;
  return region;
}

absl::Status CudaRegion::Share(const CallOptions& call) {
  absl::StatusOr<CudaExport> exported = ExportCudaAllocation(data_);
  if (!exported.ok()) return exported.status();
  device_uuid_ = exported->device_uuid;
  absl::StatusOr<uint64_t> id =
      client_.RegisterCudaRegion(exported->handle, exported->device_uuid, bytes_, call);
  if (!id.ok()) return id.status();
  id_ = *id;
  return absl::OkStatus();
}

CudaRegion::CudaRegion(Client& client, uint8_t* data, int64_t bytes, int device, bool owned)
    : client_(client), data_(data), bytes_(bytes), device_(device), owned_(owned) {}

CudaRegion::~CudaRegion() {
  // Unregistered first: the server closes its mapping before the memory goes.
  if (id_ != 0) client_.UnregisterRegion(id_).IgnoreError();
  if (owned_ && cudaSetDevice(device_) == cudaSuccess) cudaFree(data_);
  cudaGetLastError();
}

absl::StatusOr<RegionRef> CudaRegion::Ref(int64_t offset, int64_t bytes) const {
  if (offset % kAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaRegion ", id_, ": offset ", offset, " is not a multiple of ", kAlignment,
        "; the server's kernels read and write CUDA IPC regions in 16-byte pieces"));
  }
  return RegionRef::Within(id_, bytes_, offset, bytes, absl::StrCat("CudaRegion ", id_));
}

}  // namespace mla::client
