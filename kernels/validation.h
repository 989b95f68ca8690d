// Checks of the values inside index, slot and position arrays in host memory.
//
// Kernels assume these hold (spec section 5: an index that is negative but not
// -1, or beyond its pool, is a contract violation). Whatever feeds a kernel
// from outside (the server, the kernel tool) calls these first. Each returns
// InvalidArgument naming the array, the first bad element and the valid range.
#ifndef MLA_OFFLOAD_KERNELS_VALIDATION_H_
#define MLA_OFFLOAD_KERNELS_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mla {

// Each slot is -1 or in [0, pool_slots), and no slot is written twice.
absl::Status CheckInsertSlots(absl::string_view name, const int32_t* slots, int64_t count,
                              int64_t pool_slots);

// Each position is in [0, num_positions) (the RoPE table's rows).
absl::Status CheckPositions(absl::string_view name, const int32_t* positions, int64_t count,
                            int64_t num_positions);

// lengths (null = width for every token) are in [0, width]; every index within
// a token's length is -1 or in [0, pool_slots).
absl::Status CheckKeyIndices(absl::string_view name, const int32_t* indices,
                             const int32_t* lengths, int64_t num_tokens, int width,
                             int64_t pool_slots);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_VALIDATION_H_
