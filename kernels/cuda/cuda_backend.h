// The CUDA backend: spec sections 4 and 5 on one NVIDIA GPU (built for
// Hopper, sm_90a).
//
// Memory is device memory of the backend's GPU (cudaMalloc, zero-filled).
// Prologue() and Decode() check the structure of their parameters
// (CheckPrologueParams / CheckDecodeParams) and the alignment the kernels
// need (CheckCudaAlignment), then enqueue their kernels on the
// backend's stream and return; values inside index, slot and position arrays
// are the caller's contract and are not read on the host. Synchronize() waits
// for the stream and reports the first CUDA error, naming the kernels that
// were in flight. CopyToDevice and CopyToHost return with the copy done; the
// Async forms and BuildKeyLists only enqueue. Marks are CUDA events on the
// stream.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_CUDA_BACKEND_H_
#define MLA_OFFLOAD_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/decode_kernels.h"

namespace mla {
namespace cuda {
struct FusedQuery;  // kernels.h, which needs CUDA's headers
}  // namespace cuda
}  // namespace mla

namespace mla {

// The alignment the CUDA kernels need, InvalidArgument naming the pointer
// otherwise (a misaligned access would end the process's CUDA context):
// q, q_out, the insert rows and the pools 16 bytes (16-byte loads and
// stores), every other array 4 bytes. Null pointers are left to the
// structural checks. Allocate() gives 256-byte aligned memory.
absl::Status CheckCudaAlignment(const PrologueParams& params);
absl::Status CheckCudaAlignment(const DecodeParams& params);

class CudaBackend : public ComputeBackend {
 public:
  // Uses GPU `device`. A failure (no such device, no driver) is kept and
  // returned by every call; Create() reports it at once.
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  // Owns its stream and device memory.
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device);

  // OK when the device could be set up.
  const absl::Status& init_status() const { return init_status_; }
  // The decode kernels Decode() runs: MLA_CUDA_DECODE, read when the
  // backend is made (an unknown value is its init_status).
  cuda::DecodeKernels decode_kernels() const { return decode_kernels_; }

  std::string Describe() const override;
  bool host_accessible() const override { return false; }
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override;
  // Page-locked host memory (cudaMallocHost).
  absl::StatusOr<DeviceBuffer> AllocateHost(int64_t bytes) override;
  absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  absl::Status CopyToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes) override;
  absl::Status BuildKeyLists(const KeyListBuildParams& params) override;
  absl::Status Prologue(const PrologueParams& params) override;
  absl::Status Decode(const DecodeParams& params) override;
  // Fused with the default decode kernels at Hp <= 32 (the narrow kernel)
  // when decode.q is prologue.q_out and the two agree on tokens and heads:
  // the inserts alone (cuda::LaunchInserts), then the decode making the
  // query rows itself (cuda::FusedQuery) while they run. q_out is not
  // written. Otherwise the two calls.
  absl::Status PrologueAndDecode(const PrologueParams& prologue,
                                 const DecodeParams& decode) override;
  absl::Status Synchronize() override;
  absl::Status Mark(int mark) override;
  double MarkedMicros(int from, int to) const override;
  absl::Status WaitForMark(int mark) override;
  std::optional<MemoryInfo> Memory() const override;
  std::shared_ptr<HostPinner> MakeHostPinner() const override;
  // Opens CUDA IPC memory on this GPU or a peer GPU it reaches (peer access
  // is enabled when first needed); the size is the allocation's as the
  // driver reports it.
  std::shared_ptr<DeviceImporter> MakeDeviceImporter() const override;
  bool CopiesDirectlyFrom(const void* data) const override;
  absl::Status CopyToDeviceQueued(void* device_dst, const void* host_src, int64_t bytes) override;
  absl::Status MarkCopies(int mark) override;
  absl::Status JoinCopies() override;

  // The backend's stream (a cudaStream_t), for timing and interop: work
  // enqueued on it is ordered with the backend's kernels, with one limit.
  // The default decode kernels start while the kernel before them finishes
  // (programmatic dependent launch) and read the key lists' lengths and
  // indices before they wait for it (the cache rows and q only after): a
  // kernel that writes those lists must finish before Decode is called
  // (a synchronisation, or an event the host waits for), or be followed by
  // some other stream work (a copy) before it. Copies made with CopyToDevice
  // have finished when it returns.
  void* native_stream() const { return stream_; }

  // The number of GPUs the driver reports (0 when there is none or no driver).
  static int DeviceCount();

 private:
  absl::Status Activate();
  // Notes `what` in in_flight_.
  void Issued(const char* what);
  absl::Status Launched(const char* kernel, int error);
  // Decode, its query rows made by the decode itself when fused.q is set.
  absl::Status LaunchDecode(const DecodeParams& params, const cuda::FusedQuery& fused);
  // Enqueues a copy of `kind` (a cudaMemcpyKind) on `stream`.
  absl::Status EnqueueCopy(void* dst, const void* src, int64_t bytes, int kind, const char* what,
                           void* stream);
  // Records mark `mark` on `stream`.
  absl::Status RecordMark(int mark, void* stream);

  int device_;
  absl::Status init_status_;
  void* stream_ = nullptr;  // cudaStream_t
  void* copy_stream_ = nullptr;  // cudaStream_t: the copy queue
  void* join_event_ = nullptr;   // cudaEvent_t: JoinCopies' point in the copy queue
  int num_sms_ = 0;
  cuda::DecodeKernels decode_kernels_ = cuda::DecodeKernels::kWgmma;
  std::string name_;
  // What was enqueued since the last Synchronize (its last part), for error
  // messages.
  std::string in_flight_;
  // The first error seen by an asynchronous call, returned by Synchronize.
  absl::Status deferred_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* marks_[kMaxMarks] = {};  // cudaEvent_t, made with the stream
  bool marked_[kMaxMarks] = {};
};

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_CUDA_BACKEND_H_
