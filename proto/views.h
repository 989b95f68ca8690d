// The messages of proto/mla_offload.proto as plain views, free of gRPC and of
// the generated classes: what the codecs (proto/attend_codec.h,
// proto/unary_codec.h) parse into and serialise from, what the engine takes
// as its requests, and what the C++ client builds.
//
// A TensorView's bytes lie in memory it does not own, as a list of pieces
// (the slices of a received message, the caller's buffer, or a same-host
// region once the server has resolved a reference to it); keep_alive, when
// set, keeps that memory alive. The small fields are copied into the
// views. Views are plain values: they may be read from several threads at
// once.
//
// CheckTensor is the one check of a tensor against what a field expects
// (dtype, shape, and the byte count that they imply), with arithmetic that
// cannot overflow: parsing leaves it to whoever knows what the field should
// hold, so that the error names that field.
#ifndef MLA_OFFLOAD_PROTO_VIEWS_H_
#define MLA_OFFLOAD_PROTO_VIEWS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mla::wire {

// A run of bytes of a message or of the caller's memory.
using Piece = absl::Span<const uint8_t>;

// Element types, numbered as mla_offload.v1.DType (the codec asserts that
// the numbers match). A view holds the wire value as it came, possibly one
// this enum does not name (proto3 enums are open).
enum class DType : int32_t {
  kUnspecified = 0,
  kBf16 = 1,
  kF32 = 2,
  kI32 = 3,
  kE4m3fn = 4,  // FP8 e4m3fn, in units of its block's scale
  kUe8m0 = 5,   // a power-of-two scale, 2^(byte - 127)
};

// Bytes per element of a known dtype; 0 for kUnspecified and unknown values.
size_t DTypeSize(DType dtype);

// The request metadata that names a client instance (the owner of its
// same-host regions; proto/mla_offload.proto's conventions).
inline constexpr char kClientIdMetadata[] = "mla-client-id";

// Bytes [offset, offset + byte_size) of a region the client registered
// (message RegionRef); the numbers as they came, unchecked.
struct RegionRefView {
  uint64_t region_id = 0;
  int64_t offset = 0;
  int64_t byte_size = 0;
};

// A Tensor message whose data lies in memory this view does not own.
struct TensorView {
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  // The data, in order: the concatenation of the pieces. No piece is empty.
  std::vector<Piece> pieces;
  // Keeps the pieces' memory alive (the received slices, or the caller's
  // buffer); null when the memory is known to outlive the view.
  std::shared_ptr<const void> keep_alive;
  // The same-host data plane: set when the message names its bytes in a
  // region (Tensor.region) instead of carrying them; pieces are then empty
  // until the server resolves the reference into the region's memory.
  std::optional<RegionRefView> region;
  // The pieces are device memory (a CUDA IPC region the server opened),
  // which the host cannot read: only the compute backend's copies and
  // kernels may touch them, and CopyTo and CopyRange end the process.
  bool device = false;

  size_t size_bytes() const;
  // Copies the data to dst (size_bytes() bytes), one memcpy per piece. Host
  // memory only (not `device`).
  void CopyTo(void* dst) const;
  // Copies bytes [offset, offset + length) of the data, which must lie
  // within size_bytes(). Host memory only.
  void CopyRange(size_t offset, size_t length, void* dst) const;
  // The data as one span when it lies in at most one piece (the usual case
  // for a message that arrived in one slice); nullopt when it is split.
  std::optional<Piece> contiguous() const;
};

// A TensorView of `size_bytes` bytes at `data`, guarded by keep_alive.
TensorView MakeTensorView(DType dtype, std::vector<int64_t> shape, const void* data,
                          size_t size_bytes, std::shared_ptr<const void> keep_alive);

// OK when the tensor has dtype `dtype`, a shape matching `shape` (a -1 entry
// matches any size) and exactly the bytes that shape needs; otherwise
// InvalidArgument naming `field`, e.g. "q: expected bf16 [2, 16, 512], got
// f32 [2, 16, 512]" or "kv: shape [3, 512] needs 3072 bytes of data, got
// 2048". A shape whose byte count overflows int64 matches no data. An absent
// tensor (nullopt) is checked as an empty one: unspecified dtype, shape [].
// A tensor that still names a region (one the server did not resolve into
// its memory) is InvalidArgument: that field takes inline bytes only.
absl::Status CheckTensor(const TensorView& tensor, absl::string_view field, DType dtype,
                         absl::Span<const int64_t> shape);
absl::Status CheckTensor(const std::optional<TensorView>& tensor, absl::string_view field,
                         DType dtype, absl::Span<const int64_t> shape);

// ---- The Attend stream (messages AttendRequest, AttendResponse).

struct SegmentView {
  std::string session_id;
  int32_t position = 0;
  int32_t num_tokens = 0;
  int32_t first_compressed_row = 0;
  int32_t num_compressed_rows = 0;
};

struct AttendRequestView {
  uint64_t request_id = 0;
  int32_t layer = 0;
  std::vector<SegmentView> segments;
  int32_t head_offset = 0;
  // Message fields have presence: nullopt when absent from the wire.
  std::optional<TensorView> q;              // [T, H, 512] bf16
  std::optional<TensorView> kv;             // [T, 512] bf16
  std::optional<TensorView> compressed_kv;  // [M, 512] bf16
  std::optional<TensorView> topk;           // [T, K] int32
  bool return_lse = false;
  bool derotate_output = false;
  // Where the answer's out and lse go instead of the response (same-host
  // regions); nullopt when absent from the wire.
  std::optional<RegionRefView> out_region;
  std::optional<RegionRefView> lse_region;
  // out as e4m3fn [T, H, 512] with out_scales [T, H, 4] instead of bf16.
  bool fp8_output = false;
  std::optional<RegionRefView> out_scales_region;
};

struct TimingView {
  double queue_us = 0;
  double prologue_us = 0;
  double decode_us = 0;
  double total_us = 0;
  int32_t batch_tokens = 0;
  double plan_us = 0;
  double upload_us = 0;
  double readback_us = 0;
  double serialize_us = 0;
};

// The outcome of one Attend message (message RequestStatus).
struct RequestStatusView {
  int32_t code = 0;  // a grpc::StatusCode; 0 = OK
  std::string message;
};

struct AttendResponseView {
  uint64_t request_id = 0;
  std::optional<TensorView> out;
  std::optional<TensorView> lse;
  std::optional<TimingView> timing;
  std::optional<RequestStatusView> status;
  std::optional<TensorView> out_scales;  // with fp8_output
};

// ---- Unary requests the engine takes (CreateSession, AppendKV).

struct CreateSessionRequestView {
  std::string model;
  int32_t num_heads = 0;
  std::optional<TensorView> sinks;  // f32 [layers, h_total] or [layers, num_heads]
  int32_t idle_ttl_seconds = 0;
};

struct LayerRowsView {
  int32_t layer = 0;
  std::optional<TensorView> swa_kv;         // [P, 512] bf16
  std::optional<TensorView> compressed_kv;  // [M, 512] bf16
  int32_t first_compressed_row = 0;
};

struct AppendKVRequestView {
  std::string session_id;
  int32_t first_position = 0;
  int32_t num_positions = 0;
  std::vector<LayerRowsView> layers;
};

}  // namespace mla::wire

#endif  // MLA_OFFLOAD_PROTO_VIEWS_H_
