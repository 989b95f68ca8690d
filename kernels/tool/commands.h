// The kernel tool's file subcommands: one prologue or one decode call of one
// layer, from .npy files in a folder to .npy files in another.
//
// The files, their dtypes and shapes are those of the usage text in
// mla_kernel_tool.cc (names in tool_files.h). Every file is checked before
// the backend is called: dtype and shape, the token count N agreeing between
// files, and every position, slot and key index (staging.h). A failure is a
// Status with a one-line message naming the file and what to change, and no
// output file is written. On success a one-line summary goes to stdout.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_COMMANDS_H_
#define MLA_OFFLOAD_KERNELS_TOOL_COMMANDS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/tool/layer_config.h"

namespace mla {

struct CommandOptions {
  std::string in_dir;
  std::string out_dir;  // created when missing
  LayerConfig layer;
  // prologue: blocks of a new pool (when cache.npy / compressed_cache.npy are
  // not in in_dir); 0 = just enough for the largest slot.
  int64_t num_blocks = 0;
  int64_t compressed_num_blocks = 0;
  // decode
  int heads = 0;  // H to output; 0 = every head of q (Hp)
  bool derotate = false;
  bool return_lse = true;
};

absl::Status RunPrologueCommand(ComputeBackend& backend, const CommandOptions& options);
absl::Status RunDecodeCommand(ComputeBackend& backend, const CommandOptions& options);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_COMMANDS_H_
