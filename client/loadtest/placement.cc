#include "client/loadtest/placement.h"

namespace mla::loadtest {
namespace {

uint64_t Fnv1a(absl::string_view text, uint64_t hash) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t RendezvousWeight(absl::string_view key, absl::string_view target) {
  // A separator byte keeps ("ab", "c") and ("a", "bc") apart.
  uint64_t hash = Fnv1a(key, 0xcbf29ce484222325ull);
  hash = Fnv1a(absl::string_view("\0", 1), hash);
  return SplitMix64(Fnv1a(target, hash));
}

int RendezvousPlace(absl::string_view key, absl::Span<const std::string> targets) {
  int best = -1;
  uint64_t best_weight = 0;
  for (int i = 0; i < static_cast<int>(targets.size()); ++i) {
    const uint64_t weight = RendezvousWeight(key, targets[i]);
    if (best < 0 || weight > best_weight ||
        (weight == best_weight && targets[i] < targets[best])) {
      best = i;
      best_weight = weight;
    }
  }
  return best;
}

}  // namespace mla::loadtest
