// The host's way to build a batch's key lists (KeyListBuildParams in
// kernels/backend.h): the default of ComputeBackend::BuildKeyLists, the CPU
// backend's, and the reference the CUDA kernel is tested against. Reads and
// writes host memory; parameters checked first (CheckKeyListBuildParams),
// values are the caller's contract. One thread.
#ifndef MLA_OFFLOAD_KERNELS_KEY_LISTS_H_
#define MLA_OFFLOAD_KERNELS_KEY_LISTS_H_

#include "absl/status/status.h"
#include "kernels/backend.h"

namespace mla {

absl::Status BuildKeyListsOnHost(const KeyListBuildParams& params);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_KEY_LISTS_H_
