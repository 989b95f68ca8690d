#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "kernels/cuda/allocation_range.h"
#include "kernels/cuda/kernels.h"
#include "kernels/gpu_uuid.h"

namespace mla {
namespace {

// An error status for a failed CUDA call (OK for cudaSuccess). The runtime
// keeps a failed call's error as the thread's last error, which the kernel
// launches read back (cudaGetLastError): it is cleared here, so that a
// later, unrelated launch does not report it again (a sticky error, a
// fault, is not cleared by this and keeps failing every call, as it must).
absl::Status CudaError(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string message = absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorName(error),
                                           " (", cudaGetErrorString(error), ")");
  return error == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(message)
                                            : absl::InternalError(message);
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Why cudaGetDeviceCount failed, in the words an operator needs. Without a
// driver the runtime says "driver version is insufficient", which sends
// people to upgrade a driver that is not there: the driver library is
// looked for first.
absl::Status NoDeviceStatus(cudaError_t error) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (driver == nullptr) driver = ::dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver == nullptr) {
    return absl::FailedPreconditionError(
        "no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded): --backend=cuda needs "
        "an NVIDIA Hopper GPU and its driver; use --backend=cpu here");
  }
  ::dlclose(driver);
  if (error == cudaErrorNoDevice) {
    return absl::FailedPreconditionError(
        "the NVIDIA driver finds no GPU on this machine (or none visible to this process: "
        "CUDA_VISIBLE_DEVICES, the container's device list); use --backend=cpu without one");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no usable CUDA device: ", cudaGetErrorString(error),
                   error == cudaErrorInsufficientDriver
                       ? " (the NVIDIA driver is older than this build's CUDA runtime: update it)"
                       : ""));
}

// A pointer the kernels need `alignment`-aligned; `name` for the message.
struct Alignment {
  const void* pointer;
  int alignment;
  const char* name;
};

// InvalidArgument naming the first misaligned pointer ("<scope><name>"); the
// message is built only then (these run on every launch).
absl::Status CheckAligned(absl::string_view scope, std::initializer_list<Alignment> pointers) {
  for (const Alignment& p : pointers) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(p.pointer);
    if (address % p.alignment == 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        scope, p.name, " must be ", p.alignment, "-byte aligned for the CUDA kernels; it is at 0x",
        absl::Hex(address), " (Allocate() gives aligned memory; keep offsets multiples of ",
        p.alignment, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckCudaAlignment(const PrologueParams& params) {
  return CheckAligned(
      "prologue: ",
      {{params.q, 16, "q"}, {params.q_out, 16, "q_out"}, {params.positions, 4, "positions"},
       {params.rope.data, 4, "RoPE table"}, {params.swa.rows, 16, "swa rows"},
       {params.swa.positions, 4, "swa positions"}, {params.swa.slots, 4, "swa slots"},
       {params.swa.pool.base, 16, "swa pool"}, {params.compressed.rows, 16, "compressed rows"},
       {params.compressed.positions, 4, "compressed positions"},
       {params.compressed.slots, 4, "compressed slots"},
       {params.compressed.pool.base, 16, "compressed pool"}});
}

absl::Status CheckCudaAlignment(const DecodeParams& params) {
  return CheckAligned(
      "decode: ",
      {{params.q, 16, "q"}, {params.out, 4, "out"}, {params.out_e4m3, 16, "out_e4m3"},
       {params.out_scales, 4, "out_scales"}, {params.lse, 4, "lse"},
       {params.sinks, 4, "sinks"}, {params.positions, 4, "positions"},
       {params.rope.data, 4, "RoPE table"}, {params.main.indices, 4, "main list indices"},
       {params.main.lengths, 4, "main list lengths"}, {params.main.pool.base, 16, "main list pool"},
       {params.extra.indices, 4, "extra list indices"},
       {params.extra.lengths, 4, "extra list lengths"},
       {params.extra.pool.base, 16, "extra list pool"}});
}

CudaBackend::CudaBackend(int device) : device_(device) {
  // Checked before the device, so that the mistake is named on any machine.
  const char* decode = std::getenv("MLA_CUDA_DECODE");
  const std::optional<cuda::DecodeKernels> kernels = cuda::DecodeKernelsFor(decode);
  if (!kernels.has_value()) {
    init_status_ = absl::InvalidArgumentError(
        absl::StrCat("MLA_CUDA_DECODE=", decode,
                     " names no decode kernels: use ", cuda::DecodeKernelsChoices()));
    return;
  }
  decode_kernels_ = *kernels;
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    init_status_ = NoDeviceStatus(error);
    return;
  }
  if (device < 0 || device >= count) {
    init_status_ = absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " found)"));
    return;
  }
  cudaDeviceProp prop;
  init_status_ = CudaError(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  if (!init_status_.ok()) return;
  if (prop.major != 9) {
    init_status_ = absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", device, " (", prop.name, ") is sm_", prop.major, prop.minor,
        "; this build has kernels for sm_90a (Hopper) only"));
    return;
  }
  num_sms_ = prop.multiProcessorCount;
  name_ = prop.name;
  init_status_ = CudaError(cudaSetDevice(device), "cudaSetDevice");
  if (!init_status_.ok()) return;
  cudaStream_t stream = nullptr;
  init_status_ = CudaError(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                           "cudaStreamCreate");
  if (!init_status_.ok()) return;
  stream_ = stream;
  cudaStream_t copy_stream = nullptr;
  init_status_ = CudaError(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking),
                           "cudaStreamCreate (copy queue)");
  if (!init_status_.ok()) return;
  copy_stream_ = copy_stream;
  cudaEvent_t join = nullptr;
  init_status_ = CudaError(cudaEventCreateWithFlags(&join, cudaEventDisableTiming),
                           "cudaEventCreate (copy queue)");
  if (!init_status_.ok()) return;
  join_event_ = join;
  for (void*& mark : marks_) {
    cudaEvent_t event = nullptr;
    init_status_ = CudaError(cudaEventCreate(&event), "cudaEventCreate");
    if (!init_status_.ok()) return;
    mark = event;
  }
  bool fp8_ok = false;
  init_status_ = CudaError(cuda::CheckFp8NegativeZero(stream, &fp8_ok), "fp8 self-check kernel");
  if (init_status_.ok() && !fp8_ok) {
    init_status_ = absl::InternalError(
        "the GPU's e4m3 conversion does not give 0x80 for a negative value rounding to zero");
  }
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    cudaSetDevice(device_);
    cudaStreamSynchronize(AsStream(stream_));
    cudaStreamDestroy(AsStream(stream_));
  }
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(AsStream(copy_stream_));
    cudaStreamDestroy(AsStream(copy_stream_));
  }
  if (join_event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(join_event_));
  for (void* mark : marks_) {
    if (mark != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(mark));
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device) {
  auto backend = std::make_unique<CudaBackend>(device);
  if (!backend->init_status().ok()) return backend->init_status();
  return backend;
}

int CudaBackend::DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::string CudaBackend::Describe() const {
  if (!init_status_.ok()) return absl::StrCat("cuda (device ", device_, ": unusable)");
  return absl::StrCat("cuda (device ", device_, ": ", name_, ", ", num_sms_, " SMs)");
}

absl::Status CudaBackend::Activate() {
  if (!init_status_.ok()) return init_status_;
  return CudaError(cudaSetDevice(device_), "cudaSetDevice");
}

void CudaBackend::Issued(const char* what) {
  // Launches pipelined without a Synchronize between them would grow the
  // list without end: keep its last part.
  constexpr size_t kKeep = 512;
  if (in_flight_.size() > 2 * kKeep) {
    const size_t cut = in_flight_.find(", ", in_flight_.size() - kKeep);
    in_flight_ = absl::StrCat("..., ", in_flight_.substr(cut == std::string::npos ? 0 : cut + 2));
  }
  absl::StrAppend(&in_flight_, in_flight_.empty() ? "" : ", ", what);
}

absl::Status CudaBackend::Launched(const char* kernel, int error) {
  Issued(kernel);
  const absl::Status status =
      CudaError(static_cast<cudaError_t>(error), absl::StrCat("launching ", kernel));
  if (!status.ok() && deferred_.ok()) deferred_ = status;
  return status;
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
  if (absl::Status status = Activate(); !status.ok()) return status;
  void* data = nullptr;
  if (absl::Status status =
          CudaError(cudaMalloc(&data, std::max<int64_t>(bytes, 1)),
                    absl::StrCat("cudaMalloc of ", bytes, " bytes on device ", device_));
      !status.ok()) {
    return status;  // ResourceExhausted when the device is out of memory
  }
  // Ordered before every later use of the buffer on the stream.
  if (absl::Status status = CudaError(cudaMemsetAsync(data, 0, std::max<int64_t>(bytes, 1),
                                                      AsStream(stream_)),
                                      "cudaMemset");
      !status.ok()) {
    cudaFree(data);
    return status;
  }
  if (absl::Status status =
          CudaError(cudaStreamSynchronize(AsStream(stream_)), "cudaMemset (synchronize)");
      !status.ok()) {
    cudaFree(data);
    return status;
  }
  const int device = device_;
  return DeviceBuffer(data, bytes, [device](void* ptr) {
    cudaSetDevice(device);
    cudaFree(ptr);
  });
}

absl::StatusOr<DeviceBuffer> CudaBackend::AllocateHost(int64_t bytes) {
  if (bytes < 0) return absl::InvalidArgumentError("cannot allocate a negative size");
  if (absl::Status status = Activate(); !status.ok()) return status;
  void* data = nullptr;
  if (absl::Status status = CudaError(cudaMallocHost(&data, std::max<int64_t>(bytes, 1)),
                                      absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
      !status.ok()) {
    return status;
  }
  return DeviceBuffer(data, bytes, [](void* ptr) { cudaFreeHost(ptr); });
}

absl::Status CudaBackend::CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  if (absl::Status status = Activate(); !status.ok()) return status;
  if (absl::Status status = CudaError(cudaMemcpyAsync(device_dst, host_src, bytes,
                                                      cudaMemcpyHostToDevice, AsStream(stream_)),
                                      "cudaMemcpy to device");
      !status.ok()) {
    return status;
  }
  return CudaError(cudaStreamSynchronize(AsStream(stream_)), "cudaMemcpy to device");
}

absl::Status CudaBackend::CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
  if (bytes <= 0) return absl::OkStatus();
  if (absl::Status status = Activate(); !status.ok()) return status;
  if (absl::Status status = CudaError(cudaMemcpyAsync(host_dst, device_src, bytes,
                                                      cudaMemcpyDeviceToHost, AsStream(stream_)),
                                      "cudaMemcpy to host");
      !status.ok()) {
    return status;
  }
  return CudaError(cudaStreamSynchronize(AsStream(stream_)),
                   in_flight_.empty() ? std::string("cudaMemcpy to host")
                                      : absl::StrCat("cudaMemcpy to host after ", in_flight_));
}

absl::Status CudaBackend::EnqueueCopy(void* dst, const void* src, int64_t bytes, int kind,
                                      const char* what, void* stream) {
  if (bytes <= 0) return absl::OkStatus();
  if (absl::Status status = Activate(); !status.ok()) return status;
  Issued(what);
  return CudaError(cudaMemcpyAsync(dst, src, bytes, static_cast<cudaMemcpyKind>(kind),
                                   AsStream(stream)),
                   what);
}

// The asynchronous copies let the runtime tell host from device memory
// (cudaMemcpyDefault): their host side may be an imported region's device
// memory.
absl::Status CudaBackend::CopyToDeviceAsync(void* device_dst, const void* host_src,
                                            int64_t bytes) {
  return EnqueueCopy(device_dst, host_src, bytes, cudaMemcpyDefault, "copy to device", stream_);
}

absl::Status CudaBackend::CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes) {
  return EnqueueCopy(host_dst, device_src, bytes, cudaMemcpyDefault, "copy to host", stream_);
}

absl::Status CudaBackend::CopyToDeviceQueued(void* device_dst, const void* host_src,
                                             int64_t bytes) {
  return EnqueueCopy(device_dst, host_src, bytes, cudaMemcpyDefault,
                     "copy to device (copy queue)", copy_stream_);
}

absl::Status CudaBackend::MarkCopies(int mark) { return RecordMark(mark, copy_stream_); }

absl::Status CudaBackend::JoinCopies() {
  if (absl::Status status = Activate(); !status.ok()) return status;
  if (absl::Status status =
          CudaError(cudaEventRecord(static_cast<cudaEvent_t>(join_event_), AsStream(copy_stream_)),
                    "cudaEventRecord (copy queue)");
      !status.ok()) {
    return status;
  }
  return CudaError(
      cudaStreamWaitEvent(AsStream(stream_), static_cast<cudaEvent_t>(join_event_), 0),
      "cudaStreamWaitEvent (copy queue)");
}

absl::Status CudaBackend::BuildKeyLists(const KeyListBuildParams& params) {
  if (absl::Status status = CheckKeyListBuildParams(params); !status.ok()) return status;
  if (absl::Status status = Activate(); !status.ok()) return status;
  return Launched("key list kernel", cuda::LaunchKeyLists(params, AsStream(stream_)));
}

absl::Status CudaBackend::Mark(int mark) { return RecordMark(mark, stream_); }

absl::Status CudaBackend::RecordMark(int mark, void* stream) {
  if (absl::Status status = CheckMark(mark); !status.ok()) return status;
  if (absl::Status status = Activate(); !status.ok()) return status;
  marked_[mark] = false;
  if (absl::Status status = CudaError(
          cudaEventRecord(static_cast<cudaEvent_t>(marks_[mark]), AsStream(stream)),
          "cudaEventRecord");
      !status.ok()) {
    return status;
  }
  marked_[mark] = true;
  return absl::OkStatus();
}

namespace {

// cudaHostRegister on the backend's device, from whichever thread asks.
class CudaHostPinner : public HostPinner {
 public:
  explicit CudaHostPinner(int device) : device_(device) {}
  absl::Status Pin(void* data, int64_t bytes) override {
    if (absl::Status status = CudaError(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) {
      return status;
    }
    const cudaError_t error =
        cudaHostRegister(data, static_cast<size_t>(bytes), cudaHostRegisterPortable);
    // Cleared: this thread's next kernel launch must not report it.
    if (error != cudaSuccess) cudaGetLastError();
    return CudaError(error, absl::StrCat("cudaHostRegister of ", bytes, " bytes"));
  }
  void Unpin(void* data) override {
    if (cudaSetDevice(device_) == cudaSuccess && cudaHostUnregister(data) != cudaSuccess) {
      cudaGetLastError();
    }
  }

 private:
  const int device_;
};

// cudaIpcOpenMemHandle on the backend's device, from whichever thread asks;
// the memory may lie on a peer GPU of the host that the device reaches.
class CudaDeviceImporter : public DeviceImporter {
 public:
  explicit CudaDeviceImporter(int device) : device_(device) {}

  absl::StatusOr<ImportedMemory> Import(absl::string_view handle,
                                        absl::string_view device_uuid) override {
    cudaIpcMemHandle_t ipc{};
    if (handle.size() != sizeof(ipc)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc_handle: ", handle.size(), " bytes; a cudaIpcMemHandle_t is ", sizeof(ipc),
          " (send the bytes cudaIpcGetMemHandle wrote, unchanged)"));
    }
    std::memcpy(&ipc, handle.data(), sizeof(ipc));
    absl::StatusOr<int> owner = DeviceOf(device_uuid);
    if (!owner.ok()) return owner.status();
    if (*owner != device_) {
      int reaches = 0;
      if (cudaDeviceCanAccessPeer(&reaches, device_, *owner) != cudaSuccess || !reaches) {
        cudaGetLastError();
        return absl::FailedPreconditionError(absl::StrCat(
            "device_uuid: ", device_uuid, " is GPU ", *owner, " of this host, which this server's GPU ",
            device_, " cannot reach (no peer access); register memory of GPU ", device_,
            " or of a GPU it reaches"));
      }
    }
    if (absl::Status status = CudaError(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) {
      return status;
    }
    void* data = nullptr;
    const cudaError_t error = cudaIpcOpenMemHandle(&data, ipc, cudaIpcMemLazyEnablePeerAccess);
    if (error != cudaSuccess) {
      cudaGetLastError();
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda_ipc_handle: the driver cannot open it (", cudaGetErrorName(error), ": ",
          cudaGetErrorString(error),
          "); export it with cudaIpcGetMemHandle in a live process of this host, from memory "
          "cudaMalloc gave, and register each allocation once"));
    }
    const int device = device_;
    std::shared_ptr<const void> mapping(data, [device](const void* p) {
      if (cudaSetDevice(device) != cudaSuccess || cudaIpcCloseMemHandle(const_cast<void*>(p)) !=
                                                      cudaSuccess) {
        cudaGetLastError();
      }
    });
    // The allocation's size, which bounds every reference into it: the
    // kernels must never read or write past it (a fault would end the
    // server's CUDA context).
    absl::StatusOr<cuda::AllocationRange> range = cuda::AllocationOf(data);
    if (!range.ok() || range->base != data) {
      return absl::InternalError(
          "the driver does not say how large the opened CUDA IPC allocation is; it cannot be "
          "used safely");
    }
    return ImportedMemory{std::move(mapping), static_cast<uint8_t*>(data), range->bytes};
  }

 private:
  // The device whose UUID is `uuid`.
  static absl::StatusOr<int> DeviceOf(absl::string_view uuid) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop;
      if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
        cudaGetLastError();
        continue;
      }
      std::array<uint8_t, kGpuUuidBytes> bytes;
      std::memcpy(bytes.data(), prop.uuid.bytes, bytes.size());
      if (FormatGpuUuid(bytes) == uuid) return d;
    }
    // The host's GPUs are not listed: a caller learns nothing of them here.
    return absl::NotFoundError(absl::StrCat(
        "device_uuid: ", absl::CEscape(uuid.substr(0, 64)),
        " is no GPU of this host; give the UUID of the GPU the memory is on, as nvidia-smi -L "
        "prints it"));
  }

  const int device_;
};

}  // namespace

std::shared_ptr<DeviceImporter> CudaBackend::MakeDeviceImporter() const {
  if (!init_status_.ok()) return nullptr;
  return std::make_shared<CudaDeviceImporter>(device_);
}

std::shared_ptr<HostPinner> CudaBackend::MakeHostPinner() const {
  if (!init_status_.ok()) return nullptr;
  return std::make_shared<CudaHostPinner>(device_);
}

bool CudaBackend::CopiesDirectlyFrom(const void* data) const {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is no error to keep
    return false;
  }
  // Pinned host memory, or device memory (this GPU's, or an imported
  // region's).
  return attributes.type == cudaMemoryTypeHost || attributes.type == cudaMemoryTypeDevice;
}

std::optional<ComputeBackend::MemoryInfo> CudaBackend::Memory() const {
  if (!init_status_.ok() || cudaSetDevice(device_) != cudaSuccess) return std::nullopt;
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return std::nullopt;
  return MemoryInfo{static_cast<int64_t>(total - free), static_cast<int64_t>(total)};
}

absl::Status CudaBackend::WaitForMark(int mark) {
  if (absl::Status status = CheckMark(mark); !status.ok()) return status;
  if (!marked_[mark]) return absl::OkStatus();
  // Only the runtime's (thread-safe) calls: another thread may issue work.
  if (absl::Status status = CudaError(cudaSetDevice(device_), "cudaSetDevice"); !status.ok()) {
    return status;
  }
  return CudaError(cudaEventSynchronize(static_cast<cudaEvent_t>(marks_[mark])),
                   absl::StrCat("waiting for the work before mark ", mark));
}

double CudaBackend::MarkedMicros(int from, int to) const {
  if (from < 0 || from >= kMaxMarks || to < 0 || to >= kMaxMarks || !marked_[from] ||
      !marked_[to]) {
    return 0;
  }
  float ms = 0;
  if (!CudaError(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(marks_[from]),
                                      static_cast<cudaEvent_t>(marks_[to])),
                 "cudaEventElapsedTime")
           .ok()) {
    return 0;
  }
  return ms * 1000.0;
}

absl::Status CudaBackend::Prologue(const PrologueParams& params) {
  if (absl::Status status = CheckPrologueParams(params); !status.ok()) return status;
  if (absl::Status status = CheckCudaAlignment(params); !status.ok()) return status;
  if (absl::Status status = Activate(); !status.ok()) return status;
  return Launched("prologue kernel", cuda::LaunchPrologue(params, num_sms_, AsStream(stream_)));
}

absl::Status CudaBackend::Decode(const DecodeParams& params) {
  return LaunchDecode(params, cuda::FusedQuery{});
}

absl::Status CudaBackend::PrologueAndDecode(const PrologueParams& prologue,
                                            const DecodeParams& decode) {
  const bool fusable = decode_kernels_ == cuda::DecodeKernels::kWgmma &&
                       decode.padded_heads <= cuda::kNarrowMaxHeads &&
                       decode.q == prologue.q_out && decode.num_tokens == prologue.num_tokens &&
                       decode.num_heads == prologue.num_heads &&
                       decode.padded_heads == prologue.padded_heads;
  if (!fusable) return ComputeBackend::PrologueAndDecode(prologue, decode);
  if (absl::Status status = CheckPrologueParams(prologue); !status.ok()) return status;
  if (absl::Status status = CheckCudaAlignment(prologue); !status.ok()) return status;
  if (absl::Status status = CheckDecodeParams(decode); !status.ok()) return status;
  if (absl::Status status = CheckCudaAlignment(decode); !status.ok()) return status;
  if (absl::Status status = Activate(); !status.ok()) return status;
  if (absl::Status status =
          Launched("prologue inserts kernel", cuda::LaunchInserts(prologue, AsStream(stream_)));
      !status.ok()) {
    return status;
  }
  return LaunchDecode(decode, cuda::FusedQuery{prologue.q, prologue.positions, prologue.rope,
                                               prologue.rms_norm_eps});
}

absl::Status CudaBackend::LaunchDecode(const DecodeParams& params,
                                       const cuda::FusedQuery& fused) {
  if (absl::Status status = CheckDecodeParams(params); !status.ok()) return status;
  if (absl::Status status = CheckCudaAlignment(params); !status.ok()) return status;
  if (params.out_e4m3 != nullptr && decode_kernels_ != cuda::DecodeKernels::kWgmma &&
      decode_kernels_ != cuda::DecodeKernels::kPadded) {
    return absl::UnimplementedError(absl::StrCat(
        "decode: the FP8 output runs on the wgmma and padded decode kernels; MLA_CUDA_DECODE=",
        cuda::DecodeKernelsName(decode_kernels_), " is a bf16 cross-check: unset it"));
  }
  if (absl::Status status = Activate(); !status.ok()) return status;
  const size_t scratch = cuda::DecodeScratchBytes(params, decode_kernels_, num_sms_);
  if (scratch > scratch_bytes_) {
    // Earlier decodes may still read the old scratch: wait for them.
    if (absl::Status status = CudaError(cudaStreamSynchronize(AsStream(stream_)),
                                        absl::StrCat("synchronize before growing scratch after ",
                                                     in_flight_));
        !status.ok()) {
      return status;
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    if (absl::Status status = CudaError(cudaMalloc(&scratch_, scratch), "decode scratch cudaMalloc");
        !status.ok()) {
      scratch_ = nullptr;
      return status;
    }
    scratch_bytes_ = scratch;
  }
  return Launched("decode kernel", cuda::LaunchDecode(params, decode_kernels_, num_sms_,
                                                      scratch_, AsStream(stream_), fused));
}

absl::Status CudaBackend::Synchronize() {
  if (absl::Status status = Activate(); !status.ok()) return status;
  absl::Status status = CudaError(
      cudaStreamSynchronize(AsStream(stream_)),
      in_flight_.empty() ? std::string("synchronize") : absl::StrCat("synchronize after ", in_flight_));
  // The copy queue too, whatever the stream said: its copies may read
  // memory (a client's region) that the caller lets go of after this.
  const absl::Status copies =
      CudaError(cudaStreamSynchronize(AsStream(copy_stream_)), "synchronize (copy queue)");
  if (status.ok()) status = copies;
  if (status.ok()) status = CudaError(cudaGetLastError(), "synchronize");
  if (status.ok() && !deferred_.ok()) status = deferred_;
  in_flight_.clear();
  deferred_ = absl::OkStatus();
  return status;
}

}  // namespace mla
