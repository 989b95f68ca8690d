// The engine that the engine fuzzer runs its inputs on, and the sessions
// those inputs may name: an Engine on the CPU backend (two threads) serving
// both built-in models, a KV pool just large enough for the sessions below
// plus kSpareBlocks, and the sessions of kFixtureSessions in their starting
// state.
//
// Session ids are random (the engine makes them), so a fuzz input names a
// session by its alias; Resolve turns an alias into the id it has now. An
// input that moved a session on (a successful Attend) is followed by Restart
// of that session, so every input starts from the same state and a
// reproducer replays alone. make_seeds writes its messages against the same
// table.
//
// Errors: Create and Restart return the engine's status (they fail only if
// the fixture itself is wrong). Not thread-safe, like the engine.
#ifndef MLA_OFFLOAD_TESTS_FUZZ_ENGINE_FIXTURE_H_
#define MLA_OFFLOAD_TESTS_FUZZ_ENGINE_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/engine/engine.h"

namespace mla::fuzz {

enum class Sinks {
  kNone,
  kWholeModel,  // [num_attention_layers, h_total]: a rank's slice by head_offset
  kPerRank,     // [num_attention_layers, num_heads]
};

struct FixtureSession {
  absl::string_view alias;
  absl::string_view model;
  int num_heads;
  Sinks sinks;
  // Positions 0..prompt-1 arrive by AppendKV at the start; every layer's
  // next position is then `prompt`.
  int32_t prompt;
};

// V4-Flash has 44 attention layers: 0, 1 SWA-only; 2, 4, ... 42 C4A;
// 3, 5, ... 41 C128A; 43 SWA-only. A prompt of 131 positions leaves 32
// compressed rows in each C4A layer and 1 in each C128A layer, and the next
// step (position 131) brings C4A row 32.
inline constexpr FixtureSession kFixtureSessions[] = {
    {"flash-sinks", "deepseek-v4-flash", 16, Sinks::kWholeModel, 0},
    {"flash", "deepseek-v4-flash", 16, Sinks::kNone, 0},
    {"flash-prompt", "deepseek-v4-flash", 16, Sinks::kWholeModel, 131},
    {"flash-h4", "deepseek-v4-flash", 4, Sinks::kPerRank, 0},
    {"pro-sinks", "deepseek-v4-pro", 16, Sinks::kWholeModel, 0},
};

// Blocks of the pool beyond what the sessions take at the start: two
// compressed pages, so that a message that needs three meets
// RESOURCE_EXHAUSTED.
inline constexpr int64_t kSpareBlocks = 2;

// Engine limits, lower than the server's defaults so that inputs can reach
// them: positions below 4096, 256 tokens a message.
inline constexpr int32_t kMaxPosition = 4096;
inline constexpr int32_t kMaxTokensPerMessage = 256;

class EngineFixture {
 public:
  static absl::StatusOr<std::unique_ptr<EngineFixture>> Create();

  Engine& engine() { return *engine_; }

  // The id of the session called `name` in kFixtureSessions; `name` itself
  // when it is no alias (then the engine answers as to an unknown id).
  std::string Resolve(absl::string_view name) const;

  // Closes the session with this id and makes it again in its starting
  // state under the same alias. An id of no fixture session is ignored.
  absl::Status Restart(const std::string& id);

 private:
  // What a session is made from, made once: its sinks and its prompt's rows
  // per layer.
  struct SessionData {
    std::vector<float> sinks;
    std::vector<std::vector<uint16_t>> swa_rows;
    std::vector<std::vector<uint16_t>> compressed_rows;
  };
  static SessionData DataOf(const FixtureSession& session);

  explicit EngineFixture(std::unique_ptr<Engine> engine);
  // Makes kFixtureSessions[index] in its starting state; returns its id.
  absl::StatusOr<std::string> Start(size_t index);

  std::unique_ptr<Engine> engine_;
  // Per entry of kFixtureSessions:
  std::vector<SessionData> data_;
  std::vector<std::string> ids_;
};

}  // namespace mla::fuzz

#endif  // MLA_OFFLOAD_TESTS_FUZZ_ENGINE_FIXTURE_H_
