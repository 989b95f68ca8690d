// The CPU backend: the executable reference of spec sections 4 and 5 and the
// backend of servers without a GPU (the demo and CI run it).
//
// Memory is host memory. Operations run synchronously on a pool of threads
// (tokens, then groups of heads, are spread over them); inner loops are AVX2
// (the build targets x86-64-v3), vectorised across independent lanes (dims of
// one dot product's lane sums, heads of one token) so that every float is
// rounded, and every sum taken, in the order of the scalar definition: the
// output bits do not depend on the thread count and are pinned by
// kernels/cpu_backend_bits_test.cc. Besides the structural checks every
// backend makes, it checks the values of index, slot and position arrays
// (kernels/validation.h), since it can read them for free.
#ifndef MLA_OFFLOAD_KERNELS_CPU_BACKEND_H_
#define MLA_OFFLOAD_KERNELS_CPU_BACKEND_H_

#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/thread_pool.h"

namespace mla {

class CpuBackend : public ComputeBackend {
 public:
  // num_threads <= 0 uses every hardware thread.
  explicit CpuBackend(int num_threads);

  std::string Describe() const override;
  bool host_accessible() const override { return true; }
  absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) override;
  absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  absl::Status Prologue(const PrologueParams& params) override;
  absl::Status Decode(const DecodeParams& params) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  ThreadPool pool_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CPU_BACKEND_H_
