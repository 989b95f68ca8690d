// libFuzzer target: one Attend message, as the server receives it, through
// the engine's validation and, when it passes, the CPU backend's kernels.
// Mutations are half structure-aware (attend_mutator.h).
//
// The input is an AttendRequest in wire format. It is parsed with the codec
// and handed to the engine as the service does (a ReceivedAttend of
// server/engine/requests.h), except that segments name sessions by their alias in
// tests/fuzz/engine_fixture.h, and run as a batch of one through
// Engine::Attend. Besides the sanitizers, it holds the engine to its
// contract: one answer with the message's request id; on success an output
// of the message's tokens and the session's heads in the format asked (FP8
// with its scales, or bf16), every byte of it readable; on failure the
// sessions and the pool exactly as they were.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "proto/attend_codec.h"
#include "server/engine/engine.h"
#include "server/engine/requests.h"
#include "tests/fuzz/attend_mutator.h"
#include "tests/fuzz/engine_fixture.h"

namespace mla::fuzz {
namespace {

EngineFixture* fixture = nullptr;
// MLA_FUZZ_VERBOSE=1 prints the engine's answer to each input.
bool verbose = false;

void Require(bool holds, absl::string_view what, const absl::Status& status) {
  if (holds) return;
  std::fprintf(stderr, "engine_fuzzer: %.*s (status: %s)\n", static_cast<int>(what.size()),
               what.data(), status.ToString().c_str());
  std::abort();
}

// What a failed Attend must leave as it was.
struct EngineState {
  int64_t blocks_used;
  std::vector<std::tuple<std::string, int32_t, int64_t>> sessions;  // id, next position, blocks

  bool operator==(const EngineState& other) const {
    return blocks_used == other.blocks_used && sessions == other.sessions;
  }
};

EngineState StateOf(const Engine& engine) {
  EngineState state{engine.kv_blocks_used(), {}};
  for (const SessionSummary& session : engine.ListSessions(absl::Now())) {
    state.sessions.emplace_back(session.session_id, session.next_position, session.blocks);
  }
  return state;
}

// Reads every byte, so that ASan reports an answer shorter than it claims;
// the volatile store keeps the compiler from dropping the reads.
volatile uint8_t checksum;

uint8_t Checksum(const uint8_t* data, int64_t bytes) {
  uint8_t sum = 0;
  for (int64_t i = 0; i < bytes; ++i) sum ^= data[i];
  return sum;
}

void Run(const uint8_t* data, size_t size) {
  // One slice over the input, as gRPC hands over a message read in one
  // piece; gRPC has already refused messages over the server's size limit.
  grpc::Slice slice(data, size, grpc::Slice::STATIC_SLICE);
  const grpc::ByteBuffer received(&slice, 1);
  absl::StatusOr<wire::AttendRequestView> view =
      wire::ParseAttendRequest(received, std::numeric_limits<size_t>::max());
  if (!view.ok()) return;
  for (wire::SegmentView& segment : view->segments) {
    segment.session_id = fixture->Resolve(segment.session_id);
  }
  const ReceivedAttend received_attend{*std::move(view), absl::Now()};
  const wire::AttendRequestView* const input = &received_attend.request;

  Engine& engine = fixture->engine();
  const EngineState before = StateOf(engine);
  const std::vector<AttendResult> results = engine.Attend({&received_attend}, absl::Now());
  Require(results.size() == 1, "Attend answered a batch of one with another count",
          absl::OkStatus());
  const AttendResult& result = results[0];
  if (verbose) std::fprintf(stderr, "engine_fuzzer: %s\n", result.status.ToString().c_str());
  Require(result.request_id == input->request_id, "the answer has another request id",
          result.status);
  if (!result.status.ok()) {
    Require(StateOf(engine) == before, "a failed Attend changed sessions or the pool",
            result.status);
    return;
  }
  int64_t tokens = 0;
  for (const wire::SegmentView& segment : input->segments) tokens += segment.num_tokens;
  Require(result.num_tokens == tokens && result.num_heads == input->q->shape[1],
          "the output's tokens or heads are not the message's", result.status);
  Require(result.out != nullptr && (result.lse != nullptr) == input->return_lse,
          "the output or lse is missing, or lse came unasked", result.status);
  Require(result.fp8_output == input->fp8_output &&
              (result.out_scales != nullptr) == input->fp8_output,
          "the output's format is not the one asked, or its scales are missing", result.status);
  checksum = Checksum(result.out, result.out_bytes()) ^
             Checksum(result.out_scales, result.out_scales_bytes()) ^
             Checksum(result.lse, result.lse_bytes());
  for (const wire::SegmentView& segment : input->segments) {
    const absl::Status restarted = fixture->Restart(segment.session_id);
    Require(restarted.ok(), "the fixture failed to restart a session", restarted);
  }
}

}  // namespace
}  // namespace mla::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  absl::StatusOr<std::unique_ptr<mla::fuzz::EngineFixture>> fixture =
      mla::fuzz::EngineFixture::Create();
  if (!fixture.ok()) {
    std::fprintf(stderr, "engine_fuzzer: no fixture: %s\n", fixture.status().ToString().c_str());
    std::abort();
  }
  mla::fuzz::fixture = fixture->release();
  mla::fuzz::verbose = std::getenv("MLA_FUZZ_VERBOSE") != nullptr;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::Run(data, size);
  return 0;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Half the mutations edit the message's fields (attend_mutator.h), half are
// libFuzzer's byte mutations, which reach what no field edit can: malformed
// wire format, tensor values.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  if (seed % 2 == 0) {
    const size_t mutated = mla::fuzz::MutateAttendRequest(data, size, max_size, seed / 2);
    if (mutated > 0) return mutated;
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

// Any UBSan report ends the run, also without tools/fuzz.sh's UBSAN_OPTIONS.
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }
