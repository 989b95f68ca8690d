// The service's side of the same-host data plane (server/regions/region_registry.h
// holds the regions): who a call's client is, whether it may use regions,
// what keeps its regions registered, and an Attend message's references
// resolved into the regions' memory before the message is queued, so that
// the engine sees ordinary tensors and a place to write the answer.
//
// A client is named by the request metadata `mla-client-id` (16 to 64
// characters of A-Z, a-z, 0-9, "-" and "_": a random value a client picks
// once and sends with every call), or, without it, by its connection
// (gRPC's peer address; every client without an id on a Unix socket is the
// one peer "unix:"). Only clients on the server's host may own regions: a
// peer on loopback TCP (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104) or a Unix
// socket. Any other peer is PERMISSION_DENIED: it can neither register nor
// reference a region, whatever id it sends.
//
// With authentication a region's owner is the tenant and the client
// together: another tenant cannot reach it whatever mla-client-id it sends,
// and another client of the same tenant cannot either; the per-client
// region limits (--max_regions_per_client, --max_region_gb_per_client)
// count per client within a tenant, and a client's streams and sessions
// keep only that client's regions registered.
//
// Thread safety: the functions are reentrant; RegionOwners is thread-safe.
#ifndef MLA_OFFLOAD_SERVER_REGIONS_REGION_ACCESS_H_
#define MLA_OFFLOAD_SERVER_REGIONS_REGION_ACCESS_H_

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/server_context.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/views.h"
#include "server/engine/requests.h"
#include "server/regions/region_registry.h"

namespace mla {

// Whether gRPC's peer address `peer` (e.g. "ipv4:127.0.0.1:5000",
// "ipv6:[::1]:5000", "unix:") is on this host.
bool IsSameHostPeer(absl::string_view peer);

// The region owner of a call by `tenant` ("" without authentication): the
// client, "client:<id>" or else the peer address, after "tenant:<tenant>/"
// with authentication.
// PERMISSION_DENIED for a peer not on this host, INVALID_ARGUMENT for a
// malformed mla-client-id.
absl::StatusOr<std::string> RegionOwnerOf(const grpc::ServerContextBase& context,
                                          const std::string& tenant);

// Whether the message names any region (tensors, out_region, lse_region,
// out_scales_region).
bool UsesRegions(const wire::AttendRequestView& request);

// Replaces the region references of `request` by the bytes they name in
// `owner`'s regions: q, kv and compressed_kv become views of the region's
// memory (kept mapped while the view lives) with `region` cleared, and
// out_region / lse_region / out_scales_region become the answer regions
// returned (nullopt without out_region). INVALID_ARGUMENT for a top-k in a
// region, a tensor with both data and a region, an lse_region without
// out_region and return_lse (or return_lse with out_region but no
// lse_region), an out_scales_region without out_region and fp8_output (or
// fp8_output with out_region but no out_scales_region), a bf16 out_region
// at an odd offset, an lse_region or out_scales_region at one not a
// multiple of 4, a reference into a CUDA IPC region at one not a multiple
// of 16;
// the registry's errors (NOT_FOUND, INVALID_ARGUMENT) for references to
// unknown or foreign regions or outside them. Errors name the field, e.g.
// "AttendRequest.q.region". The answer regions' sizes are the planner's to
// check (it knows the heads).
absl::StatusOr<std::optional<AnswerRegions>> ResolveRegionReferences(
    const RegionRegistry& registry, const std::string& owner, wire::AttendRequestView& request);

// What keeps owners' regions registered: their open Attend streams and the
// sessions they created that still exist.
class RegionOwners {
 public:
  void StreamOpened(const std::string& owner);
  void StreamClosed(const std::string& owner);
  void SessionCreated(const std::string& owner, const std::string& session_id);

  // Touches, in `registry`, every owner with an open stream or a session
  // among those `list_sessions` returns (called only when some owner has
  // sessions), forgets sessions that are gone, then expires the regions of
  // owners idle past the grace period; their ids.
  std::vector<uint64_t> Sweep(RegionRegistry& registry,
                              absl::FunctionRef<std::vector<SessionSummary>()> list_sessions);

 private:
  std::mutex mutex_;
  std::map<std::string, int> streams_;                    // open, by owner
  std::map<std::string, std::set<std::string>> sessions_;  // created, by owner
};

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_REGIONS_REGION_ACCESS_H_
