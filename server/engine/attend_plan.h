// The attend planner: may one Attend message run, and what does its launch
// need to know?
//
// Plan() checks a message against the sessions in the order a reader would
// (its segments and their sessions; layer, head range and the answer's size,
// or the size of the regions it is to be written into; the query; positions
// and compressed rows; the row tensors; the top-k),
// each failing with a status that names the field and what to change. Only
// when every check has passed does it take the compressed pages the
// message's new rows need, all at once (RESOURCE_EXHAUSTED takes none), so
// a message that fails changes nothing. A message touching a session layer
// that an earlier message of the same wave writes is deferred to the next
// wave (AttendPlan::defer), unchecked past that point: launch groups run in
// no particular order, so whatever would read those rows (the next step, or
// another rank repeating this one) must wait for them.
//
// After its launch, a plan is committed (its sessions advance) or its pages
// go back (ReturnPages). The plans of one wave that can share a kernel
// launch form a LaunchGroup.
//
// A plan points into its message and the sessions, which must outlive
// it; the planner points at the session table and the pool, which must
// outlive it. Not thread-safe: the engine thread owns it.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_ATTEND_PLAN_H_
#define MLA_OFFLOAD_SERVER_ENGINE_ATTEND_PLAN_H_

#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/model_profile.h"
#include "kernels/rope.h"
#include "kernels/thread_pool.h"
#include "server/engine/kv_pool.h"
#include "server/engine/page_reservation.h"
#include "server/engine/requests.h"
#include "server/engine/session.h"
#include "server/engine/session_table.h"

namespace mla {

// The server's bounds on one message (EngineOptions).
struct AttendLimits {
  int32_t max_position = 0;
  int32_t max_tokens_per_message = 0;
  int64_t max_answer_bytes = 0;  // 0: no limit
};

// One layer of one session: what a wave writes at most once.
struct SessionLayer {
  const Session* session = nullptr;
  int32_t layer = 0;

  friend bool operator==(const SessionLayer& a, const SessionLayer& b) {
    return a.session == b.session && a.layer == b.layer;
  }
  template <typename H>
  friend H AbslHashValue(H h, const SessionLayer& key) {
    return H::combine(std::move(h), key.session, key.layer);
  }
};

// The session layers the messages planned so far in a wave write.
using WrittenLayers = absl::flat_hash_set<SessionLayer>;

// One Attend message, checked, with what its launch needs to know.
struct AttendPlan {
  int index = 0;  // in the batch
  const wire::AttendRequestView* input = nullptr;
  const ModelProfile* profile = nullptr;
  std::vector<Session*> sessions;   // per segment
  std::vector<bool> inserts;        // per segment: write its rows (else another rank did)
  std::vector<int32_t> rows_after;  // per segment: compressed rows after this step
  PageReservation pages;            // given back if its launch fails
  int num_heads = 0;
  int padded_heads = 0;
  int64_t num_tokens = 0;
  int topk_width = 0;  // C4A: input->topk is [num_tokens, topk_width], checked
  bool defer = false;  // touches a session layer an earlier message of this wave writes
  // Where the answer is written instead of its response (same-host
  // regions, sizes checked); null: into the launch's answer memory.
  const AnswerRegions* answer_regions = nullptr;
};

class AttendPlanner {
 public:
  // `threads` (which must outlive the planner) check a large top-k.
  AttendPlanner(SessionTable& sessions, KvBlockPool& pool, const AttendLimits& limits,
                ThreadPool& threads)
      : sessions_(sessions), pool_(pool), limits_(limits), threads_(threads) {}

  // The plan of `received`, whose session layers it writes are added to
  // `written`; or why the message may not run, with nothing changed.
  absl::StatusOr<AttendPlan> Plan(const ReceivedAttend& received, WrittenLayers& written);
  // The plan's launch succeeded: its session layers advance past its tokens.
  static void Commit(const AttendPlan& plan, absl::Time now);
  // The plan's launch failed: the pages it took go back to the pool.
  void ReturnPages(AttendPlan& plan) { plan.pages.ReturnPages(pool_); }

 private:
  absl::Status CheckSegments(const wire::AttendRequestView& input, AttendPlan& plan);
  absl::Status CheckHeadsAndSize(const wire::AttendRequestView& input,
                                 const AttendPlan& plan) const;

  SessionTable& sessions_;
  KvBlockPool& pool_;
  AttendLimits limits_;
  ThreadPool& threads_;
};

// Plans that run in one prologue and one decode launch: the same model
// (eps and softmax scale), head counts, RoPE kind and output flags
// (de-rotation, and the output's format: bf16 and FP8 messages of one
// batch launch apart). Plans answered into regions and plans answered
// inline share launches.
struct LaunchGroup {
  std::vector<const AttendPlan*> plans;  // in batch order; tokens in this order
  int num_heads = 0;
  int padded_heads = 0;
  RopeKind rope = RopeKind::kPlain;
  bool derotate = false;
  bool fp8_output = false;
  int64_t num_tokens = 0;  // of every plan
};

// What the plans of one launch share.
struct LaunchGroupKey {
  absl::string_view model;
  int padded_heads = 0;
  int num_heads = 0;
  RopeKind rope = RopeKind::kPlain;
  bool derotate = false;
  bool fp8_output = false;

  friend bool operator<(const LaunchGroupKey& a, const LaunchGroupKey& b) {
    return std::tie(a.model, a.padded_heads, a.num_heads, a.rope, a.derotate, a.fp8_output) <
           std::tie(b.model, b.padded_heads, b.num_heads, b.rope, b.derotate, b.fp8_output);
  }
};

// The plans of a wave in launch groups, in the order of their keys.
std::vector<LaunchGroup> GroupForLaunch(absl::Span<const AttendPlan> plans);

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_ATTEND_PLAN_H_
