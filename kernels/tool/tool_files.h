// The file names of the kernel tool's inputs and outputs (see the usage text
// in mla_kernel_tool.cc and kernels/README.md for dtypes and shapes).
//
// The tool calls each array by its file name everywhere, the in-memory arrays
// of the demo included, so that a message about a bad value names the file to
// change.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_TOOL_FILES_H_
#define MLA_OFFLOAD_KERNELS_TOOL_TOOL_FILES_H_

#include "absl/strings/string_view.h"

namespace mla {

// prologue inputs
inline constexpr absl::string_view kQFile = "q.npy";
inline constexpr absl::string_view kPositionsFile = "positions.npy";
inline constexpr absl::string_view kKvFile = "kv.npy";
inline constexpr absl::string_view kSlotsFile = "slots.npy";
inline constexpr absl::string_view kCompressedKvFile = "compressed_kv.npy";
inline constexpr absl::string_view kCompressedRowsFile = "compressed_rows.npy";
inline constexpr absl::string_view kCompressedSlotsFile = "compressed_slots.npy";
// pools: prologue input (optional) and output, decode input
inline constexpr absl::string_view kCacheFile = "cache.npy";
inline constexpr absl::string_view kCompressedCacheFile = "compressed_cache.npy";
// prologue output, decode input (as q.npy)
inline constexpr absl::string_view kQOutFile = "q_out.npy";
// decode inputs
inline constexpr absl::string_view kMainIndicesFile = "main_indices.npy";
inline constexpr absl::string_view kMainLengthsFile = "main_lengths.npy";
inline constexpr absl::string_view kExtraIndicesFile = "extra_indices.npy";
inline constexpr absl::string_view kExtraLengthsFile = "extra_lengths.npy";
inline constexpr absl::string_view kSinksFile = "sinks.npy";
// decode outputs
inline constexpr absl::string_view kOutFile = "out.npy";
inline constexpr absl::string_view kLseFile = "lse.npy";

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_TOOL_FILES_H_
