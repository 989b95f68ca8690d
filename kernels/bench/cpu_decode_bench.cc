// CPU backend decode throughput on V4-Pro C4A shapes: 128 SWA rows plus 1024
// compressed rows per token, at H = 16, 64 and 128 and batches of 1, 16 and
// 64 tokens. Pools hold random rows inserted by the prologue and are larger
// than the last-level cache; compressed indices are random over their pool,
// as an indexer's top-k would be. Counters: tokens/s and GB/s of cache rows
// read (584 bytes a key row). Figures go to kernels/bench/RESULTS.md.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/bf16.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/model_profile.h"
#include "kernels/rope.h"

namespace mla {
namespace {

constexpr int kPoolBlocks = 4096;  // 262144 slots, 153 MB per pool
constexpr int kMaxPosition = 1 << 20;

struct Fixture {
  CpuBackend backend{0};
  RopeTable rope{RopeKind::kYarn, 1};
  DeviceBuffer swa_pool;
  DeviceBuffer compressed_pool;

  Fixture() {
    swa_pool = backend.Allocate(int64_t{kPoolBlocks} * kBlockBytes).value();
    compressed_pool = backend.Allocate(int64_t{kPoolBlocks} * kBlockBytes).value();
    FillPool(swa_pool, 1);
    FillPool(compressed_pool, 2);
  }

  // Writes every slot of a pool with a random row through the prologue.
  void FillPool(DeviceBuffer& pool, int seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t slots = int64_t{kPoolBlocks} * kBlockTokens;
    std::vector<uint16_t> rows(slots * kHeadDim);
    for (uint16_t& value : rows) value = FloatToBf16(normal(rng));
    std::vector<int32_t> slot_ids(slots), positions(slots, 0);
    std::iota(slot_ids.begin(), slot_ids.end(), 0);
    PrologueParams params;
    params.num_heads = 8;
    params.padded_heads = 8;
    params.rope = {rope.data(), rope.num_positions()};
    params.swa = {slots, rows.data(), positions.data(), slot_ids.data(),
                  {pool.as<uint8_t>(), kPoolBlocks}};
    if (!backend.Prologue(params).ok()) std::abort();
  }
};

Fixture& SharedFixture() {
  static Fixture* fixture = new Fixture();
  return *fixture;
}

void BM_DecodeV4ProC4A(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0));
  const int batch = static_cast<int>(state.range(1));
  const ModelProfile& pro = *FindModelProfile("deepseek-v4-pro").value();
  const int topk = pro.indexer_topk;
  Fixture& fixture = SharedFixture();
  const int64_t slots = int64_t{kPoolBlocks} * kBlockTokens;

  std::mt19937 rng(heads * 1000 + batch);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int32_t> any_slot(0, static_cast<int32_t>(slots - 1));
  std::vector<uint16_t> q(int64_t{batch} * heads * kHeadDim);
  for (uint16_t& value : q) value = FloatToBf16(normal(rng) * 0.3f);
  std::vector<int32_t> main_indices(int64_t{batch} * kSwaWindow);
  std::vector<int32_t> extra_indices(int64_t{batch} * topk);
  for (int t = 0; t < batch; ++t) {
    const int32_t ring = any_slot(rng) / kSwaWindow * kSwaWindow;  // a session's SWA ring
    for (int k = 0; k < kSwaWindow; ++k) main_indices[t * kSwaWindow + k] = ring + k;
  }
  for (int32_t& index : extra_indices) index = any_slot(rng);
  std::vector<float> sinks(heads, 0.5f);
  std::vector<uint16_t> out(int64_t{batch} * heads * kHeadDim);
  std::vector<float> lse(int64_t{batch} * heads);

  DecodeParams params;
  params.num_tokens = batch;
  params.num_heads = heads;
  params.padded_heads = heads;
  params.q = q.data();
  params.softmax_scale = pro.softmax_scale;
  params.sinks = sinks.data();
  params.main = {kSwaWindow, main_indices.data(), nullptr,
                 {fixture.swa_pool.as<uint8_t>(), kPoolBlocks}};
  params.extra = {topk, extra_indices.data(), nullptr,
                  {fixture.compressed_pool.as<uint8_t>(), kPoolBlocks}};
  params.out = out.data();
  params.lse = lse.data();

  for (auto _ : state) {
    if (!fixture.backend.Decode(params).ok()) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(out.data());
  }
  const double rows_read = double{1.0} * batch * (kSwaWindow + topk);
  state.counters["tokens/s"] =
      benchmark::Counter(batch, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["cache_GB/s"] = benchmark::Counter(
      rows_read * kTokenBytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] = benchmark::Counter(
      rows_read * heads * kHeadDim * 4 / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_DecodeV4ProC4A)
    ->ArgNames({"H", "b"})
    ->ArgsProduct({{16, 64, 128}, {1, 16, 64}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The Attend message of server/bench's transport_bench: 128 tokens of 128
// sessions, 16 heads, an SWA-only layer at positions 0..3 (1..4 keys a
// query); the prologue inserts each token's row, the decode reads them back.
// Per message: both stages, as the server's engine runs them.
void BM_ServicePathSwa(benchmark::State& state) {
  constexpr int kTokens = 128;
  constexpr int kHeads = 16;
  constexpr int kPositions = 4;
  const ModelProfile& pro = *FindModelProfile("deepseek-v4-pro").value();
  static CpuBackend* backend = new CpuBackend(0);
  static const RopeTable* rope = new RopeTable(RopeKind::kPlain, 4096);
  const int64_t blocks = int64_t{kTokens} * kPositions / kBlockTokens;
  DeviceBuffer pool = backend->Allocate(blocks * kBlockBytes).value();

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> q(int64_t{kTokens} * kHeads * kHeadDim);
  for (uint16_t& value : q) value = FloatToBf16(normal(rng));
  std::vector<uint16_t> kv(int64_t{kTokens} * kHeadDim);
  for (uint16_t& value : kv) value = FloatToBf16(normal(rng));
  std::vector<uint16_t> q_out(q.size());
  std::vector<uint16_t> out(q.size());
  std::vector<float> lse(kTokens * kHeads);
  std::vector<int32_t> positions(kTokens), slots(kTokens), main_lengths(kTokens);
  std::vector<int32_t> main_indices(int64_t{kTokens} * kSwaWindow, -1);

  int64_t step = 0;
  for (auto _ : state) {
    // Token t is session t, whose SWA rows are slots t*4 .. t*4+3.
    const int32_t p = static_cast<int32_t>(step++ % kPositions);
    for (int t = 0; t < kTokens; ++t) {
      positions[t] = p;
      slots[t] = t * kPositions + p;
      main_lengths[t] = p + 1;
      for (int w = 0; w <= p; ++w) main_indices[t * kSwaWindow + w] = t * kPositions + w;
    }
    PrologueParams prologue;
    prologue.num_tokens = kTokens;
    prologue.num_heads = kHeads;
    prologue.padded_heads = kHeads;
    prologue.q = q.data();
    prologue.positions = positions.data();
    prologue.q_out = q_out.data();
    prologue.rms_norm_eps = pro.rms_norm_eps;
    prologue.rope = {rope->data(), rope->num_positions()};
    prologue.swa = {kTokens, kv.data(), positions.data(), slots.data(),
                    {pool.as<uint8_t>(), blocks}};
    if (!backend->Prologue(prologue).ok()) state.SkipWithError("prologue failed");
    DecodeParams decode;
    decode.num_tokens = kTokens;
    decode.num_heads = kHeads;
    decode.padded_heads = kHeads;
    decode.q = q_out.data();
    decode.softmax_scale = pro.softmax_scale;
    decode.main = {kSwaWindow, main_indices.data(), main_lengths.data(),
                   {pool.as<uint8_t>(), blocks}};
    decode.out = out.data();
    decode.lse = lse.data();
    if (!backend->Decode(decode).ok()) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(out.data());
  }
}

BENCHMARK(BM_ServicePathSwa)->Unit(benchmark::kMicrosecond)->UseRealTime()->MeasureProcessCPUTime();

}  // namespace
}  // namespace mla

BENCHMARK_MAIN();
