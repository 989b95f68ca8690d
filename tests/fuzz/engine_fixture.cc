#include "tests/fuzz/engine_fixture.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "server/engine/session.h"
#include "tests/support/test_rows.h"

namespace mla::fuzz {
namespace {

const ModelProfile& ProfileOf(const FixtureSession& session) {
  return **FindModelProfile(session.model);
}

// Blocks a session holds at the start: its SWA rings and the pages of its
// prompt's compressed rows.
int64_t StartingBlocks(const FixtureSession& session) {
  const ModelProfile& profile = ProfileOf(session);
  int64_t blocks = 0;
  for (int layer = 0; layer < profile.num_attention_layers(); ++layer) {
    const int ratio = profile.compress_ratio(layer);
    blocks += kSwaRingBlocks + (ratio == 0 ? 0 : PagesFor(session.prompt / ratio));
  }
  return blocks;
}

// A view of `data`, which outlives the request it goes into.
template <typename T>
wire::TensorView TensorOf(wire::DType dtype, std::vector<int64_t> shape,
                          const std::vector<T>& data) {
  return wire::MakeTensorView(dtype, std::move(shape), data.data(), data.size() * sizeof(T),
                              nullptr);
}

}  // namespace

EngineFixture::SessionData EngineFixture::DataOf(const FixtureSession& session) {
  const ModelProfile& profile = ProfileOf(session);
  const int layers = profile.num_attention_layers();
  SessionData data;
  if (session.sinks != Sinks::kNone) {
    const int heads =
        session.sinks == Sinks::kWholeModel ? profile.num_query_heads : session.num_heads;
    data.sinks.resize(static_cast<size_t>(layers) * heads);
    for (size_t i = 0; i < data.sinks.size(); ++i) {
      data.sinks[i] = 0.25f * static_cast<float>(i % 13) - 1.5f;
    }
  }
  if (session.prompt == 0) return data;
  for (int layer = 0; layer < layers; ++layer) {
    const int ratio = profile.compress_ratio(layer);
    data.swa_rows.push_back(TestRows(2 * layer, session.prompt));
    data.compressed_rows.push_back(
        TestRows(2 * layer + 1, ratio == 0 ? 0 : session.prompt / ratio));
  }
  return data;
}

absl::StatusOr<std::unique_ptr<EngineFixture>> EngineFixture::Create() {
  EngineOptions options;
  options.max_position = kMaxPosition;
  options.max_tokens_per_message = kMaxTokensPerMessage;
  options.kv_blocks = kSpareBlocks;
  for (const FixtureSession& session : kFixtureSessions) {
    options.kv_blocks += StartingBlocks(session);
  }
  for (const ModelProfile& profile : BuiltInProfiles()) options.models.push_back(&profile);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::make_unique<CpuBackend>(2), options);
  if (!engine.ok()) return engine.status();
  std::unique_ptr<EngineFixture> fixture(new EngineFixture(*std::move(engine)));
  for (const FixtureSession& session : kFixtureSessions) {
    fixture->data_.push_back(DataOf(session));
  }
  for (size_t i = 0; i < fixture->data_.size(); ++i) {
    absl::StatusOr<std::string> id = fixture->Start(i);
    if (!id.ok()) return id.status();
    fixture->ids_.push_back(*std::move(id));
  }
  return fixture;
}

EngineFixture::EngineFixture(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {}

std::string EngineFixture::Resolve(absl::string_view name) const {
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (kFixtureSessions[i].alias == name) return ids_[i];
  }
  return std::string(name);
}

absl::Status EngineFixture::Restart(const std::string& id) {
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (ids_[i] != id) continue;
    if (absl::Status status = engine_->CloseSession(id).status(); !status.ok()) return status;
    absl::StatusOr<std::string> restarted = Start(i);
    if (!restarted.ok()) return restarted.status();
    ids_[i] = *std::move(restarted);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EngineFixture::Start(size_t index) {
  const FixtureSession& session = kFixtureSessions[index];
  const ModelProfile& profile = ProfileOf(session);
  const int layers = profile.num_attention_layers();
  const SessionData& data = data_[index];
  wire::CreateSessionRequestView create;
  create.model = std::string(session.model);
  create.num_heads = session.num_heads;
  if (session.sinks != Sinks::kNone) {
    create.sinks = TensorOf(wire::DType::kF32,
                            {layers, static_cast<int64_t>(data.sinks.size()) / layers}, data.sinks);
  }
  const absl::Time now = absl::Now();
  absl::StatusOr<CreateSessionResult> created = engine_->CreateSession(create, now);
  if (!created.ok()) return created.status();
  if (session.prompt == 0) return created->session_id;

  wire::AppendKVRequestView append;
  append.session_id = created->session_id;
  append.num_positions = session.prompt;
  for (int layer = 0; layer < layers; ++layer) {
    const int ratio = profile.compress_ratio(layer);
    wire::LayerRowsView rows;
    rows.layer = layer;
    rows.swa_kv = TensorOf(wire::DType::kBf16, {session.prompt, kHeadDim}, data.swa_rows[layer]);
    if (ratio != 0) {
      rows.compressed_kv = TensorOf(wire::DType::kBf16, {session.prompt / ratio, kHeadDim},
                                    data.compressed_rows[layer]);
    }
    append.layers.push_back(std::move(rows));
  }
  if (absl::Status status = engine_->AppendKV(append, now).status(); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat("fixture session ", session.alias,
                                                    ": AppendKV failed: ", status.message()));
  }
  return created->session_id;
}

}  // namespace mla::fuzz
