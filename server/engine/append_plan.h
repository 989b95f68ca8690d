// The append planner: may one AppendKV request run, and what does its
// launch write?
//
// Plan() checks the request against its session (positions continue every
// layer at once and stay below the server's max position; each layer appears
// once, with its SWA rows and exactly the compressed rows the new positions
// complete), each failing with a status that names the field and what to
// change. Only when every check has passed does it take the compressed pages
// the new rows need, all at once (RESOURCE_EXHAUSTED takes none), so a
// request that fails changes nothing. After the launch the plan is committed
// (every layer advances) or its pages go back (ReturnPages).
//
// A plan points into its request and its session, which must outlive
// it; the planner points at the session table and the pool, which must
// outlive it. Not thread-safe: the engine thread owns it.
#ifndef MLA_OFFLOAD_SERVER_ENGINE_APPEND_PLAN_H_
#define MLA_OFFLOAD_SERVER_ENGINE_APPEND_PLAN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/views.h"
#include "server/engine/kv_pool.h"
#include "server/engine/page_reservation.h"
#include "server/engine/requests.h"
#include "server/engine/session.h"
#include "server/engine/session_table.h"

namespace mla {

// One AppendKV request, checked: positions first..end-1 of every layer.
struct AppendPlan {
  Session* session = nullptr;
  int32_t first = 0;
  int32_t end = 0;
  std::vector<const wire::LayerRowsView*> by_layer;  // the request's rows of each layer
  PageReservation pages;                             // given back if its launch fails

  // Compressed rows of `layer` once the positions are in.
  int32_t RowsAfter(int layer) const {
    const int ratio = session->profile->compress_ratio(layer);
    return ratio == 0 ? 0 : end / ratio;
  }
  // The first position whose SWA row is written: only the last ring's worth
  // of rows can ever be attended again.
  int32_t SwaFrom() const { return std::max(first, end - kSwaRingRows); }
};

// May an append take `new_pages` more compressed pages (a tenant's KV block
// limit)? Its error is the append's, with nothing changed.
using AdmitPages = absl::FunctionRef<absl::Status(int64_t new_pages)>;
inline absl::Status AdmitAnyPages(int64_t) { return absl::OkStatus(); }

class AppendPlanner {
 public:
  AppendPlanner(SessionTable& sessions, KvBlockPool& pool, int32_t max_position)
      : sessions_(sessions), pool_(pool), max_position_(max_position) {}

  // The plan of `input`, or why it may not run, with nothing changed;
  // `admit` is asked about the pages the plan adds (those its layers miss
  // for their new rows) after every check and before any is taken.
  absl::StatusOr<AppendPlan> Plan(const wire::AppendKVRequestView& input,
                                  AdmitPages admit = AdmitAnyPages);
  // The plan's launch succeeded: every layer of its session advances.
  static AppendResult Commit(const AppendPlan& plan, absl::Time now);
  // The plan's launch failed: the pages it took go back to the pool.
  void ReturnPages(AppendPlan& plan) { plan.pages.ReturnPages(pool_); }

 private:
  absl::Status CheckPositions(const wire::AppendKVRequestView& input, const Session& session) const;

  SessionTable& sessions_;
  KvBlockPool& pool_;
  int32_t max_position_;
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_ENGINE_APPEND_PLAN_H_
