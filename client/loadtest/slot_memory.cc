#include "client/loadtest/slot_memory.h"

#include <cstring>
#include <utility>

#include "client/host_region.h"
#ifdef MLA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "client/cuda_region.h"
#endif

namespace mla::loadtest {
namespace {

class HostSlots : public SlotMemory {
 public:
  explicit HostSlots(std::unique_ptr<client::HostRegion> region) : region_(std::move(region)) {}
  absl::StatusOr<client::RegionRef> Ref(int64_t offset, int64_t bytes) const override {
    return region_->Ref(offset, bytes);
  }
  absl::Status Write(int64_t at, const void* src, int64_t bytes) override {
    std::memcpy(region_->data() + at, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Read(int64_t at, void* dst, int64_t bytes) const override {
    std::memcpy(dst, region_->data() + at, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<client::HostRegion> region_;
};

#ifdef MLA_HAVE_CUDA
absl::Status Copied(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrCat("--data_plane=cuda_ipc: ", what, ": ",
                                          cudaGetErrorString(error)));
}

class CudaSlots : public SlotMemory {
 public:
  CudaSlots(std::unique_ptr<client::CudaRegion> region, int device)
      : region_(std::move(region)), device_(device) {}
  absl::StatusOr<client::RegionRef> Ref(int64_t offset, int64_t bytes) const override {
    return region_->Ref(offset, bytes);
  }
  absl::Status Write(int64_t at, const void* src, int64_t bytes) override {
    if (absl::Status status = Copied(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) {
      return status;
    }
    return Copied(cudaMemcpy(region_->data() + at, src, static_cast<size_t>(bytes),
                             cudaMemcpyHostToDevice),
                  "writing a slot");
  }
  absl::Status Read(int64_t at, void* dst, int64_t bytes) const override {
    if (absl::Status status = Copied(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) {
      return status;
    }
    return Copied(cudaMemcpy(dst, region_->data() + at, static_cast<size_t>(bytes),
                             cudaMemcpyDeviceToHost),
                  "reading a slot");
  }

 private:
  std::unique_ptr<client::CudaRegion> region_;
  const int device_;
};
#endif

}  // namespace

absl::StatusOr<std::unique_ptr<SlotMemory>> MakeHostSlots(client::Client& client, int64_t bytes) {
  absl::StatusOr<std::unique_ptr<client::HostRegion>> region =
      client::HostRegion::Create(client, bytes);
  if (!region.ok()) return region.status();
  return std::make_unique<HostSlots>(*std::move(region));
}

absl::StatusOr<std::unique_ptr<SlotMemory>> MakeCudaSlots(client::Client& client, int device,
                                                          int64_t bytes) {
#ifdef MLA_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<client::CudaRegion>> region =
      client::CudaRegion::Create(client, device, bytes);
  if (!region.ok()) return region.status();
  return std::make_unique<CudaSlots>(*std::move(region), device);
#else
  return absl::UnimplementedError(
      "--data_plane=cuda_ipc: this build has no CUDA toolkit (nvcc was not found when it was "
      "built); build on a machine with /usr/local/cuda");
#endif
}

}  // namespace mla::loadtest
