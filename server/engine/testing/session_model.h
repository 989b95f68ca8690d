// The engine tests' own model of a session (Seq): the model and heads it was
// created with, its sinks as sent, the salt its KV rows are made from, and
// the next position of each layer as the test expects it. Each row is a pure
// function of the salt, the layer and the position or compressed row index,
// so a row can be sent again or looked up at any time, and two sessions of
// one salt hold the same rows. Also what an outside observer sees of the
// sessions (Snapshot) and the checks of it against the model. Not
// thread-safe.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_TESTING_SESSION_MODEL_H_
#define MLA_OFFLOAD_SERVER_ENGINE_TESTING_SESSION_MODEL_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/views.h"
#include "server/engine/requests.h"
#include "server/engine/testing/spec_models.h"

namespace mla::engine_testing {

// The tests' clock starts here, and their servers' positions stay below
// kMaxPosition.
inline const absl::Time kT0 = absl::FromUnixSeconds(1000000);
inline constexpr int32_t kMaxPosition = 4096;

enum class SinkMode { kNone, kWhole, kRank };  // none, [layers, h_total], [layers, H]

struct Seq {
  const SpecModel* spec = nullptr;
  std::string id;
  int heads = 0;
  std::vector<float> sinks;  // as sent; empty: none
  int sink_heads = 0;
  uint64_t salt = 0;
  std::vector<int32_t> next;  // per layer: the next position the test expects

  int padded() const { return SpecPadded(heads); }
  int ratio(int layer) const { return spec->ratios[layer]; }

  // The bf16 row of `layer` at SWA position `index`, or compressed row `index`.
  std::vector<uint16_t> Row(int layer, bool compressed, int32_t index) const;

  // Section 5 with the proto's sinks: the rank's slice of [layers, h_total],
  // or the shared [layers, H]; none: -inf.
  float Sink(int layer, int head_offset, int h) const;

  int32_t NextPosition() const;

  // Blocks the session must hold: a 4-block SWA ring per layer and 64-row
  // pages for the compressed rows of each layer.
  int64_t ExpectedBlocks() const;
};

// What makes a session: Engine::CreateSession or SessionTable::Create.
using CreateSessionFn = absl::FunctionRef<absl::StatusOr<CreateSessionResult>(
    const wire::CreateSessionRequestView& input)>;

// Sends CreateSession through `create`; the test's model of the session, or
// null (a test failure). The sinks are `sink_values` when given (of the
// shape `sinks` says), else random.
std::unique_ptr<Seq> CreateSeq(CreateSessionFn create, absl::string_view model, int heads,
                               SinkMode sinks, uint64_t salt, int idle_ttl_seconds = 0,
                               const std::vector<float>& sink_values = {});

// The sessions as ListSessions lists them and the pool's used blocks agree
// with the test's model of `seqs` (all the sessions there are).
void ExpectListed(const std::vector<SessionSummary>& list, int64_t used_blocks,
                  const std::vector<const Seq*>& seqs);

// What an outside observer sees of the sessions: the pool's used blocks and
// the session list.
struct Snapshot {
  int64_t used = 0;
  int64_t sessions = 0;
  std::vector<std::tuple<std::string, std::string, int, int32_t, int64_t, double>> list;

  bool operator==(const Snapshot& other) const {
    return used == other.used && sessions == other.sessions && list == other.list;
  }
};

std::ostream& operator<<(std::ostream& os, const Snapshot& s);

Snapshot Snap(int64_t used_blocks, int64_t sessions, const std::vector<SessionSummary>& list);

}  // namespace mla::engine_testing

#endif  // MLA_OFFLOAD_SERVER_ENGINE_TESTING_SESSION_MODEL_H_
