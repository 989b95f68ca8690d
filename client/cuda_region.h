// A CUDA IPC region for the same-host data plane: device memory of this
// process that the server on the same host opens once (cudaIpcOpenMemHandle),
// so that its kernels read q and kv from it and write out and lse into it
// directly, and no tensor byte travels through gRPC or host memory. The
// memory may lie on the server's GPU or on a peer GPU of the host that the
// server's GPU reaches (NVLink or PCIe peer access).
//
// CudaRegion::Create allocates `bytes` on GPU `device` (cudaMalloc), exports
// it and registers it with the client's server; CudaRegion::Register
// registers an allocation the caller made (the start of a cudaMalloc
// allocation, kept until the region is gone). The destructor unregisters
// the region (a failure, e.g. a server that has gone, is ignored) and frees
// what Create allocated. The Client must outlive the region.
//
// Name tensors with Ref(offset, bytes) in AttendInput's *_region fields;
// offsets must be multiples of 16 (the server's kernels read and write in
// 16-byte pieces). The server reads a message's bytes while its step runs
// and writes its answer before AttendStream::Receive returns it: make the
// device work that fills the inputs finish before Send (synchronise the
// stream that wrote them), and read the answer after Receive. CUDA IPC
// needs two processes: a server in the same process cannot open the handle.
//
// Built only where the CUDA toolkit is (Bazel's @local_cuda); elsewhere the
// library is absent. Thread-safe after Create (the object is immutable).
#ifndef MLA_OFFLOAD_CLIENT_CUDA_REGION_H_
#define MLA_OFFLOAD_CLIENT_CUDA_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/mla_client.h"

namespace mla::client {

// What RegisterRegion needs of a device allocation: its cudaIpcMemHandle_t's
// bytes and the UUID of its GPU as nvidia-smi -L prints it.
struct CudaExport {
  std::string handle;
  std::string device_uuid;
};

// Exports the allocation that starts at `device_ptr`. INVALID_ARGUMENT for
// a pointer that is not device memory of this process or not the start of
// its allocation; INTERNAL for a CUDA failure (no driver, no GPU).
absl::StatusOr<CudaExport> ExportCudaAllocation(const void* device_ptr);

class CudaRegion {
 public:
  // `bytes` (1 or more) of new device memory on GPU `device`, zero-filled.
  static absl::StatusOr<std::unique_ptr<CudaRegion>> Create(Client& client, int device,
                                                            int64_t bytes,
                                                            const CallOptions& call = {});
  // The caller's allocation that starts at `device_ptr`, of which the first
  // `bytes` (at most the allocation's) are shared; the caller frees it after
  // the region is gone.
  static absl::StatusOr<std::unique_ptr<CudaRegion>> Register(Client& client, void* device_ptr,
                                                              int64_t bytes,
                                                              const CallOptions& call = {});
  ~CudaRegion();
  CudaRegion(const CudaRegion&) = delete;
  CudaRegion& operator=(const CudaRegion&) = delete;

  // Device memory: not readable on the host.
  uint8_t* data() const { return data_; }
  int64_t size() const { return bytes_; }
  uint64_t id() const { return id_; }
  const std::string& device_uuid() const { return device_uuid_; }

  // Bytes [offset, offset + bytes) of the region; INVALID_ARGUMENT when
  // they do not lie within it (checked without overflow) or when the offset
  // is not a multiple of 16.
  absl::StatusOr<RegionRef> Ref(int64_t offset, int64_t bytes) const;

 private:
  CudaRegion(Client& client, uint8_t* data, int64_t bytes, int device, bool owned);
  // Exports data_ and registers it; id_ is set on success.
  absl::Status Share(const CallOptions& call);

  Client& client_;
  uint8_t* const data_;
  const int64_t bytes_;
  const int device_;  // the allocation's GPU (-1 when not owned: unknown)
  const bool owned_;  // Create allocated it: freed by the destructor
  std::string device_uuid_;
  uint64_t id_ = 0;
};

}  // namespace mla::client

#endif  // MLA_OFFLOAD_CLIENT_CUDA_REGION_H_
