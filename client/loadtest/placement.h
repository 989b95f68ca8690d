// Where a session lives when the load test drives several servers:
// rendezvous (highest random weight) hashing of the session's key over the
// server list, as the C++ client library places sessions (issue 5).
//
// Every (key, target) pair gets a pseudo-random weight from a fixed hash of
// both strings; a key lives on the target of highest weight. A key's place
// depends only on the key and the set of targets (not their order), and
// removing a target moves only the keys that lived on it. Pure functions.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_PLACEMENT_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_PLACEMENT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mla::loadtest {

// The weight of `key` on `target`: a 64-bit hash of both (FNV-1a, then a
// SplitMix64 finaliser), stable across runs and machines.
uint64_t RendezvousWeight(absl::string_view key, absl::string_view target);

// The index in `targets` of the target `key` lives on; -1 when targets is
// empty. Ties (equal weights) go to the smaller target string.
int RendezvousPlace(absl::string_view key, absl::Span<const std::string> targets);

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_PLACEMENT_H_
