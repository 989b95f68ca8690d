#include "server/engine/append_plan.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/geometry.h"

namespace mla {
namespace {

// One layer's rows: SWA rows of every position, and the compressed rows
// the positions complete, continuing the layer's rows.
absl::Status CheckLayerRows(const wire::LayerRowsView& rows, const AppendPlan& plan) {
  const std::string field = absl::StrCat("layers[layer=", rows.layer, "]");
  const int32_t count = plan.end - plan.first;
  if (absl::Status status =
          wire::CheckTensor(rows.swa_kv, field + ".swa_kv", wire::DType::kBf16, {count, kHeadDim});
      !status.ok()) {
    return status;
  }
  const int ratio = plan.session->profile->compress_ratio(rows.layer);
  const LayerKv& state = plan.session->layers[rows.layer];
  const int32_t rows_after = plan.RowsAfter(rows.layer);
  const int32_t expected = rows_after - state.compressed_rows;
  // first_compressed_row matters only when the layer brings rows.
  if (ratio == 0 ? rows.compressed_kv.has_value() && rows.compressed_kv->size_bytes() > 0
                 : expected > 0 && rows.first_compressed_row != state.compressed_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".compressed_kv: ",
        ratio == 0 ? "an SWA-only layer has no compressed rows"
                   : absl::StrCat("rows must continue at row ", state.compressed_rows, ", not ",
                                  rows.first_compressed_row)));
  }
  if (ratio != 0 && (expected > 0 || rows.compressed_kv.has_value())) {
    if (absl::Status status = wire::CheckTensor(rows.compressed_kv, field + ".compressed_kv",
                                                wire::DType::kBf16, {expected, kHeadDim});
        !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          status.message(), "; positions up to ", plan.end - 1, " at compress ratio ", ratio,
          " make ", rows_after, " rows, of which ", state.compressed_rows, " exist"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AppendPlan> AppendPlanner::Plan(const wire::AppendKVRequestView& input,
                                               AdmitPages admit) {
  absl::StatusOr<Session*> session = sessions_.Find(input.session_id);
  if (!session.ok()) return session.status();
  if (absl::Status status = CheckPositions(input, **session); !status.ok()) return status;
  AppendPlan plan;
  plan.session = *session;
  plan.first = input.first_position;
  plan.end = input.first_position + input.num_positions;
  const int layers = plan.session->profile->num_attention_layers();
  plan.by_layer.assign(layers, nullptr);
  for (const wire::LayerRowsView& rows : input.layers) {
    if (rows.layer < 0 || rows.layer >= layers || plan.by_layer[rows.layer] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("layers[layer=", rows.layer,
                                                     "]: each layer 0..", layers - 1,
                                                     " must appear exactly once"));
    }
    plan.by_layer[rows.layer] = &rows;
    if (absl::Status status = CheckLayerRows(rows, plan); !status.ok()) return status;
    plan.pages.Need(plan.session->layers[rows.layer], plan.RowsAfter(rows.layer));
  }
  if (absl::Status status = admit(plan.pages.missing()); !status.ok()) return status;
  if (absl::Status status = plan.pages.Take(pool_); !status.ok()) return status;
  return plan;
}

// Positions first..end-1 exist on this server and continue every layer;
// the request has an entry for every layer.
absl::Status AppendPlanner::CheckPositions(const wire::AppendKVRequestView& input,
                                           const Session& session) const {
  const ModelProfile& profile = *session.profile;
  const int layers = profile.num_attention_layers();
  const int32_t first = input.first_position;
  const int32_t count = input.num_positions;
  if (count < 1 || first < 0 || int64_t{first} + count > max_position_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_positions/first_position: positions ", first, "..", int64_t{first} + count - 1,
        " must be non-empty and below the server's max position ", max_position_));
  }
  for (int layer = 0; layer < layers; ++layer) {
    if (session.layers[layer].next_position != first) {
      return absl::FailedPreconditionError(absl::StrCat(
          "first_position: layer ", layer, " of session ", session.id, " expects position ",
          session.layers[layer].next_position, " next, not ", first,
          " (AppendKV continues every layer at once)"));
    }
  }
  if (static_cast<int>(input.layers.size()) != layers) {
    return absl::InvalidArgumentError(absl::StrCat("layers: ", profile.name, " needs ", layers,
                                                   " entries (one per attention layer), got ",
                                                   input.layers.size()));
  }
  return absl::OkStatus();
}

AppendResult AppendPlanner::Commit(const AppendPlan& plan, absl::Time now) {
  Session& session = *plan.session;
  for (int layer = 0; layer < static_cast<int>(session.layers.size()); ++layer) {
    session.layers[layer].next_position = plan.end;
    if (session.profile->compress_ratio(layer) != 0) {
      session.layers[layer].compressed_rows = plan.RowsAfter(layer);
    }
  }
  session.last_used = now;
  return AppendResult{plan.end, session.blocks()};
}

}  // namespace mla
