#include "server/engine/session_table.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/head_padding.h"

namespace mla {
namespace {

std::string NewSessionId() {
  // 128 bits from the OS entropy source: ids are unguessable, so knowing an
  // id is what entitles a caller to a session.
  std::random_device entropy;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&id, "%08x", entropy());
  return id;
}

// The session's sink logits, [layers, sink_heads], from the request's
// optional sinks tensor: [layers, h_total] for every head of the model, or
// [layers, num_heads] for one slice that every rank shares.
absl::Status ReadSinks(const wire::CreateSessionRequestView& input, const ModelProfile& profile,
                       Session& session) {
  if (!input.sinks.has_value()) return absl::OkStatus();
  const int layers = profile.num_attention_layers();
  const bool whole =
      wire::CheckTensor(input.sinks, "sinks", wire::DType::kF32, {layers, profile.num_query_heads})
          .ok();
  if (!whole) {
    if (absl::Status status =
            wire::CheckTensor(input.sinks, "sinks", wire::DType::kF32, {layers, input.num_heads});
        !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(status.message(), " (or [", layers, ", ", profile.num_query_heads,
                       "] for every head of the model)"));
    }
  }
  const int sink_heads = whole ? profile.num_query_heads : input.num_heads;
  std::vector<float> sinks(static_cast<size_t>(layers) * sink_heads);
  input.sinks->CopyTo(sinks.data());
  for (size_t i = 0; i < sinks.size(); ++i) {
    // -inf is "no sink"; NaN or +inf would make every output of the head NaN or 0.
    if (std::isnan(sinks[i]) || sinks[i] == std::numeric_limits<float>::infinity()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sinks[", i / sink_heads, "][", i % sink_heads, "]: ", sinks[i],
          " is not a sink logit; send a finite value, or -inf for no sink"));
    }
  }
  session.sink_heads = sink_heads;
  session.sinks = std::move(sinks);
  return absl::OkStatus();
}

}  // namespace

absl::Status InSegment(size_t s, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("segments[", s, "]: ", status.message()));
}

absl::Status SessionNotFound(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat(
      "session '", EchoClientText(id), "' does not exist (closed, expired after its idle TTL, or never "
      "created on this server); create a session and append its KV again"));
}

SessionTable::SessionTable(KvBlockPool& pool, std::vector<const ModelProfile*> models,
                           absl::Duration default_idle_ttl, absl::Duration max_idle_ttl)
    : pool_(pool),
      models_(std::move(models)),
      default_idle_ttl_(std::min(default_idle_ttl, max_idle_ttl)),
      max_idle_ttl_(max_idle_ttl) {}

absl::StatusOr<const ModelProfile*> SessionTable::FindModel(const std::string& name) const {
  std::vector<std::string> served;
  for (const ModelProfile* candidate : models_) {
    if (candidate->name == name) return candidate;
    served.push_back(candidate->name);
  }
  return absl::InvalidArgumentError(absl::StrCat("model: '", EchoClientText(name),
                                                 "' is not served here; this server serves ",
                                                 absl::StrJoin(served, ", ")));
}

absl::StatusOr<CreateSessionResult> SessionTable::Create(
    const wire::CreateSessionRequestView& input, absl::Time now) {
  absl::StatusOr<const ModelProfile*> model = FindModel(input.model);
  if (!model.ok()) return model.status();
  const ModelProfile& profile = **model;
  if (input.num_heads < 1 || input.num_heads > profile.num_query_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_heads: ", input.num_heads, " is outside 1..", profile.num_query_heads,
                     " (", profile.name, " has ", profile.num_query_heads,
                     " query heads; a rank sends h_total / TP of them)"));
  }
  absl::StatusOr<int> padded = PaddedHeadCount(input.num_heads);
  if (!padded.ok()) return padded.status();
  if (input.idle_ttl_seconds < 0) {
    return absl::InvalidArgumentError("idle_ttl_seconds: must be 0 (server default) or positive");
  }
  auto session = std::make_unique<Session>();
  if (absl::Status status = ReadSinks(input, profile, *session); !status.ok()) return status;
  const int layers = profile.num_attention_layers();
  absl::StatusOr<std::vector<int32_t>> blocks = pool_.Allocate(int64_t{layers} * kSwaRingBlocks);
  if (!blocks.ok()) return blocks.status();

  session->id = NewSessionId();
  session->profile = &profile;
  session->num_heads = input.num_heads;
  session->padded_heads = *padded;
  session->idle_ttl = input.idle_ttl_seconds > 0
                          ? std::min(absl::Seconds(input.idle_ttl_seconds), max_idle_ttl_)
                          : default_idle_ttl_;
  session->last_used = now;
  session->layers.resize(layers);
  for (int layer = 0; layer < layers; ++layer) {
    session->layers[layer].swa_blocks.assign(blocks->begin() + layer * kSwaRingBlocks,
                                             blocks->begin() + (layer + 1) * kSwaRingBlocks);
  }
  CreateSessionResult result{session->id, session->num_heads, session->padded_heads,
                             static_cast<int32_t>(absl::ToInt64Seconds(session->idle_ttl))};
  sessions_[session->id] = std::move(session);
  return result;
}

absl::StatusOr<Session*> SessionTable::Find(const std::string& id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return SessionNotFound(id);
  return it->second.get();
}

absl::StatusOr<int64_t> SessionTable::Close(const std::string& id) {
  absl::StatusOr<Session*> session = Find(id);
  if (!session.ok()) return session.status();
  const std::vector<int32_t> blocks = (*session)->AllBlocks();
  pool_.Free(blocks);
  sessions_.erase(id);
  return static_cast<int64_t>(blocks.size());
}

std::vector<SessionSummary> SessionTable::List(absl::Time now) const {
  std::vector<SessionSummary> list;
  for (const auto& [id, session] : sessions_) {
    list.push_back({id, session->profile->name, session->num_heads, session->next_position(),
                    session->blocks(), absl::ToDoubleSeconds(now - session->last_used)});
  }
  std::sort(list.begin(), list.end(),
            [](const SessionSummary& a, const SessionSummary& b) { return a.session_id < b.session_id; });
  return list;
}

bool SessionTable::AnyIdle(absl::Time now) const {
  for (const auto& [id, session] : sessions_) {
    if (now - session->last_used > session->idle_ttl) return true;
  }
  return false;
}

std::vector<std::string> SessionTable::ExpireIdle(absl::Time now) {
  std::vector<std::string> expired;
  for (const auto& [id, session] : sessions_) {
    if (now - session->last_used > session->idle_ttl) expired.push_back(id);
  }
  for (const std::string& id : expired) Close(id).IgnoreError();
  return expired;
}

}  // namespace mla
