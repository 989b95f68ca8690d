// What the engine answers, free of gRPC: results and summaries,
// which the service turns into wire messages. The engine takes its requests
// as the wire views of proto/views.h (tensor bytes stay where gRPC put them);
// an Attend message travels with its arrival time (ReceivedAttend).
#ifndef MLA_OFFLOAD_SERVER_ENGINE_REQUESTS_H_
#define MLA_OFFLOAD_SERVER_ENGINE_REQUESTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kernels/geometry.h"
#include "proto/views.h"

namespace mla {

// A string the client sent (a session id, a model name), fit to quote in an
// error message: at most 64 bytes of it, C-escaped, then its length if it
// was longer. Error messages travel in gRPC trailers, whose size is limited.
std::string EchoClientText(absl::string_view text);

// ---- Sessions and their KV: CreateSession, AppendKV, ListSessions.

struct CreateSessionResult {
  std::string session_id;
  int num_heads = 0;
  int padded_heads = 0;
  int32_t idle_ttl_seconds = 0;  // the idle TTL the session got
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

// Bytes of a same-host region (server/regions/region_registry.h) that a reference
// named, mapped while this lives: what a tensor reference resolves to, and
// where an answer can be written. `device`: the bytes are device memory of
// the compute backend (a CUDA IPC region), which the host cannot touch.
struct RegionSlice {
  std::shared_ptr<const void> mapping;
  uint8_t* data = nullptr;
  int64_t bytes = 0;
  bool device = false;
};

// Where an Attend message's answer goes instead of into its response: `out`
// for out ([T, H, 512] bf16, or with fp8_output e4m3fn), with fp8_output
// `scales` for out_scales ([T, H, 4] UE8M0; else empty) and, when the
// message asks for lse, `lse` for it ([T, H] f32; else empty). Their sizes
// are the planner's to check.
struct AnswerRegions {
  RegionSlice out;
  RegionSlice lse;
  RegionSlice scales;
};

// Asked, when set, about the KV pages an Attend message's new compressed
// rows would add (`new_pages`, more than 0) before any is taken, with the
// sessions as they are (`sessions`): the service's per-tenant KV block
// limit. An error refuses the message, which then changes nothing.
using AdmitAttendPages = std::function<absl::Status(
    int64_t new_pages, absl::FunctionRef<std::vector<SessionSummary>()> sessions)>;

// One Attend message as the engine runs it: the parsed wire message, whose
// tensors point into the received slices (or into the client's regions)
// that they keep alive, when the service received it (on the scheduler's
// clock), and where its answer goes when not into the response.
struct ReceivedAttend {
  wire::AttendRequestView request;
  absl::Time arrival;
  std::optional<AnswerRegions> answer_regions;
  AdmitAttendPages admit_pages;  // null: any
};

// The answer to one Attend message. On success `out` ([T, H, 512] bf16, or
// with fp8_output e4m3fn and then `out_scales`, [T, H, 4] UE8M0) and, when
// asked, `lse` ([T, H] fp32) point into memory kept alive by `keep_alive`,
// shared with the other requests of the same launch, or into the message's
// answer regions, which the message keeps alive.
struct AttendResult {
  uint64_t request_id = 0;
  absl::Status status;
  int64_t num_tokens = 0;
  int num_heads = 0;
  bool fp8_output = false;
  const uint8_t* out = nullptr;
  const uint8_t* out_scales = nullptr;  // null without fp8_output
  const uint8_t* lse = nullptr;         // null when not asked
  std::shared_ptr<void> keep_alive;
  wire::TimingView timing;  // microseconds in each stage

  int64_t out_bytes() const {
    return num_tokens * num_heads * (fp8_output ? kFp8RowBytes : kRowBytes);
  }
  int64_t out_scales_bytes() const {
    return out_scales == nullptr ? 0 : num_tokens * num_heads * kFp8ScaleRowBytes;
  }
  int64_t lse_bytes() const { return lse == nullptr ? 0 : num_tokens * num_heads * 4; }
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_REQUESTS_H_
