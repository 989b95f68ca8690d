// Host arrays staged in a compute backend for one prologue or one decode call,
// shared by the tool's subcommands and its demo.
//
// Create() checks that the spans agree in size, checks every position, slot
// and key index with kernels/validation.h (the backends may assume them
// valid), copies the inputs into backend memory and allocates the outputs,
// filled with NaN bit patterns so that an element a kernel forgets to write
// cannot pass for a result. Run() issues the call, which may be asynchronous;
// the output accessors synchronise before copying back. Messages name arrays
// by their tool file names (tool_files.h). A prepared call refers to the
// backend, pools and RoPE table it was created with, which must outlive it.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_STAGING_H_
#define MLA_OFFLOAD_KERNELS_TOOL_STAGING_H_

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "kernels/cache_format.h"
#include "kernels/rope.h"
#include "kernels/tool/npy.h"

namespace mla {

// A paged pool in backend memory.
struct DevicePool {
  DeviceBuffer buffer;
  int64_t num_blocks = 0;

  CachePoolView view() const { return {buffer.as<uint8_t>(), num_blocks}; }
};

// `blocks` is [num_blocks, kBlockBytes] |u1, as cache.npy holds a pool.
absl::StatusOr<DevicePool> UploadPool(ComputeBackend& backend, const NpyArray& blocks);
absl::StatusOr<NpyArray> DownloadPool(ComputeBackend& backend, const DevicePool& pool);

// A RoPE table in backend memory.
struct DeviceRope {
  DeviceBuffer buffer;
  int64_t num_positions = 0;

  RopeTableView view() const { return {buffer.as<const float>(), num_positions}; }
};

absl::StatusOr<DeviceRope> UploadRope(ComputeBackend& backend, const RopeTable& table);

// Rows a table needs for every non-negative position listed: 1 + the largest
// (at least 1). Negative positions are left for validation to report.
int64_t RopeRowsFor(std::initializer_list<absl::Span<const int32_t>> positions);

// Rows to insert into one pool.
struct HostInsert {
  absl::Span<const uint16_t> rows;      // [R, 512] bf16
  absl::Span<const int32_t> positions;  // [R] RoPE positions
  absl::Span<const int32_t> slots;      // [R] global slots; -1 writes nothing
};

struct HostPrologue {
  int num_heads = 0;                    // H; the call runs at PaddedHeadCount(H)
  absl::Span<const uint16_t> q;         // [N, H, 512] bf16
  absl::Span<const int32_t> positions;  // [N]
  float rms_norm_eps = 0.0f;
  HostInsert swa;
  HostInsert compressed;
};

class PreparedPrologue {
 public:
  static absl::StatusOr<PreparedPrologue> Create(ComputeBackend& backend, const HostPrologue& host,
                                                 const DeviceRope& rope, const DevicePool& swa_pool,
                                                 const DevicePool& compressed_pool);

  const PrologueParams& params() const { return params_; }
  absl::Status Run() { return backend_->Prologue(params_); }
  // [N, Hp, 512] <u2.
  absl::StatusOr<NpyArray> QOut() const;

 private:
  explicit PreparedPrologue(ComputeBackend& backend) : backend_(&backend) {}

  ComputeBackend* backend_;
  std::vector<DeviceBuffer> buffers_;
  PrologueParams params_;
};

// One key list; its pool is given to PreparedDecode::Create.
struct HostKeyList {
  int width = 0;                      // entries per token; 0 = no list
  absl::Span<const int32_t> indices;  // [N, width] global slots, -1 = skip
  absl::Span<const int32_t> lengths;  // [N]; empty = width for every token
};

struct HostDecode {
  int num_heads = 0;             // H: heads to output
  int padded_heads = 0;          // Hp: heads in q
  absl::Span<const uint16_t> q;  // [N, Hp, 512] bf16, a prologue's q_out
  float softmax_scale = 0.0f;
  absl::Span<const float> sinks;  // [H]; empty = no sink
  HostKeyList main;
  HostKeyList extra;
  bool derotate = false;
  absl::Span<const int32_t> positions;  // [N]; read only when derotate
  bool want_lse = true;
};

class PreparedDecode {
 public:
  // `rope` may be null unless host.derotate; `extra_pool` is read only when
  // host.extra.width > 0.
  static absl::StatusOr<PreparedDecode> Create(ComputeBackend& backend, const HostDecode& host,
                                               const DevicePool& main_pool,
                                               const DevicePool& extra_pool,
                                               const DeviceRope* rope);

  const DecodeParams& params() const { return params_; }
  absl::Status Run() { return backend_->Decode(params_); }
  // [N, H, 512] <u2 and [N, H] <f4 (the latter only when want_lse).
  absl::StatusOr<NpyArray> Out() const;
  absl::StatusOr<NpyArray> Lse() const;

 private:
  explicit PreparedDecode(ComputeBackend& backend) : backend_(&backend) {}

  ComputeBackend* backend_;
  std::vector<DeviceBuffer> buffers_;
  DecodeParams params_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_STAGING_H_
