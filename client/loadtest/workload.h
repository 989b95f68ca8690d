// The synthetic decode load of the load-test client: every tensor a
// simulated serving node sends is a pure function of a few integers, so that
// --verify can rebuild any row a sampled layer step attended, long after it
// was sent, without keeping it.
//
// All bf16 data are views into one pool of random rows made at start (normal
// values times a power-of-two scale per 64-wide tile, never zero, so that
// the cache's tile scales differ and the FP8 path is exercised); a row is
// picked by hashing its identity. The query of a layer step, T x H rows, is
// one contiguous run of the pool, sent without copying. The C4A top-k is the
// model's width K with min((p+1)/4, K) distinct valid rows (-1 pads), spread
// over the rows that exist; sinks are uniform in [2, 7] with one in thirteen
// -inf, like the integration tests'.
//
// Identities: a session has a 64-bit salt; a layer step of a node is named by
// a 64-bit key (MessageKey). Thread-safe after construction (read-only).
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_WORKLOAD_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_WORKLOAD_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/model_profile.h"

namespace mla::loadtest {

// Mixes two 64-bit values into one (SplitMix64 based).
uint64_t Mix(uint64_t a, uint64_t b);

class Workload {
 public:
  // `pool_rows` rows of 512 bf16 values (1 KiB each) from `seed`.
  Workload(const ModelProfile& model, int64_t pool_rows, uint64_t seed);

  const ModelProfile& model() const { return model_; }
  int64_t pool_rows() const { return static_cast<int64_t>(pool_.size()) / 512; }

  // The salt of session `session` of node `node` in run `run_seed`.
  static uint64_t SessionSalt(uint64_t run_seed, int node, int session);
  // The key of one layer step's message: node, decode step, layer and the
  // server the message goes to.
  static uint64_t MessageKey(uint64_t run_seed, int node, int64_t step, int layer, int server);

  // One row of 512 bf16: the SWA (latent) row of a position, and compressed
  // row j of a C4A/C128A layer.
  const uint16_t* SwaRow(uint64_t salt, int layer, int32_t position) const;
  const uint16_t* CompressedRow(uint64_t salt, int layer, int32_t row) const;

  // The query of a message: [tokens, heads, 512] bf16, one contiguous run of
  // the pool (tokens * heads must not exceed pool_rows()).
  absl::Span<const uint16_t> Query(uint64_t message_key, int64_t tokens, int heads) const;

  // `size` bytes of the pool (at most pool_rows() KiB), for the Echo
  // baseline's payloads.
  absl::Span<const uint8_t> Bytes(uint64_t key, size_t size) const;

  // The top-k of a token at `position` of a C4A layer: K = model top-k
  // entries, the first min((p+1)/4, K) distinct rows below (p+1)/4, then -1.
  void AppendTopK(uint64_t salt, int layer, int32_t position, std::vector<int32_t>* out) const;

  // Sinks [attention layers, h_total] of a session; Sink() is one entry.
  std::vector<float> Sinks(uint64_t salt) const;
  float Sink(uint64_t salt, int layer, int head) const;

 private:
  const uint16_t* Row(uint64_t key) const;

  const ModelProfile& model_;
  std::vector<uint16_t> pool_;
};

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_WORKLOAD_H_
