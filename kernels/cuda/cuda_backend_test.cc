// Holds the CUDA backend (kernels/cuda/cuda_backend.h) to the float64
// reference of kernels/reference/ under the tolerances of spec section 7, and
// to the CPU backend: cache bytes written by the CUDA prologue must equal the
// CPU backend's (e4m3 and scale bytes exactly, RoPE bf16 within one ulp) on
// the same random inputs.
//
// Derived from kernels/reference/cpu_backend_test.cc (same inputs, poisoning
// and comparators), with larger batches (up to 1024 tokens), so that the
// kernels' split-key and one-CTA-per-token paths both run, and one batch of
// 70,000 tokens (past a grid's y limit) with a known answer. Only structural
// parameter checks are tested for rejection: index, slot and position values
// are the caller's contract (spec section 5) and the CUDA backend does not
// read them on the host. Without a CUDA device every test skips.
#include "kernels/cuda/cuda_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cache_format.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/test_kernels.h"
#include "kernels/fp8_e4m3.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/key_lists.h"
#include "kernels/reference/backend_test_support.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/reference/tolerance.h"

namespace mla {
namespace {

using namespace backend_test;  // NOLINT(build/namespaces): the shared test
                               // support

constexpr int kThreads = 8;  // CPU backend threads, for the comparisons

// A CUDA backend on device 0, or a skipped test when there is no GPU.
#define MAKE_CUDA_BACKEND(name)                                          \
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device"; \
  CudaBackend name(0);                                                   \
  ASSERT_TRUE(name.init_status().ok()) << name.init_status()

// A new CUDA backend on device 0, or its init status.
absl::StatusOr<std::unique_ptr<ComputeBackend>> MakeBackend() {
  auto backend = std::make_unique<CudaBackend>(0);
  if (!backend->init_status().ok()) return backend->init_status();
  return std::unique_ptr<ComputeBackend>(std::move(backend));
}

TEST(LayerCasesTest, BothProfilesHaveEveryKind) { EXPECT_EQ(LayerCases().size(), 6u); }

// ---- Prologue on random inputs.

// CPU and CUDA pools after the same inserts: every byte equal, except the
// RoPE bf16 values of a row, which may be one ulp apart (spec section 7).
void ExpectSamePools(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& gpu,
                     absl::string_view subject) {
  ASSERT_EQ(cpu.size(), gpu.size());
  int64_t differing = 0, rope_one_ulp = 0, first = -1;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] == gpu[i]) continue;
    const int64_t in_block = static_cast<int64_t>(i % kBlockBytes);
    const bool rope = in_block < int64_t{kBlockTokens} * kTokenDataBytes &&
                      in_block % kTokenDataBytes >= kNopeDim;
    if (rope) {
      const size_t even = i & ~size_t{1};
      const uint16_t a = static_cast<uint16_t>(cpu[even] | cpu[even + 1] << 8);
      const uint16_t b = static_cast<uint16_t>(gpu[even] | gpu[even + 1] << 8);
      if (reference::Bf16UlpDistance(a, b) <= 1.0) {
        ++rope_one_ulp;
        continue;
      }
    }
    if (differing++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(differing, 0) << subject << ": " << differing
                          << " bytes differ between the CPU and CUDA backends, the first at "
                          << first << " (cpu " << (first >= 0 ? int{cpu[first]} : 0) << ", cuda "
                          << (first >= 0 ? int{gpu[first]} : 0) << ")";
  if (rope_one_ulp > 0) {
    std::cout << subject << ": " << rope_one_ulp
              << " RoPE bytes one bf16 ulp apart between CPU and CUDA\n";
  }
}

// q_out of both backends: each is within one ulp of the float64 reference
// (checked above), so NoPE elements are at most two ulps apart; RoPE elements
// may differ by the RoPE clause and are held to the reference only.
void ExpectSameQueries(const std::vector<uint16_t>& cpu, const std::vector<uint16_t>& gpu) {
  ASSERT_EQ(cpu.size(), gpu.size());
  int64_t far = 0, first = -1;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (static_cast<int>(i % kHeadDim) >= kNopeDim) continue;
    if (reference::Bf16UlpDistance(cpu[i], gpu[i]) > 2.0) {
      if (far++ == 0) first = static_cast<int64_t>(i);
    }
  }
  EXPECT_EQ(far, 0) << far << " q_out NoPE elements more than two ulps apart between CPU and CUDA, "
                    << "the first at " << first;
}

// The shared cases, and large batches: 1024 tokens at 8 heads, 128 tokens at
// 128 heads. The launch gives a warp 1, 2 or 4 query rows by the batch's
// size (PrologueRowsPerWarp): on an H200 the large batches take four, and
// two more cases have warps that mix real and padding heads, 13 heads
// (Hp 16) x 100 tokens with two rows a warp and 6 heads (Hp 8) x 600 tokens
// with four.
std::vector<PrologueCase> CudaPrologueCases() {
  std::vector<PrologueCase> cases = PrologueCases();
  const std::vector<LayerCase> layers = LayerCases();
  cases.push_back({layers[1], 8, 1024, 1500});
  cases.push_back({layers[4], 128, 128, 1501});
  cases.push_back({layers[0], 16, 1000, 1502});
  cases.push_back({layers[2], 13, 100, 1503});
  cases.push_back({layers[3], 6, 600, 1504});
  return cases;
}

class PrologueTest : public ::testing::TestWithParam<PrologueCase> {};

TEST_P(PrologueTest, MatchesReference) {
  const PrologueCase& c = GetParam();
  MAKE_CUDA_BACKEND(backend);
  RunPrologueCase(
      backend, c,
      [&](const PrologueRandomInputs& in, DeviceArena& arena, const PrologueParams& params) {
        // The CPU backend on the same inputs: the pools must agree byte for
        // byte, except that a RoPE bf16 value may be one ulp apart; q_out
        // within one ulp.
        const int64_t q_out_size = int64_t{c.tokens} * params.padded_heads * kHeadDim;
        CpuBackend cpu(kThreads);
        DeviceArena cpu_arena(cpu);
        const PrologueParams cpu_params = PutPrologue(cpu_arena, c, in);
        ASSERT_TRUE(cpu.Prologue(cpu_params).ok());
        ExpectSameQueries(cpu_arena.Get(cpu_params.q_out, q_out_size),
                          arena.Get(params.q_out, q_out_size));
        ExpectSamePools(cpu_arena.Get(cpu_params.swa.pool.base, in.swa.pool.size()),
                        arena.Get(params.swa.pool.base, in.swa.pool.size()), "swa pool");
        if (in.compressed.num_rows() > 0) {
          ExpectSamePools(cpu_arena.Get(cpu_params.compressed.pool.base, in.compressed.pool.size()),
                          arena.Get(params.compressed.pool.base, in.compressed.pool.size()),
                          "compressed pool");
        }
      });
}

INSTANTIATE_TEST_SUITE_P(AllLayerKindsAndHeadCounts, PrologueTest,
                         ::testing::ValuesIn(CudaPrologueCases()),
                         [](const ::testing::TestParamInfo<PrologueCase>& info) {
                           return absl::StrCat(info.param.layer.Name(), "_h", info.param.heads,
                                               "_n", info.param.tokens);
                         });

// ---- Decode on random inputs.

// The shared cases, and large batches (one CTA per token and head group, no
// split of the keys).
std::vector<DecodeCase> CudaDecodeCases() {
  std::vector<DecodeCase> cases = DecodeCases();
  const std::vector<LayerCase> layers = LayerCases();
  cases.push_back({layers[1], 8, 1024, SinkMode::kPerToken, true, true, true, 2101});
  cases.push_back({layers[4], 64, 128, SinkMode::kMixed, false, true, true, 2102});
  cases.push_back({layers[5], 128, 96, SinkMode::kLarge, true, true, false, 2103});
  cases.push_back({layers[3], 4, 300, SinkMode::kZero, true, false, true, 2104});
  cases.push_back({layers[2], 32, 256, SinkMode::kPerToken, false, true, true, 2105});
  // One CTA per token on the H200 (no split) into an output view that is
  // only 4-byte aligned: the staged output's word-by-word path.
  cases.push_back({layers[4], 64, 128, SinkMode::kMixed, true, true, true, 2111, 2});
  // The same with 16 heads: the narrow kernel's word-by-word path (and the
  // 64-row kernel's again with MLA_CUDA_DECODE=padded).
  cases.push_back({layers[3], 16, 200, SinkMode::kMixed, true, true, true, 2112, 2});
  // V4-Pro C4A (18 chunks a token) unsplit at Hp 8 and 16: the narrow
  // kernel's two producer groups with the ring (NarrowUsesRing), the bf16
  // and the FP8 output.
  cases.push_back({layers[4], 8, 133, SinkMode::kPerToken, false, true, true, 2113});
  cases.push_back({layers[4], 16, 140, SinkMode::kMixed, true, false, true, 2114});
  cases.push_back({layers[4], 16, 136, SinkMode::kLarge, true, true, false, 2115, 0, true});
  return cases;
}

class DecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeTest, MatchesReference) {
  MAKE_CUDA_BACKEND(backend);
  RunDecodeCase(backend, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllLayerKindsAndHeadCounts, DecodeTest,
                         ::testing::ValuesIn(CudaDecodeCases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.Name();
                         });

INSTANTIATE_TEST_SUITE_P(Fp8Output, DecodeTest, ::testing::ValuesIn(Fp8DecodeCases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.Name();
                         });

// ---- One realistic layer step: prologue, then decode over what it wrote.

class LayerStepTest : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerStepTest, PrologueThenDecodeMatchReference) {
  MAKE_CUDA_BACKEND(backend);
  RunLayerStep(backend, GetParam());
}

INSTANTIATE_TEST_SUITE_P(AllLayerKinds, LayerStepTest, ::testing::ValuesIn(LayerCases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) {
                           return info.param.Name();
                         });

// ---- Decodes whose answer is known exactly: every token attends one row.

// Random cache rows at slots 0 .. slots - 1, and each row as a decode
// outputs it when it is a token's only key with no sink (the row itself,
// dequantised, in bf16; lse 0).
struct OneKeyRows {
  std::vector<uint8_t> pool;
  std::vector<uint16_t> expected;  // [slots][512]
};
OneKeyRows MakeOneKeyRows(int64_t slots, uint32_t seed) {
  OneKeyRows rows{std::vector<uint8_t>(slots / kBlockTokens * kBlockBytes, 0),
                  std::vector<uint16_t>(slots * kHeadDim)};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<float> row(kHeadDim);
  for (int64_t slot = 0; slot < slots; ++slot) {
    for (float& x : row) x = RoundToBf16(value(rng));
    uint8_t* data = rows.pool.data() + SlotDataOffset(slot);
    uint8_t* scales = rows.pool.data() + SlotScaleOffset(slot);
    QuantizeRow(row.data(), data, scales);
    DequantizeRow(data, scales, row.data());
    for (int d = 0; d < kHeadDim; ++d) rows.expected[slot * kHeadDim + d] = FloatToBf16(row[d]);
  }
  return rows;
}

// A decode of `tokens` tokens of `heads` heads, each attending the row at
// slot t % slots of the device pool `pool` (zero q, no sink), with its
// indices, q, out and lse in `arena` (out and lse poisoned).
DecodeParams PutOneKeyDecode(DeviceArena& arena, uint8_t* pool, int64_t slots, int64_t tokens,
                             int heads) {
  std::vector<int32_t> indices(tokens);
  for (int64_t t = 0; t < tokens; ++t) indices[t] = static_cast<int32_t>(t % slots);
  const int64_t out_elements = tokens * heads * kHeadDim;
  DecodeParams params;
  params.num_tokens = tokens;
  params.num_heads = heads;
  params.padded_heads = heads;
  params.q = arena.Zeros<uint16_t>(out_elements);
  params.softmax_scale = 0.04419417382415922f;  // 512^-0.5 (q is zero: any scale)
  params.main.width = 1;
  params.main.indices = arena.Put(indices);
  params.main.pool = CachePoolView{pool, slots / kBlockTokens};
  params.out = arena.Put(std::vector<uint16_t>(out_elements, 0xffff));
  params.lse = arena.Put(std::vector<float>(tokens * heads, -1.0f));
  return params;
}

// Checks the outputs of a finished PutOneKeyDecode against `expected`.
void ExpectOneKeyRows(DeviceArena& arena, const DecodeParams& params,
                      const std::vector<uint16_t>& expected, int64_t slots) {
  const int64_t tokens = params.num_tokens;
  const int heads = params.num_heads;
  const std::vector<uint16_t> out = arena.Get(params.out, tokens * heads * kHeadDim);
  const std::vector<float> lse = arena.Get(params.lse, tokens * heads);
  int64_t wrong = 0, first = -1;
  for (int64_t t = 0; t < tokens; ++t) {
    const uint16_t* want = expected.data() + (t % slots) * kHeadDim;
    for (int h = 0; h < heads; ++h) {
      const uint16_t* got = out.data() + (t * heads + h) * kHeadDim;
      // As numbers: a -0 row value may come out +0 (the key tile's other,
      // empty rows add +0 times a zero probability).
      const bool same = std::equal(got, got + kHeadDim, want, [](uint16_t a, uint16_t b) {
        return Bf16ToFloat(a) == Bf16ToFloat(b);
      });
      if (!same || lse[t * heads + h] != 0.0f) {
        if (wrong++ == 0) first = t;
      }
    }
  }
  EXPECT_EQ(wrong, 0) << wrong << " (token, head) rows wrong of " << tokens * heads
                      << ", the first of token " << first << " (" << heads << " heads)";
}

// One decode of `tokens` tokens and `heads` heads over the one-key rows of
// `seed` in a 4096-slot pool, waited for and checked.
void ExpectOneKeyDecode(CudaBackend& backend, uint32_t seed, int64_t tokens, int heads) {
  constexpr int64_t kSlots = 4096;
  const OneKeyRows rows = MakeOneKeyRows(kSlots, seed);
  DeviceArena arena(backend);
  const DecodeParams params = PutOneKeyDecode(arena, arena.Put(rows.pool), kSlots, tokens, heads);
  ASSERT_TRUE(backend.Decode(params).ok());
  ASSERT_TRUE(backend.Synchronize().ok());
  ExpectOneKeyRows(arena, params, rows.expected, kSlots);
}

// The FP8 output of one-key decodes. Each (token, head) attends one row with
// probability 1 and no sink, so its fp32 output is the row exactly and its
// FP8 form (spec section 5) is the host's quantisation of the row, byte for
// byte (a -0 value may come out +0, as ExpectOneKeyRows says), on every
// path: the narrow kernel (8..32 heads), the 64-head one with a partial last
// group (40, 48, 96) and as a pair (96, 128), and, with the one key among
// 299 -1 entries of a 300-wide list of a few tokens, the split keys'
// combine.
TEST(DecodeFp8Test, OneKeyRowsComeOutAsTheHostQuantisesThem) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kSlots = 4096;
  const OneKeyRows rows = MakeOneKeyRows(kSlots, 2131);
  if (backend.decode_kernels() == cuda::DecodeKernels::kMma ||
      backend.decode_kernels() == cuda::DecodeKernels::kSimt) {
    // The cross-check kernels write bf16 only, and say so.
    DeviceArena arena(backend);
    DecodeParams params = PutOneKeyDecode(arena, arena.Put(rows.pool), kSlots, 2, 16);
    params.out = nullptr;
    params.out_e4m3 = arena.Zeros<uint8_t>(2 * 16 * kHeadDim);
    params.out_scales = arena.Zeros<uint8_t>(2 * 16 * kOutputQuantBlocks);
    const absl::Status refused = backend.Decode(params);
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
    EXPECT_NE(refused.message().find("MLA_CUDA_DECODE"), absl::string_view::npos) << refused;
    return;
  }
  for (int heads : {8, 16, 24, 32, 40, 48, 64, 96, 128}) {
    for (const int64_t tokens : {int64_t{3}, int64_t{200}}) {
      for (const int width : {1, 300}) {
        DeviceArena arena(backend);
        DecodeParams params =
            PutOneKeyDecode(arena, arena.Put(rows.pool), kSlots, tokens, heads);
        if (width > 1) {
          std::vector<int32_t> indices(tokens * width, -1);
          for (int64_t t = 0; t < tokens; ++t) {
            indices[t * width + (t * 37) % width] = static_cast<int32_t>(t % kSlots);
          }
          params.main.width = width;
          params.main.indices = arena.Put(indices);
        }
        const int64_t values = tokens * heads * kHeadDim;
        params.out = nullptr;
        params.out_e4m3 = arena.Put(std::vector<uint8_t>(values, 0x7f));  // NaN
        params.out_scales = arena.Put(std::vector<uint8_t>(tokens * heads * kOutputQuantBlocks, 0xee));
        ASSERT_TRUE(backend.Decode(params).ok());
        ASSERT_TRUE(backend.Synchronize().ok());
        const std::vector<uint8_t> codes = arena.Get(params.out_e4m3, values);
        const std::vector<uint8_t> scales =
            arena.Get(params.out_scales, tokens * heads * kOutputQuantBlocks);
        const std::vector<float> lse = arena.Get(params.lse, tokens * heads);
        int64_t wrong = 0;
        std::string first;
        for (int64_t t = 0; t < tokens; ++t) {
          const uint16_t* row = rows.expected.data() + (t % kSlots) * kHeadDim;
          for (int h = 0; h < heads; ++h) {
            for (int k = 0; k < kOutputQuantBlocks; ++k) {
              float amax = 0.0f;
              for (int d = 0; d < kOutputQuantBlock; ++d) {
                amax = std::max(amax, std::fabs(Bf16ToFloat(row[k * kOutputQuantBlock + d])));
              }
              const int e = CeilLog2FromBits(std::max(amax, 1e-4f) / 448.0f);
              const uint8_t byte = static_cast<uint8_t>(std::clamp(e + 127, 0, 255));
              const int64_t at = (t * heads + h) * kOutputQuantBlocks + k;
              bool same = scales[at] == byte;
              for (int d = 0; d < kOutputQuantBlock && same; ++d) {
                const int dim = k * kOutputQuantBlock + d;
                const uint8_t want = FloatToE4m3(std::ldexp(Bf16ToFloat(row[dim]), -e));
                const uint8_t got = codes[(t * heads + h) * kHeadDim + dim];
                same = got == want || ((got | want) == 0x80 && (got & want) == 0);
              }
              if (!same || lse[t * heads + h] != 0.0f) {
                if (wrong++ == 0) {
                  first = absl::StrCat("token ", t, " head ", h, " block ", k, ": scale byte ",
                                       scales[at], " (want ", byte, "), lse ", lse[t * heads + h]);
                }
              }
            }
          }
        }
        EXPECT_EQ(wrong, 0) << wrong << " blocks wrong at H=" << heads << " N=" << tokens
                            << " width " << width << ", the first " << first;
      }
    }
  }
}

// PrologueAndDecode's fused layer step against the prologue then the
// decode, on the same random inputs: out (both formats), lse and the pool
// byte for byte, since the fused decode makes its query rows with the
// prologue's instructions. Each token's first key is its own new SWA row,
// which the fused decode may read only once the inserts are done. Head
// counts of the narrow kernel (fused), padded (4) or not, and of the 64-head
// one and the pair (the two calls, the same bits by definition); a few
// tokens (a split of the keys and the combine) and many.
TEST(FusedLayerStepTest, MatchesThePrologueThenTheDecodeBitForBit) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kBlocks = 64;
  constexpr int64_t kSlots = kBlocks * kBlockTokens;
  const RopeTable& table = SharedTable(RopeKind::kYarn);
  for (int heads : {4, 16, 24, 32, 48, 64, 96, 128}) {
    for (const int64_t tokens : {int64_t{3}, int64_t{150}}) {
      for (const bool fp8 : {false, true}) {
        if (fp8 && (backend.decode_kernels() == cuda::DecodeKernels::kMma ||
                    backend.decode_kernels() == cuda::DecodeKernels::kSimt)) {
          continue;  // bf16 only (DecodeFp8Test); these take the two calls
        }
        Random rng(5000 + heads * 7 + tokens + (fp8 ? 1 : 0));
        const int padded = *PaddedHeadCount(heads);
        // Every slot holds a valid row first; the step inserts its tokens'
        // rows at distinct slots over some of them.
        std::vector<int32_t> fill_positions(kSlots);
        for (int32_t& x : fill_positions) x = static_cast<int32_t>(rng.Uniform(0, kMaxPosition));
        InsertBatch fill = MakeInsert(rng, fill_positions, kBlocks);
        for (int64_t i = 0; i < kSlots; ++i) fill.slots[i] = static_cast<int32_t>(i);
        std::vector<int32_t> positions(tokens);
        for (int32_t& x : positions) x = static_cast<int32_t>(rng.Uniform(0, kMaxPosition));
        InsertBatch step_rows = MakeInsert(rng, positions, kBlocks);
        std::vector<int32_t> step_slots(kSlots);
        for (int64_t i = 0; i < kSlots; ++i) step_slots[i] = static_cast<int32_t>(i);
        rng.Shuffle(step_slots);
        step_rows.slots.assign(step_slots.begin(), step_slots.begin() + tokens);
        const std::vector<uint16_t> q = rng.Rows(tokens * heads);
        std::vector<int32_t> main_indices(tokens * kSwaWindow), extra_indices(tokens * 512);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int k = 0; k < kSwaWindow; ++k) {
            main_indices[t * kSwaWindow + k] =
                k == 0 ? step_rows.slots[t]
                       : (rng.Chance(0.05) ? -1 : static_cast<int32_t>(rng.Uniform(0, kSlots - 1)));
          }
          for (int k = 0; k < 512; ++k) {
            extra_indices[t * 512 + k] = static_cast<int32_t>(rng.Uniform(0, kSlots - 1));
          }
        }
        std::vector<float> sinks(heads);
        for (float& sink : sinks) sink = static_cast<float>(rng.Normal() * 2);

        struct Outcome {
          std::vector<uint16_t> out;
          std::vector<uint8_t> e4m3, scales, pool;
          std::vector<float> lse;
        };
        auto run = [&](bool fused) {
          DeviceArena arena(backend);
          const RopeTableView rope = arena.PutTable(table);
          uint8_t* pool = arena.Put(fill.pool);
          PrologueParams fill_params;
          fill_params.num_heads = heads;
          fill_params.padded_heads = padded;
          fill_params.rope = rope;
          fill_params.swa = PutInsert(arena, fill, pool);
          EXPECT_TRUE(backend.Prologue(fill_params).ok());
          PrologueParams prologue;
          prologue.num_tokens = tokens;
          prologue.num_heads = heads;
          prologue.padded_heads = padded;
          prologue.q = arena.Put(q);
          prologue.positions = arena.Put(positions);
          prologue.q_out = arena.Put(std::vector<uint16_t>(tokens * padded * kHeadDim, kPoisonBf16));
          prologue.rms_norm_eps = 1e-6f;
          prologue.rope = rope;
          prologue.swa = PutInsert(arena, step_rows, pool);
          DecodeParams decode;
          decode.num_tokens = tokens;
          decode.num_heads = heads;
          decode.padded_heads = padded;
          decode.q = prologue.q_out;
          decode.softmax_scale = 0.04419417382415922f;
          decode.sinks = arena.Put(sinks);
          decode.main = {kSwaWindow, arena.Put(main_indices), nullptr, {pool, kBlocks}};
          decode.extra = {512, arena.Put(extra_indices), nullptr, {pool, kBlocks}};
          decode.derotate = true;
          decode.positions = prologue.positions;
          decode.rope = rope;
          const int64_t values = tokens * heads * kHeadDim;
          if (fp8) {
            decode.out_e4m3 = arena.Put(std::vector<uint8_t>(values, 0x7f));
            decode.out_scales = arena.Put(std::vector<uint8_t>(tokens * heads * kOutputQuantBlocks, 0xee));
          } else {
            decode.out = arena.Put(std::vector<uint16_t>(values, kPoisonBf16));
          }
          decode.lse = arena.Put(std::vector<float>(tokens * heads, -1.0f));
          if (fused) {
            EXPECT_TRUE(backend.PrologueAndDecode(prologue, decode).ok());
          } else {
            EXPECT_TRUE(backend.Prologue(prologue).ok());
            EXPECT_TRUE(backend.Decode(decode).ok());
          }
          EXPECT_TRUE(backend.Synchronize().ok());
          Outcome outcome;
          if (fp8) {
            outcome.e4m3 = arena.Get(decode.out_e4m3, values);
            outcome.scales = arena.Get(decode.out_scales, tokens * heads * kOutputQuantBlocks);
          } else {
            outcome.out = arena.Get(decode.out, values);
          }
          outcome.lse = arena.Get(decode.lse, tokens * heads);
          outcome.pool = arena.Get(pool, fill.pool.size());
          return outcome;
        };
        const Outcome twice = run(false);
        const Outcome fused = run(true);
        const std::string shape =
            absl::StrCat("H=", heads, " N=", tokens, fp8 ? " fp8" : " bf16");
        EXPECT_TRUE(twice.out == fused.out) << shape;
        EXPECT_TRUE(twice.e4m3 == fused.e4m3) << shape;
        EXPECT_TRUE(twice.scales == fused.scales) << shape;
        EXPECT_EQ(0, std::memcmp(twice.lse.data(), fused.lse.data(), twice.lse.size() * 4))
            << shape;
        EXPECT_TRUE(twice.pool == fused.pool) << shape;
        // Not vacuous: the decode wrote every value (no poison left).
        for (float lse : fused.lse) ASSERT_NE(lse, -1.0f) << shape;
      }
    }
  }
}

// A batch past the 65,535 CTAs that a grid's y and z allow: every decode
// kernel puts the tokens in the grid's x. Also run with
// MLA_CUDA_DECODE=padded, =mma and =simt by run_on_device.sh. With 8 heads
// every kernel has one head group a token: the head part of the grid's x is
// covered by the 64- and 128-head cases above.
TEST(DecodeGridTest, EveryTokenOfABatchPastTheGridYLimit) {
  MAKE_CUDA_BACKEND(backend);
  ExpectOneKeyDecode(backend, 2121, 70000, 8);
}

// Programmatic dependent launch: the default decode kernels may start while
// the kernel before them finishes, and read cache rows only after it
// (WaitForPreviousGrid). Here that kernel allows the decode's launch at
// once and writes the rows the decode needs only 200 us later; until then
// the pool holds other rows, which a decode that did not wait would read.
TEST(DecodeLaunchTest, ReadsTheRowsOnlyOnceTheKernelBeforeItHasFinished) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kSlots = 4096;
  const OneKeyRows stale = MakeOneKeyRows(kSlots, 2122);
  const OneKeyRows fresh = MakeOneKeyRows(kSlots, 2123);
  for (int heads : {8, 16, 24, 32, 48, 64, 96, 128}) {
    DeviceArena arena(backend);
    uint8_t* pool = arena.Put(stale.pool);
    const uint8_t* source = arena.Put(fresh.pool);
    const DecodeParams params = PutOneKeyDecode(arena, pool, kSlots, 128, heads);
    ASSERT_EQ(cuda::LaunchLateCopy(pool, source, static_cast<int64_t>(fresh.pool.size()), 200000,
                                   static_cast<cudaStream_t>(backend.native_stream())),
              cudaSuccess);
    ASSERT_TRUE(backend.Decode(params).ok());
    ASSERT_TRUE(backend.Synchronize().ok());
    ExpectOneKeyRows(arena, params, fresh.expected, kSlots);
  }
}

// The kernels' bf16 rounding (bf16_device.cuh: PackBf16, the cvt that
// rounds the decode's outputs and probabilities, and ToBf16Bits, the
// prologue's) gives kernels/bf16.h's bits for every value but NaN, which
// must stay NaN: every sign, exponent and top 7 mantissa bits (all 65,536
// bf16 patterns) with low 16 bits at and around the rounding points (exact,
// just above, just below a tie, the ties, all ones), so subnormals, ties to
// even and odd, the overflow to infinity, infinities and NaNs all occur.
TEST(Bf16RoundingTest, MatchesTheHostRoundingBitForBit) {
  MAKE_CUDA_BACKEND(backend);
  std::vector<float> in;
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xc000u, 0xffffu}) {
      const uint32_t bits = high << 16 | low;
      float value;
      std::memcpy(&value, &bits, sizeof(value));
      in.push_back(value);
    }
  }
  in.push_back(0.0f);  // an even count: pairs
  const int64_t pairs = static_cast<int64_t>(in.size() / 2);
  DeviceArena arena(backend);
  const float* in_d = arena.Put(in);
  uint32_t* packed_d = arena.Zeros<uint32_t>(pairs);
  uint32_t* single_d = arena.Zeros<uint32_t>(pairs);
  ASSERT_EQ(cuda::LaunchRoundToBf16(in_d, packed_d, single_d, pairs,
                                    static_cast<cudaStream_t>(backend.native_stream())),
            cudaSuccess);
  ASSERT_TRUE(backend.Synchronize().ok());
  const std::vector<uint32_t> packed = arena.Get(packed_d, pairs);
  const std::vector<uint32_t> single = arena.Get(single_d, pairs);
  int64_t wrong = 0;
  for (int64_t i = 0; i < 2 * pairs; ++i) {
    const uint16_t want = FloatToBf16(in[i]);
    const bool nan = std::isnan(in[i]);
    for (const std::vector<uint32_t>* got : {&packed, &single}) {
      const uint16_t bits = static_cast<uint16_t>((*got)[i / 2] >> (16 * (i % 2)));
      const bool ok = nan ? std::isnan(Bf16ToFloat(bits)) : bits == want;
      if (!ok && wrong++ < 5) {
        ADD_FAILURE() << (got == &packed ? "PackBf16" : "ToBf16Bits") << " of float bits 0x"
                      << std::hex << absl::bit_cast<uint32_t>(in[i]) << ": 0x" << bits
                      << ", want 0x" << want << std::dec;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

// A failed CUDA call is that call's failure only: after an allocation the
// device cannot hold (ResourceExhausted), the next decode launches, runs
// and synchronises cleanly (the runtime's record of the failed cudaMalloc
// is not reported again by a later launch).
TEST(CudaErrorTest, AFailedAllocationDoesNotFailTheNextLaunch) {
  MAKE_CUDA_BACKEND(backend);
  const absl::StatusOr<DeviceBuffer> huge = backend.Allocate(int64_t{1} << 50);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  ExpectOneKeyDecode(backend, 2124, 128, 64);
}

// ---- Bad parameters: InvalidArgument, nothing written.

TEST(PrologueRejectTest, AcceptsTheUnbrokenInputs) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const absl::Status status = RunBrokenPrologue(MakeBackend, PrologueInputs(), NoChange);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(PrologueRejectTest, RejectsBadHeadCounts) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectPrologueRejectsBadHeadCounts(MakeBackend);
}

TEST(PrologueRejectTest, RejectsNullPointersAndNegativeCounts) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectPrologueRejectsNullPointersAndNegativeCounts(MakeBackend);
}

TEST(DecodeRejectTest, AcceptsTheUnbrokenInputs) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const absl::Status status =
      RunBrokenDecode(MakeBackend, DecodeInputsForRejects(), NoDecodeChange);
  EXPECT_TRUE(status.ok()) << status;
}

TEST(DecodeRejectTest, RejectsBadHeadCounts) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectDecodeRejectsBadHeadCounts(MakeBackend);
}

TEST(DecodeRejectTest, RejectsNullPointersAndNegativeCounts) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectDecodeRejectsNullPointersAndNegativeCounts(MakeBackend);
}

TEST(DecodeRejectTest, RejectsMisalignedOutputs) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectDecodeRejectsMisalignedOutputs(MakeBackend);
}

TEST(DecodeRejectTest, IgnoresEntriesPastTheLength) {
  if (CudaBackend::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  ExpectDecodeIgnoresEntriesPastTheLength(MakeBackend);
}

// The copy contract of backend.h: the caller's memory may change as soon as
// CopyToDevice returns, copies of many sizes one after another each land
// where they were sent, and two writes of one buffer land in call order.
// (CopyToDevice and CopyToHost wait for their copy; the Async forms are
// tested below.)
TEST(CopyTest, UploadsTakeTheBytesAtOnceAndLandInOrder) {
  MAKE_CUDA_BACKEND(backend);
  const std::vector<int64_t> sizes = {1, 4096, 3 << 20, 3 << 20, 5 << 20, 257, 12 << 20, 7};
  std::vector<DeviceBuffer> buffers;
  std::vector<std::vector<uint8_t>> sent;
  std::vector<uint8_t> host;
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<DeviceBuffer> buffer = backend.Allocate(sizes[i]);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    host.assign(sizes[i], 0);
    for (int64_t b = 0; b < sizes[i]; ++b) host[b] = static_cast<uint8_t>(b * 7 + i * 31 + 1);
    ASSERT_TRUE(backend.CopyToDevice(buffer->data(), host.data(), sizes[i]).ok());
    sent.push_back(host);
    std::fill(host.begin(), host.end(), 0xee);  // the caller reuses its memory at once
    buffers.push_back(*std::move(buffer));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> back(sizes[i], 0);
    ASSERT_TRUE(backend.CopyToHost(back.data(), buffers[i].data(), sizes[i]).ok());
    EXPECT_EQ(back, sent[i]) << "copy " << i << " of " << sizes[i] << " bytes";
  }
  // The same device buffer written twice without a synchronisation between:
  // the second write wins.
  std::vector<uint8_t> first(4096, 1), second(4096, 2), back(4096, 0);
  ASSERT_TRUE(backend.CopyToDevice(buffers[1].data(), first.data(), 4096).ok());
  ASSERT_TRUE(backend.CopyToDevice(buffers[1].data(), second.data(), 4096).ok());
  ASSERT_TRUE(backend.CopyToHost(back.data(), buffers[1].data(), 4096).ok());
  EXPECT_EQ(back, second);
}

// Memory the caller mapped itself (a client's shared-memory region, here
// an anonymous mapping) is copied from directly once a HostPinner pinned
// it, and no longer after Unpin; a queued copy from it lands by the join.
// AllocateHost's memory is copied from directly as it is.
TEST(CopyTest, PinnedHostMemoryIsCopiedFromDirectly) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kBytes = int64_t{4} << 20;
  void* mapped = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(mapped);
  for (int64_t b = 0; b < kBytes; ++b) bytes[b] = static_cast<uint8_t>(b * 11 + 3);
  std::shared_ptr<HostPinner> pinner = backend.MakeHostPinner();
  ASSERT_NE(pinner, nullptr);
  EXPECT_FALSE(backend.CopiesDirectlyFrom(mapped));
  ASSERT_TRUE(pinner->Pin(mapped, kBytes).ok());
  EXPECT_TRUE(backend.CopiesDirectlyFrom(mapped));
  EXPECT_TRUE(backend.CopiesDirectlyFrom(bytes + kBytes / 2)) << "inside the pinned range";
  absl::StatusOr<DeviceBuffer> device = backend.Allocate(kBytes);
  ASSERT_TRUE(device.ok());
  ASSERT_TRUE(backend.CopyToDeviceQueued(device->data(), mapped, kBytes).ok());
  ASSERT_TRUE(backend.JoinCopies().ok());
  ASSERT_TRUE(backend.Synchronize().ok());
  std::vector<uint8_t> back(kBytes, 0);
  ASSERT_TRUE(backend.CopyToHost(back.data(), device->data(), kBytes).ok());
  EXPECT_EQ(std::memcmp(back.data(), mapped, kBytes), 0);
  pinner->Unpin(mapped);
  EXPECT_FALSE(backend.CopiesDirectlyFrom(mapped));
  munmap(mapped, kBytes);
  absl::StatusOr<DeviceBuffer> host = backend.AllocateHost(4096);
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(backend.CopiesDirectlyFrom(host->data()));
  EXPECT_FALSE(backend.CopiesDirectlyFrom(back.data())) << "ordinary heap memory";
}

// The Async copies: pinned staging, a round trip without waiting between
// the two copies, the bytes in place after Synchronize; and the marks
// around them measure the stream's time (a round trip of 8 MiB takes more
// than a microsecond and less than a second).
TEST(CopyTest, AsyncCopiesLandByTheNextSynchronizeAndMarksTimeThem) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kBytes = int64_t{8} << 20;
  absl::StatusOr<DeviceBuffer> staging = backend.AllocateHost(kBytes);
  absl::StatusOr<DeviceBuffer> answer = backend.AllocateHost(kBytes);
  absl::StatusOr<DeviceBuffer> device = backend.Allocate(kBytes);
  ASSERT_TRUE(staging.ok() && answer.ok() && device.ok());
  uint8_t* in = staging->as<uint8_t>();
  uint8_t* out = answer->as<uint8_t>();
  for (int64_t b = 0; b < kBytes; ++b) in[b] = static_cast<uint8_t>(b * 13 + 5);
  std::memset(out, 0xee, kBytes);
  ASSERT_TRUE(backend.Mark(0).ok());
  ASSERT_TRUE(backend.CopyToDeviceAsync(device->data(), in, kBytes).ok());
  ASSERT_TRUE(backend.Mark(1).ok());
  ASSERT_TRUE(backend.CopyToHostAsync(out, device->data(), kBytes).ok());
  ASSERT_TRUE(backend.Mark(2).ok());
  ASSERT_TRUE(backend.Synchronize().ok());
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0);
  for (auto [from, to] : {std::pair<int, int>{0, 1}, {1, 2}}) {
    EXPECT_GT(backend.MarkedMicros(from, to), 1) << from << ".." << to;
    EXPECT_LT(backend.MarkedMicros(from, to), 1e6) << from << ".." << to;
  }
  EXPECT_EQ(backend.MarkedMicros(0, 5), 0) << "mark 5 was never set";
  EXPECT_EQ(backend.Mark(ComputeBackend::kMaxMarks).code(), absl::StatusCode::kInvalidArgument);
}

// WaitForMark waits for the work before its mark only: the copy back of a
// first buffer is complete while a later one may still be on its way.
TEST(CopyTest, WaitForMarkWaitsForTheWorkBeforeItsMark) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kBytes = int64_t{8} << 20;
  absl::StatusOr<DeviceBuffer> staging = backend.AllocateHost(2 * kBytes);
  absl::StatusOr<DeviceBuffer> answer = backend.AllocateHost(2 * kBytes);
  absl::StatusOr<DeviceBuffer> device = backend.Allocate(2 * kBytes);
  ASSERT_TRUE(staging.ok() && answer.ok() && device.ok());
  uint8_t* in = staging->as<uint8_t>();
  uint8_t* out = answer->as<uint8_t>();
  uint8_t* on_device = device->as<uint8_t>();
  for (int64_t b = 0; b < 2 * kBytes; ++b) in[b] = static_cast<uint8_t>(b * 7 + 3);
  std::memset(out, 0xee, 2 * kBytes);
  EXPECT_TRUE(backend.WaitForMark(9).ok()) << "a mark not set has nothing to wait for";
  for (int part = 0; part < 2; ++part) {
    ASSERT_TRUE(backend.Mark(8 * part).ok());
    ASSERT_TRUE(backend.CopyToDeviceAsync(on_device + part * kBytes, in + part * kBytes, kBytes).ok());
    ASSERT_TRUE(backend.CopyToHostAsync(out + part * kBytes, on_device + part * kBytes, kBytes).ok());
    ASSERT_TRUE(backend.Mark(8 * part + 1).ok());
  }
  ASSERT_TRUE(backend.WaitForMark(1).ok());
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0);
  EXPECT_GT(backend.MarkedMicros(0, 1), 1);
  ASSERT_TRUE(backend.WaitForMark(9).ok());
  EXPECT_EQ(std::memcmp(in + kBytes, out + kBytes, kBytes), 0);
  EXPECT_GT(backend.MarkedMicros(8, 9), 1);
  EXPECT_EQ(backend.WaitForMark(ComputeBackend::kMaxMarks).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend.Synchronize().ok());
}

// A copy on the copy queue has landed before what the main queue does after
// JoinCopies: the read back on the main queue sees every byte (without the
// join it would start at once and read the buffer's zeros). MarkCopies
// marks the copy queue's order.
TEST(CopyTest, TheCopyQueueJoinsTheMainQueue) {
  MAKE_CUDA_BACKEND(backend);
  constexpr int64_t kBytes = int64_t{64} << 20;  // more than a millisecond at 50 GB/s
  absl::StatusOr<DeviceBuffer> staging = backend.AllocateHost(kBytes);
  absl::StatusOr<DeviceBuffer> answer = backend.AllocateHost(kBytes);
  absl::StatusOr<DeviceBuffer> device = backend.Allocate(kBytes);  // zero-filled
  ASSERT_TRUE(staging.ok() && answer.ok() && device.ok());
  uint8_t* in = staging->as<uint8_t>();
  uint8_t* out = answer->as<uint8_t>();
  for (int64_t b = 0; b < kBytes; ++b) in[b] = static_cast<uint8_t>(b * 5 + 1) | 1;
  std::memset(out, 0xee, kBytes);
  ASSERT_TRUE(backend.MarkCopies(0).ok());
  ASSERT_TRUE(backend.CopyToDeviceQueued(device->data(), in, kBytes).ok());
  ASSERT_TRUE(backend.MarkCopies(1).ok());
  ASSERT_TRUE(backend.JoinCopies().ok());
  ASSERT_TRUE(backend.CopyToHostAsync(out, device->data(), kBytes).ok());
  ASSERT_TRUE(backend.Mark(2).ok());
  ASSERT_TRUE(backend.WaitForMark(2).ok());
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0) << "the read back did not wait for the queued copy";
  EXPECT_GT(backend.MarkedMicros(0, 1), 100);
  EXPECT_TRUE(backend.Synchronize().ok());
}

// Memory() is the device's own count: it grows by (at least) what is
// allocated, and used stays within total.
TEST(MemoryTest, TheDeviceCountsWhatIsAllocated) {
  MAKE_CUDA_BACKEND(backend);
  const std::optional<ComputeBackend::MemoryInfo> before = backend.Memory();
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(before->used, 0) << "the context alone uses some";
  EXPECT_LE(before->used, before->total);
  constexpr int64_t kBytes = int64_t{1} << 30;
  absl::StatusOr<DeviceBuffer> buffer = backend.Allocate(kBytes);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::optional<ComputeBackend::MemoryInfo> after = backend.Memory();
  ASSERT_TRUE(after.has_value());
  EXPECT_GE(after->used - before->used, kBytes);
  EXPECT_EQ(after->total, before->total);
}

// The CUDA key lists equal the host's (kernels/key_lists.cc) bit for bit on
// random tables: every rule (top-k with pads, C128A, none), positions before
// and past the window and the ring's wrap, widths that are not a multiple
// of the CTA, and more tokens than SMs; the table writes before them too.
TEST(KeyListTest, MatchesTheHostOnRandomTables) {
  MAKE_CUDA_BACKEND(backend);
  std::mt19937 rng(4242);
  for (int width : {0, 1, 200, 1024}) {
    constexpr int kTables = 37;
    constexpr int kRingPages = 4;
    const int64_t tokens = 1500;
    std::vector<int32_t> pages;
    std::vector<int32_t> swa_at(kTables), compressed_at(kTables), rows(kTables);
    for (int table = 0; table < kTables; ++table) {
      swa_at[table] = static_cast<int32_t>(pages.size());
      for (int i = 0; i < kRingPages; ++i) pages.push_back(static_cast<int32_t>(rng() % 5000));
      compressed_at[table] = static_cast<int32_t>(pages.size());
      rows[table] = static_cast<int32_t>(rng() % 3000);
      for (int64_t i = 0; i < (rows[table] + 63) / 64; ++i) {
        pages.push_back(static_cast<int32_t>(rng() % 5000));
      }
    }
    std::vector<int32_t> positions(tokens), swa_table(tokens), compressed_table(tokens),
        rule(tokens), extra(tokens * width);
    for (int64_t t = 0; t < tokens; ++t) {
      const int table = static_cast<int>(rng() % kTables);
      swa_table[t] = swa_at[table];
      compressed_table[t] = compressed_at[table];
      const int kind = static_cast<int>(rng() % 3);
      if (kind == 0 && width > 0 && rows[table] > 0) {
        // C4A: rows below the table's, some -1.
        positions[t] = rows[table] * 4 + static_cast<int32_t>(rng() % 4);
        rule[t] = 1 + static_cast<int32_t>(rng() % width);
        for (int k = 0; k < width; ++k) {
          extra[t * width + k] =
              rng() % 5 == 0 ? -1 : static_cast<int32_t>(rng() % rows[table]);
        }
      } else if (kind == 1 && width > 0) {
        // C128A: (p + 1) / 128 visible rows, at most the width and the table's.
        const int32_t visible = static_cast<int32_t>(rng() % (std::min(width, rows[table]) + 1));
        positions[t] = visible * 128 + static_cast<int32_t>(rng() % 128);
        rule[t] = -128;
      } else {
        positions[t] = static_cast<int32_t>(rng() % 100000);
        rule[t] = 0;
      }
    }
    // The tables as a launch finds them: a third of the entries stale, set
    // by table writes (and two writes outside the tables, skipped).
    std::vector<int32_t> stale = pages, write_at, write_page;
    for (size_t i = 0; i < pages.size(); ++i) {
      if (rng() % 3 != 0) continue;
      stale[i] = static_cast<int32_t>(rng() % 5000);
      write_at.push_back(static_cast<int32_t>(i));
      write_page.push_back(pages[i]);
    }
    write_at.insert(write_at.end(), {-1, static_cast<int32_t>(pages.size())});
    write_page.insert(write_page.end(), {1, 1});
    // Host: in place in host vectors. Device: the same inputs uploaded.
    std::vector<int32_t> host_main(tokens * kSwaWindow, 9), host_main_len(tokens, 9),
        host_extra = extra, host_extra_len(tokens, 9), host_pages = stale;
    KeyListBuildParams host;
    host.num_tokens = tokens;
    host.positions = positions.data();
    host.pages = host_pages.data();
    host.num_pages = static_cast<int64_t>(pages.size());
    host.num_table_writes = static_cast<int64_t>(write_at.size());
    host.table_write_at = write_at.data();
    host.table_write_page = write_page.data();
    host.swa_ring_pages = kRingPages;
    host.swa_table = swa_table.data();
    host.compressed_table = compressed_table.data();
    host.extra_rule = rule.data();
    host.main_indices = host_main.data();
    host.main_lengths = host_main_len.data();
    host.extra_width = width;
    host.extra_indices = host_extra.data();
    host.extra_lengths = host_extra_len.data();
    ASSERT_TRUE(BuildKeyListsOnHost(host).ok());
    ASSERT_EQ(host_pages, pages) << "the host's table writes";

    std::vector<DeviceBuffer> keep;
    auto upload = [&](const std::vector<int32_t>& v) -> int32_t* {
      absl::StatusOr<DeviceBuffer> buffer = backend.Allocate(std::max<int64_t>(v.size(), 1) * 4);
      EXPECT_TRUE(buffer.ok());
      EXPECT_TRUE(backend.CopyToDevice(buffer->data(), v.data(), v.size() * 4).ok());
      keep.push_back(*std::move(buffer));
      return keep.back().as<int32_t>();
    };
    KeyListBuildParams device = host;
    device.positions = upload(positions);
    device.pages = upload(stale);
    device.table_write_at = upload(write_at);
    device.table_write_page = upload(write_page);
    device.swa_table = upload(swa_table);
    device.compressed_table = upload(compressed_table);
    device.extra_rule = upload(rule);
    device.main_indices = upload(std::vector<int32_t>(tokens * kSwaWindow, 7));
    device.main_lengths = upload(std::vector<int32_t>(tokens, 7));
    device.extra_indices = upload(extra);
    device.extra_lengths = upload(std::vector<int32_t>(tokens, 7));
    ASSERT_TRUE(backend.BuildKeyLists(device).ok());
    ASSERT_TRUE(backend.Synchronize().ok());
    auto download = [&](const int32_t* from, size_t count) {
      std::vector<int32_t> v(count);
      EXPECT_TRUE(backend.CopyToHost(v.data(), from, count * 4).ok());
      return v;
    };
    EXPECT_EQ(download(device.pages, pages.size()), pages) << "width " << width;
    EXPECT_EQ(download(device.main_indices, tokens * kSwaWindow), host_main) << "width " << width;
    EXPECT_EQ(download(device.main_lengths, tokens), host_main_len) << "width " << width;
    EXPECT_EQ(download(device.extra_indices, tokens * width), host_extra) << "width " << width;
    EXPECT_EQ(download(device.extra_lengths, tokens), host_extra_len) << "width " << width;
  }
}

}  // namespace
}  // namespace mla
