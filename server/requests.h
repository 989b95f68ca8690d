// What the engine is asked to do and what it answers, free of gRPC: the
// service turns wire messages into these (tensor bytes stay where gRPC put
// them; TensorInput points at them) and results back into wire messages.
#ifndef MLA_OFFLOAD_SERVER_REQUESTS_H_
#define MLA_OFFLOAD_SERVER_REQUESTS_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/geometry.h"

namespace mla {

// Element types, numbered as mla_offload.v1.DType.
enum class DType : int { kUnspecified = 0, kBf16 = 1, kF32 = 2, kI32 = 3 };

// A tensor received from a client: dtype, shape and its bytes as pieces of
// memory owned by whoever built the TensorInput (the gRPC message buffers),
// which must outlive the request.
struct TensorInput {
  bool present = false;  // the field was in the message
  int dtype = 0;         // a DType value, or whatever the client sent
  std::vector<int64_t> shape;
  std::vector<std::pair<const uint8_t*, size_t>> pieces;

  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& piece : pieces) total += static_cast<int64_t>(piece.second);
    return total;
  }
  // Copies the data into contiguous memory of bytes() bytes.
  void CopyTo(void* dst) const {
    uint8_t* out = static_cast<uint8_t*>(dst);
    for (const auto& piece : pieces) {
      std::memcpy(out, piece.first, piece.second);
      out += piece.second;
    }
  }
  // Copies bytes [offset, offset + length) of the data.
  void CopyRange(int64_t offset, int64_t length, void* dst) const;
};

// Checks dtype and shape ({-1} entries match any size); InvalidArgument
// naming the field otherwise. Also checks that the bytes match the shape
// (a shape whose byte count overflows int64 matches no data).
absl::Status CheckTensor(const TensorInput& tensor, absl::string_view field, DType dtype,
                         const std::vector<int64_t>& shape);

// A string the client sent (a session id, a model name), fit to quote in an
// error message: at most 64 bytes of it, C-escaped, then its length if it
// was longer. Error messages travel in gRPC trailers, whose size is limited.
std::string EchoClientText(absl::string_view text);

// ---- Sessions and their KV: CreateSession, AppendKV, ListSessions.

struct CreateSessionInput {
  std::string model;
  int32_t num_heads = 0;
  TensorInput sinks;  // optional f32 [layers, h_total] or [layers, num_heads]
  int32_t idle_ttl_seconds = 0;
};

struct CreateSessionResult {
  std::string session_id;
  int num_heads = 0;
  int padded_heads = 0;
};

struct LayerRowsInput {
  int32_t layer = 0;
  TensorInput swa_kv;         // [P, 512] bf16
  TensorInput compressed_kv;  // [M, 512] bf16
  int32_t first_compressed_row = 0;
};

struct AppendInput {
  std::string session_id;
  int32_t first_position = 0;
  int32_t num_positions = 0;
  std::vector<LayerRowsInput> layers;
};

struct AppendResult {
  int32_t next_position = 0;
  int64_t session_blocks = 0;
};

struct SessionSummary {
  std::string session_id;
  std::string model;
  int num_heads = 0;
  int32_t next_position = 0;
  int64_t blocks = 0;
  double idle_seconds = 0;
};

// ---- Attend messages and their answers.

struct SegmentInput {
  std::string session_id;
  int32_t position = 0;
  int32_t num_tokens = 0;
  int32_t first_compressed_row = 0;
  int32_t num_compressed_rows = 0;
};

struct AttendInput {
  uint64_t request_id = 0;
  int32_t layer = 0;
  std::vector<SegmentInput> segments;
  int32_t head_offset = 0;
  TensorInput q;              // [T, H, 512] bf16
  TensorInput kv;             // [T, 512] bf16
  TensorInput compressed_kv;  // [M, 512] bf16
  TensorInput topk;           // [T, K] int32
  bool return_lse = false;
  bool derotate_output = false;
  absl::Time arrival;         // when the service received it
};

// A message's time in each stage (mla_offload.v1.Timing), microseconds.
struct AttendTiming {
  double queue_us = 0;
  double prologue_us = 0;
  double decode_us = 0;
  double total_us = 0;
  int32_t batch_tokens = 0;
  double plan_us = 0;
  double upload_us = 0;
  double readback_us = 0;
};

// The answer to one AttendInput. On success `out` ([T, H, 512] bf16) and,
// when asked, `lse` ([T, H] fp32) point into memory kept alive by
// `keep_alive`, shared with the other requests of the same launch.
struct AttendResult {
  uint64_t request_id = 0;
  absl::Status status;
  int64_t num_tokens = 0;
  int num_heads = 0;
  const uint8_t* out = nullptr;
  const uint8_t* lse = nullptr;  // null when not asked
  std::shared_ptr<void> keep_alive;
  AttendTiming timing;

  int64_t out_bytes() const { return num_tokens * num_heads * kRowBytes; }
  int64_t lse_bytes() const { return lse == nullptr ? 0 : num_tokens * num_heads * 4; }
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_REQUESTS_H_
