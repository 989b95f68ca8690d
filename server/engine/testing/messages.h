// Attend messages and AppendKV requests built from the tests' model of
// their sessions (session_model.h): the rows a session holds, or with
// `garbage` rows that are not the session's (a rejected request that wrote
// or counted them would show in later outputs), random queries and a C4A
// top-k of valid rows, duplicates and -1 pads. Every tensor points into the
// Message or AppendRequest that holds its data and is cut into pieces like
// a parsed message's; changing a value there changes what is sent. Not
// thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_MESSAGES_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_MESSAGES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/views.h"
#include "server/engine/requests.h"
#include "server/engine/testing/session_model.h"

namespace mla::engine_testing {

// ---- Attend messages.

struct SegmentSpec {
  Seq* seq = nullptr;
  int32_t position = 0;
  int32_t tokens = 1;
  // Brings the compressed rows its positions complete (the first rank must;
  // a rank repeating the step may send them again or not).
  bool rows = true;
};

struct MessageOptions {
  uint64_t seed = 1;
  int head_offset = 0;
  bool derotate = false;
  bool lse = true;
  bool kv = true;        // send the tokens' SWA rows
  uint64_t garbage = 0;  // nonzero: kv and compressed rows are not the session's
  int topk_width = 24;   // C4A layers; 0 sends no top-k
  bool fp8 = false;      // asks for the FP8 output
};

struct Message {
  wire::AttendRequestView input;
  absl::Time arrival = kT0;
  std::vector<uint16_t> q, kv, compressed;
  std::vector<int32_t> topk;
  int topk_width = 0;
  int heads = 0;
  std::vector<Seq*> token_seq;
  std::vector<int32_t> token_position;

  Message() = default;
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
  int64_t tokens() const { return static_cast<int64_t>(token_position.size()); }
};

// A message of `layer` over `segments` (all of one model and head count).
std::unique_ptr<Message> Build(int layer, const std::vector<SegmentSpec>& segments,
                               const MessageOptions& options);

// Messages of the refusal tables: `layer` at position `p` of `seq`, on heads
// 60.. (the last of a 4-head V4-Flash rank, where whole-model sinks end).
// The correct one de-rotates and brings the session's rows; the garbage one
// brings rows that are not the session's, so that a refused message that
// wrote or counted them would show in later outputs.
inline constexpr uint64_t kGarbageRows = 4242;  // the garbage seed of GarbageMessage
std::unique_ptr<Message> CorrectMessage(Seq& seq, int layer, int32_t p, uint64_t seed);
std::unique_ptr<Message> GarbageMessage(Seq& seq, int layer, int32_t p, uint64_t seed,
                                        int32_t tokens = 1);

// A message that must be refused: with `code`, and `field` in the message.
struct BadCase {
  std::string name;
  std::unique_ptr<Message> message;
  absl::StatusCode code;
  std::string field;
};

// `m` with `change` made to it.
template <typename Change>
std::unique_ptr<Message> With(std::unique_ptr<Message> m, Change change) {
  change(*m);
  return m;
}

// Records in the test's model what a successful message advanced.
void Advance(const Message& m);

// ---- AppendKV requests.

struct AppendRequest {
  wire::AppendKVRequestView input;
  std::vector<std::vector<uint16_t>> swa;         // per entry of input.layers
  std::vector<std::vector<uint16_t>> compressed;  // per entry of input.layers
};

// Rows of positions first..first+count-1 of every layer, layers in a shuffled
// order, with the compressed rows those positions complete.
std::unique_ptr<AppendRequest> BuildAppend(const Seq& seq, int32_t first, int32_t count,
                                           uint64_t seed);

// An edit of an AppendKV request of a V4-Flash session: garbage
// first_compressed_rows on the layers whose compress ratio is in `ratios`.
std::function<void(AppendRequest&)> GarbageFirstCompressedRows(std::vector<int> ratios);

// What runs an AppendKV: Engine::AppendKV, or the append planner's plan and
// commit.
using AppendFn =
    absl::FunctionRef<absl::StatusOr<AppendResult>(const wire::AppendKVRequestView& input)>;

// Appends positions first..first+count-1 of every layer through `append`,
// the request edited by `change` if given; on success updates the model
// and expects the result to agree with it.
absl::Status AppendSeq(AppendFn append, Seq& seq, int32_t first, int32_t count,
                       const std::function<void(AppendRequest&)>& change = nullptr);

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_MESSAGES_H_
