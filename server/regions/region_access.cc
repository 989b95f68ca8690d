#include "server/regions/region_access.h"

#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "proto/addresses.h"

namespace mla {
namespace {

absl::Status CheckClientId(absl::string_view id) {
  bool ok = id.size() >= 16 && id.size() <= 64;
  for (char c : id) {
    ok = ok && ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '_');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      wire::kClientIdMetadata, " metadata: ", EchoClientText(id),
      " is not 16 to 64 characters of A-Z, a-z, 0-9, \"-\" and \"_\"; send a random one, the "
      "same in every call of this client"));
}

// The kernels read and write device memory 16 bytes at a time: a
// reference into a CUDA IPC region must start on such a boundary.
constexpr int64_t kDeviceAlignment = 16;

absl::Status CheckDeviceAlignment(const RegionSlice& slice, const std::string& field,
                                  const wire::RegionRefView& ref) {
  if (!slice.device || reinterpret_cast<uintptr_t>(slice.data) % kDeviceAlignment == 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".offset: ", ref.offset, " is not a multiple of ", kDeviceAlignment,
      "; references into a CUDA IPC region start on a ", kDeviceAlignment,
      "-byte boundary (the GPU reads and writes them in 16-byte pieces)"));
}

// The region of `tensor`, resolved for `owner` in place; `field` names it.
absl::Status ResolveTensor(const RegionRegistry& registry, const std::string& owner,
                           const std::string& field, wire::TensorView& tensor) {
  const wire::RegionRefView& ref = *tensor.region;
  if (!tensor.pieces.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": it carries both data and a region; send the bytes in one of them"));
  }
  absl::StatusOr<RegionSlice> slice = registry.Resolve(
      owner, ref.region_id, ref.offset, ref.byte_size, absl::StrCat(field, ".region").c_str());
  if (!slice.ok()) return slice.status();
  if (absl::Status status = CheckDeviceAlignment(*slice, absl::StrCat(field, ".region"), ref);
      !status.ok()) {
    return status;
  }
  if (slice->bytes > 0) tensor.pieces.emplace_back(slice->data, static_cast<size_t>(slice->bytes));
  tensor.keep_alive = std::move(slice->mapping);
  tensor.device = slice->device;
  tensor.region.reset();
  return absl::OkStatus();
}

// The answer region `ref` names; `field` names it, `alignment` is what its
// values need.
absl::StatusOr<RegionSlice> ResolveAnswer(const RegionRegistry& registry, const std::string& owner,
                                          const char* field, const wire::RegionRefView& ref,
                                          int64_t alignment) {
  // The mapping starts on a page: the offset's alignment is the address's.
  if (ref.offset % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".offset: ", ref.offset, " is not a multiple of ", alignment,
        "; the answer's values are written there and must be aligned"));
  }
  absl::StatusOr<RegionSlice> slice =
      registry.Resolve(owner, ref.region_id, ref.offset, ref.byte_size, field);
  if (!slice.ok()) return slice.status();
  if (absl::Status status = CheckDeviceAlignment(*slice, field, ref); !status.ok()) return status;
  return slice;
}

absl::Status CheckAnswerFields(const wire::AttendRequestView& request) {
  if (request.lse_region.has_value() && !(request.out_region.has_value() && request.return_lse)) {
    return absl::InvalidArgumentError(
        "AttendRequest.lse_region: only with out_region and return_lse; drop it, or set both");
  }
  if (request.out_region.has_value() && request.return_lse && !request.lse_region.has_value()) {
    return absl::InvalidArgumentError(
        "AttendRequest.lse_region: an answer written into out_region sends no tensors, so "
        "return_lse needs an lse_region too ([T, H] f32)");
  }
  if (request.out_scales_region.has_value() &&
      !(request.out_region.has_value() && request.fp8_output)) {
    return absl::InvalidArgumentError(
        "AttendRequest.out_scales_region: only with out_region and fp8_output; drop it, or set "
        "both");
  }
  if (request.out_region.has_value() && request.fp8_output &&
      !request.out_scales_region.has_value()) {
    return absl::InvalidArgumentError(
        "AttendRequest.out_scales_region: an answer written into out_region sends no tensors, "
        "so fp8_output needs an out_scales_region too ([T, H, 4] UE8M0 scales)");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSameHostPeer(absl::string_view peer) { return wire::IsLoopbackAddress(peer); }

absl::StatusOr<std::string> RegionOwnerOf(const grpc::ServerContextBase& context,
                                          const std::string& tenant) {
  const std::string peer = context.peer();
  if (!IsSameHostPeer(peer)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "regions are for clients on the server's host (loopback TCP or a Unix socket, "
        "--listen=unix:PATH); this call came from ",
        EchoClientText(peer), ": send the tensors inline instead"));
  }
  const auto& metadata = context.client_metadata();
  const auto id = metadata.find(wire::kClientIdMetadata);
  std::string client = peer;
  if (id != metadata.end()) {
    const absl::string_view value(id->second.data(), id->second.size());
    if (absl::Status status = CheckClientId(value); !status.ok()) return status;
    client = absl::StrCat("client:", value);
  }
  // A tenant name holds no "/": the two parts cannot run into each other.
  if (tenant.empty()) return client;
  return absl::StrCat("tenant:", tenant, "/", client);
}

bool UsesRegions(const wire::AttendRequestView& request) {
  bool uses = request.out_region.has_value() || request.lse_region.has_value() ||
              request.out_scales_region.has_value();
  for (const std::optional<wire::TensorView>* tensor :
       {&request.q, &request.kv, &request.compressed_kv, &request.topk}) {
    uses = uses || (tensor->has_value() && (*tensor)->region.has_value());
  }
  return uses;
}

absl::StatusOr<std::optional<AnswerRegions>> ResolveRegionReferences(
    const RegionRegistry& registry, const std::string& owner, wire::AttendRequestView& request) {
  if (request.topk.has_value() && request.topk->region.has_value()) {
    return absl::InvalidArgumentError(
        "AttendRequest.topk.region: the top-k must travel inline, in data: its indices steer the "
        "server's memory accesses, and a region's bytes could change after they are checked");
  }
  if (absl::Status status = CheckAnswerFields(request); !status.ok()) return status;
  const std::pair<const char*, std::optional<wire::TensorView>*> tensors[] = {
      {"AttendRequest.q", &request.q},
      {"AttendRequest.kv", &request.kv},
      {"AttendRequest.compressed_kv", &request.compressed_kv}};
  for (const auto& [field, tensor] : tensors) {
    if (!tensor->has_value() || !(*tensor)->region.has_value()) continue;
    if (absl::Status status = ResolveTensor(registry, owner, field, **tensor); !status.ok()) {
      return status;
    }
  }
  if (!request.out_region.has_value()) return std::nullopt;
  AnswerRegions regions;
  // e4m3 codes are single bytes; bf16 values two; scales are written as
  // 4-byte words.
  absl::StatusOr<RegionSlice> out =
      ResolveAnswer(registry, owner, "AttendRequest.out_region", *request.out_region,
                    request.fp8_output ? 1 : alignof(uint16_t));
  if (!out.ok()) return out.status();
  regions.out = *std::move(out);
  if (request.lse_region.has_value()) {
    absl::StatusOr<RegionSlice> lse = ResolveAnswer(registry, owner, "AttendRequest.lse_region",
                                                    *request.lse_region, alignof(float));
    if (!lse.ok()) return lse.status();
    regions.lse = *std::move(lse);
  }
  if (request.out_scales_region.has_value()) {
    absl::StatusOr<RegionSlice> scales =
        ResolveAnswer(registry, owner, "AttendRequest.out_scales_region",
                      *request.out_scales_region, alignof(uint32_t));
    if (!scales.ok()) return scales.status();
    regions.scales = *std::move(scales);
  }
  request.out_region.reset();
  request.lse_region.reset();
  request.out_scales_region.reset();
  return regions;
}

void RegionOwners::StreamOpened(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++streams_[owner];
}

void RegionOwners::StreamClosed(const std::string& owner) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(owner);
  if (it != streams_.end() && --it->second == 0) streams_.erase(it);
}

void RegionOwners::SessionCreated(const std::string& owner, const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  sessions_[owner].insert(session_id);
}

std::vector<uint64_t> RegionOwners::Sweep(
    RegionRegistry& registry, absl::FunctionRef<std::vector<SessionSummary>()> list_sessions) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sessions_.empty()) {
    std::set<std::string> live;
    for (const SessionSummary& session : list_sessions()) live.insert(session.session_id);
    for (auto owner = sessions_.begin(); owner != sessions_.end();) {
      std::set<std::string>& ids = owner->second;
      for (auto id = ids.begin(); id != ids.end();) id = live.count(*id) ? std::next(id) : ids.erase(id);
      if (ids.empty()) {
        owner = sessions_.erase(owner);
      } else {
        registry.Touch(owner->first);
        ++owner;
      }
    }
  }
  for (const auto& [owner, streams] : streams_) registry.Touch(owner);
  return registry.Expire();
}

}  // namespace mla
