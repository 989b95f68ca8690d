// Holds the CPU backend's outputs to the exact bits it produced at commit
// 4710f01 (before its kernels were rewritten for speed): the prologue's q_out
// and pool bytes, and the decode's out and lse (and, since the FP8 output
// came, its e4m3 and scale bytes, with the bf16 run's lse), on fixed seeded
// inputs that cover every layer kind (SWA-only, C4A, C128A key lists), sinks
// (none, per head, per token, -inf), de-rotation, padded heads, -1 entries,
// duplicate keys, several softmax chunks, empty key lists, and NaN,
// infinite, zero and huge inputs. Each output is compared by a 64-bit
// FNV-1a hash of its bytes, at 1, 2 and 3 threads.
//
// The inputs are made with integer and exactly rounded arithmetic only (no
// libm, no std distributions), so the goldens do not move with the C++
// library. kernels/reference/cpu_backend_test.cc holds the same backend to the
// float64 reference within the tolerances of spec section 7; this test pins
// the rounding itself, so that a faster kernel has to sum in the same order.
//
// When an intended change of the numbers lands, MLA_PRINT_BITS=1 prints the
// table of new goldens.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/bf16.h"
#include "kernels/cpu_backend.h"
#include "kernels/geometry.h"
#include "kernels/rope.h"

namespace mla {
namespace {

constexpr int kMaxPosition = 70000;  // past YaRN's original context

uint64_t Fnv1a(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t hash = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

template <typename T>
uint64_t HashOf(const std::vector<T>& values) {
  return Fnv1a(values.data(), values.size() * sizeof(T));
}

// Seeded inputs from std::mt19937_64's raw output, whose sequence the C++
// standard fixes.
class Inputs {
 public:
  explicit Inputs(uint64_t seed) : engine_(seed) {}

  uint64_t Bits() { return engine_(); }
  // Uniform in [low, high].
  int64_t Int(int64_t low, int64_t high) {
    return low + static_cast<int64_t>(Bits() % static_cast<uint64_t>(high - low + 1));
  }
  bool Chance(int per_mille) { return Int(0, 999) < per_mille; }
  // About normal (a sum of four uniforms), exactly computed from the bits.
  double Normalish() {
    double sum = 0;
    for (int i = 0; i < 4; ++i) sum += static_cast<double>(Bits() >> 11) * 0x1p-53;
    return (sum - 2.0) * 1.7320508075688772;
  }

  // A bf16 row whose 64-wide tiles have magnitudes 2^-12..2^5, some tiles far
  // below the 1e-4 scale floor, some values 2^-12 of their tile (e4m3
  // subnormals and negative zeros), and, at `special_per_mille`, NaN, +-inf,
  // zero or huge values.
  void Row(uint16_t* row, int special_per_mille) {
    for (int tile = 0; tile < kHeadDim / kQuantTile; ++tile) {
      const int exponent = Chance(50) ? -22 : static_cast<int>(Int(-12, 5));
      for (int i = 0; i < kQuantTile; ++i) {
        double value = std::ldexp(Normalish(), exponent - (Chance(10) ? 12 : 0));
        uint16_t bits = FloatToBf16(static_cast<float>(value));
        if (special_per_mille > 0 && Chance(special_per_mille)) bits = Special();
        row[tile * kQuantTile + i] = bits;
      }
    }
  }

  std::vector<uint16_t> Rows(int64_t count, int special_per_mille) {
    std::vector<uint16_t> rows(count * kHeadDim);
    for (int64_t r = 0; r < count; ++r) Row(&rows[r * kHeadDim], special_per_mille);
    return rows;
  }

  uint16_t Special() {
    switch (Int(0, 5)) {
      case 0:
        return 0x7fc0;  // NaN
      case 1:
        return 0x7f80;  // +inf
      case 2:
        return 0xff80;  // -inf
      case 3:
        return Chance(500) ? 0x0000 : 0x8000;  // +-0
      case 4:
        return 0x7f7f;  // the largest bf16
      default:
        return 0x0001;  // the smallest subnormal
    }
  }

  // A pool's bytes: e4m3 codes that are never NaN (unless `nan_rows`), scale
  // bytes around 2^0 with a few extremes, RoPE dims random bf16 values.
  std::vector<uint8_t> Pool(int64_t num_blocks, bool nan_rows) {
    std::vector<uint8_t> pool(num_blocks * kBlockBytes);
    for (uint8_t& byte : pool) byte = static_cast<uint8_t>(Bits());
    for (int64_t slot = 0; slot < num_blocks * kBlockTokens; ++slot) {
      uint8_t* data = pool.data() + SlotDataOffset(slot);
      uint8_t* scales = pool.data() + SlotScaleOffset(slot);
      const bool nan_row = nan_rows && Chance(1);
      for (int i = 0; i < kNopeDim; ++i) {
        if ((data[i] & 0x7f) == 0x7f && !nan_row) data[i] &= 0xfe;
      }
      for (int tile = 0; tile < kNopeTiles; ++tile) {
        scales[tile] = static_cast<uint8_t>(Chance(5) ? (Chance(500) ? 0 : 140) : Int(112, 130));
      }
      scales[kNopeTiles] = 0;
      for (int i = 0; i < kRopeDim; ++i) {
        uint16_t bits = FloatToBf16(static_cast<float>(std::ldexp(Normalish(), -4)));
        if (nan_row && Chance(100)) bits = Special();
        data[kNopeDim + 2 * i] = static_cast<uint8_t>(bits);
        data[kNopeDim + 2 * i + 1] = static_cast<uint8_t>(bits >> 8);
      }
    }
    return pool;
  }

 private:
  std::mt19937_64 engine_;
};

const RopeTable& Table(RopeKind kind) {
  static const RopeTable* plain = new RopeTable(RopeKind::kPlain, kMaxPosition);
  static const RopeTable* yarn = new RopeTable(RopeKind::kYarn, kMaxPosition);
  return kind == RopeKind::kPlain ? *plain : *yarn;
}

RopeTableView View(const RopeTable& table) { return {table.data(), table.num_positions()}; }

// Positions: small (SWA-only at the start of a sequence), or anywhere.
std::vector<int32_t> Positions(Inputs& in, int64_t count, int32_t max_position) {
  std::vector<int32_t> positions(count);
  for (int32_t& p : positions) p = static_cast<int32_t>(in.Int(0, max_position));
  return positions;
}

// ---- Prologue.

struct PrologueCase {
  std::string name;
  int tokens;
  int heads;
  int padded_heads;
  RopeKind rope;
  int32_t max_position;
  int special_per_mille;  // NaN, inf, zero and huge inputs
  int swa_rows;           // new SWA rows (0 or tokens)
  int compressed_rows;
};

std::vector<PrologueCase> PrologueCases() {
  return {
      {"swa_h16_service_path", 128, 16, 16, RopeKind::kPlain, 3, 0, 128, 0},
      {"swa_h16_long", 37, 16, 16, RopeKind::kPlain, kMaxPosition - 1, 0, 37, 0},
      {"c4a_h4_padded_to_8", 9, 4, 8, RopeKind::kYarn, kMaxPosition - 1, 0, 9, 3},
      {"c4a_h12_padded_to_16", 5, 12, 16, RopeKind::kYarn, 5000, 0, 5, 2},
      {"c128a_h64", 3, 64, 64, RopeKind::kYarn, kMaxPosition - 1, 0, 3, 1},
      {"h1_padded_to_8", 6, 1, 8, RopeKind::kPlain, 300, 0, 6, 0},
      {"h7_padded_to_8", 4, 7, 8, RopeKind::kYarn, 300, 0, 0, 4},
      {"h128", 2, 128, 128, RopeKind::kYarn, kMaxPosition - 1, 0, 2, 0},
      {"specials_h16", 17, 16, 16, RopeKind::kPlain, 1000, 2, 17, 5},
      {"specials_h5", 11, 5, 8, RopeKind::kYarn, kMaxPosition - 1, 6, 11, 11},
      {"no_rows", 3, 8, 8, RopeKind::kPlain, 10, 0, 0, 0},
  };
}

struct PrologueHashes {
  uint64_t q_out;
  uint64_t pool;
};

PrologueHashes RunPrologue(const PrologueCase& c, int threads) {
  Inputs in(Fnv1a(c.name.data(), c.name.size()));
  const RopeTable& table = Table(c.rope);
  std::vector<uint16_t> q = in.Rows(int64_t{c.tokens} * c.heads, c.special_per_mille);
  if (c.special_per_mille > 0) {
    // A head all zeros, one with a single huge value (squares overflow).
    std::fill(q.begin(), q.begin() + kHeadDim, uint16_t{0});
    if (q.size() > 2 * kHeadDim) q[kHeadDim + 5] = 0x7f7f;
  }
  std::vector<int32_t> positions = Positions(in, c.tokens, c.max_position);
  const int64_t num_blocks = 3;
  std::vector<uint8_t> pool(num_blocks * kBlockBytes);
  for (uint8_t& byte : pool) byte = static_cast<uint8_t>(in.Bits());

  // Distinct slots in one shared pool, every third one -1.
  std::vector<int32_t> all_slots(num_blocks * kBlockTokens);
  for (size_t s = 0; s < all_slots.size(); ++s) all_slots[s] = static_cast<int32_t>(s);
  for (size_t s = all_slots.size() - 1; s > 0; --s) {
    std::swap(all_slots[s], all_slots[in.Int(0, static_cast<int64_t>(s))]);
  }
  const int total_rows = c.swa_rows + c.compressed_rows;
  std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + total_rows);
  for (int r = 2; r < total_rows; r += 3) slots[r] = -1;
  std::vector<uint16_t> swa_rows = in.Rows(c.swa_rows, c.special_per_mille);
  std::vector<uint16_t> compressed_rows = in.Rows(c.compressed_rows, c.special_per_mille);
  std::vector<int32_t> compressed_positions = Positions(in, c.compressed_rows, c.max_position);

  std::vector<uint16_t> q_out(int64_t{c.tokens} * c.padded_heads * kHeadDim, 0xffff);
  PrologueParams p;
  p.num_tokens = c.tokens;
  p.num_heads = c.heads;
  p.padded_heads = c.padded_heads;
  p.q = q.data();
  p.positions = positions.data();
  p.q_out = q_out.data();
  p.rope = View(table);
  const CachePoolView view{pool.data(), num_blocks};
  p.swa = {c.swa_rows, swa_rows.data(), positions.data(), slots.data(), view};
  p.compressed = {c.compressed_rows, compressed_rows.data(), compressed_positions.data(),
                  slots.data() + c.swa_rows, view};
  CpuBackend backend(threads);
  const absl::Status status = backend.Prologue(p);
  EXPECT_TRUE(status.ok()) << status;
  return {HashOf(q_out), HashOf(pool)};
}

// ---- Decode.

struct DecodeCase {
  std::string name;
  int tokens;
  int heads;
  int padded_heads;
  int main_width;      // 0 or kSwaWindow
  int extra_width;     // 0, or the compressed list's width
  bool extra_lengths;  // C128A: per-token lengths of the extra list
  int sinks;           // 0 none, 1 per head, 2 per token
  bool derotate;
  bool want_lse;
  bool nan_inputs;  // NaN and infinite q elements and cache rows
  int max_keys;     // main list lengths are 0..max_keys
};

std::vector<DecodeCase> DecodeCases() {
  return {
      {"swa_h16_service_path", 128, 16, 16, kSwaWindow, 0, false, 0, false, true, false, 4},
      {"swa_h16_sinks_derotate", 40, 16, 16, kSwaWindow, 0, false, 2, true, true, false, 128},
      {"swa_h16_one_token", 1, 16, 16, kSwaWindow, 0, false, 1, false, true, false, 128},
      {"swa_h8_two_tokens", 2, 8, 8, kSwaWindow, 0, false, 1, true, true, false, 100},
      {"c4a_h16", 6, 16, 16, kSwaWindow, 512, false, 2, true, true, false, 128},
      {"c4a_h128", 2, 128, 128, kSwaWindow, 1024, false, 1, false, true, false, 128},
      {"c4a_h4_padded", 5, 4, 8, kSwaWindow, 512, false, 1, true, true, false, 70},
      {"c128a_h32", 7, 32, 32, kSwaWindow, 600, true, 2, true, true, false, 128},
      {"c128a_h6_padded_no_lse", 9, 6, 8, kSwaWindow, 200, true, 0, false, false, false, 65},
      {"h12_padded", 12, 12, 16, kSwaWindow, 0, false, 1, true, true, false, 64},
      {"extra_only", 4, 16, 16, 0, 300, true, 1, false, true, false, 0},
      {"nan_swa_h16", 64, 16, 16, kSwaWindow, 0, false, 2, true, true, true, 16},
      {"nan_c4a_h8", 6, 8, 8, kSwaWindow, 512, false, 1, true, true, true, 128},
  };
}

struct DecodeHashes {
  uint64_t out;
  uint64_t lse;
};

// With `fp8`, the FP8 output instead of bf16 out: the hash covers the
// e4m3 bytes, then the scale bytes.
DecodeHashes RunDecode(const DecodeCase& c, int threads, bool fp8 = false) {
  Inputs in(Fnv1a(c.name.data(), c.name.size()));
  const int64_t swa_blocks = 6;
  const int64_t compressed_blocks = 20;
  std::vector<uint8_t> swa_pool = in.Pool(swa_blocks, c.nan_inputs);
  std::vector<uint8_t> compressed_pool = in.Pool(compressed_blocks, c.nan_inputs);

  // q like the prologue's: unit RMS per head, scaled per token so that some
  // softmaxes are flat and some peaky; padded heads are zero.
  std::vector<uint16_t> q(int64_t{c.tokens} * c.padded_heads * kHeadDim, 0);
  for (int t = 0; t < c.tokens; ++t) {
    const int exponent = static_cast<int>(in.Int(-3, 3));
    for (int h = 0; h < c.heads; ++h) {
      uint16_t* row = &q[(int64_t{t} * c.padded_heads + h) * kHeadDim];
      for (int d = 0; d < kHeadDim; ++d) {
        row[d] = FloatToBf16(static_cast<float>(std::ldexp(in.Normalish(), exponent)));
        if (c.nan_inputs && in.Chance(1)) row[d] = in.Special();
      }
    }
  }

  std::vector<int32_t> main_indices(int64_t{c.tokens} * c.main_width, -1);
  std::vector<int32_t> main_lengths(c.tokens, 0);
  for (int t = 0; t < c.tokens && c.main_width > 0; ++t) {
    // Token 3 of a batch has no keys at all (lse +inf).
    main_lengths[t] = t == 3 ? 0 : static_cast<int32_t>(in.Int(1, c.max_keys));
    for (int k = 0; k < main_lengths[t]; ++k) {
      main_indices[int64_t{t} * c.main_width + k] =
          in.Chance(80) ? -1 : static_cast<int32_t>(in.Int(0, swa_blocks * kBlockTokens - 1));
    }
  }
  std::vector<int32_t> extra_indices(int64_t{c.tokens} * c.extra_width, -1);
  std::vector<int32_t> extra_lengths(c.tokens, c.extra_width);
  for (int t = 0; t < c.tokens && c.extra_width > 0; ++t) {
    if (c.extra_lengths) {
      extra_lengths[t] = t == 3 ? 0 : static_cast<int32_t>(in.Int(0, c.extra_width));
    }
    const int32_t valid = static_cast<int32_t>(in.Int(0, c.extra_width));
    for (int k = 0; k < c.extra_width; ++k) {
      // Valid entries first, -1 after (an indexer's top-k), a few
      // duplicates and a few -1 among them.
      if (k >= valid || in.Chance(30)) continue;
      extra_indices[int64_t{t} * c.extra_width + k] =
          in.Chance(20) && k > 0
              ? extra_indices[int64_t{t} * c.extra_width + k - 1]
              : static_cast<int32_t>(in.Int(0, compressed_blocks * kBlockTokens - 1));
    }
  }
  std::vector<float> sinks(c.sinks == 2 ? c.tokens * c.heads : c.heads);
  for (size_t i = 0; i < sinks.size(); ++i) {
    sinks[i] = in.Chance(100) ? -std::numeric_limits<float>::infinity()
                              : static_cast<float>(std::ldexp(in.Normalish(), 2));
  }
  const RopeTable& table = Table(c.extra_width > 0 ? RopeKind::kYarn : RopeKind::kPlain);
  std::vector<int32_t> positions = Positions(in, c.tokens, kMaxPosition - 1);

  std::vector<uint16_t> out(int64_t{c.tokens} * c.heads * kHeadDim, 0xffff);
  // [e4m3 [N, H, 512] | scales [N, H, 4]], poisoned.
  std::vector<uint8_t> fp8_out(int64_t{c.tokens} * c.heads * (kFp8RowBytes + kFp8ScaleRowBytes),
                               0x7f);
  std::vector<float> lse(int64_t{c.tokens} * c.heads, std::numeric_limits<float>::quiet_NaN());
  DecodeParams p;
  p.num_tokens = c.tokens;
  p.num_heads = c.heads;
  p.padded_heads = c.padded_heads;
  p.q = q.data();
  p.softmax_scale = 0.04419417382415922f;
  p.sinks = c.sinks == 0 ? nullptr : sinks.data();
  p.sinks_per_token = c.sinks == 2;
  p.main = {c.main_width, main_indices.data(), main_lengths.data(), {swa_pool.data(), swa_blocks}};
  p.extra = {c.extra_width,
             extra_indices.data(),
             c.extra_lengths ? extra_lengths.data() : nullptr,
             {compressed_pool.data(), compressed_blocks}};
  p.derotate = c.derotate;
  p.positions = positions.data();
  p.rope = View(table);
  if (fp8) {
    p.out_e4m3 = fp8_out.data();
    p.out_scales = fp8_out.data() + int64_t{c.tokens} * c.heads * kFp8RowBytes;
  } else {
    p.out = out.data();
  }
  p.lse = c.want_lse ? lse.data() : nullptr;
  CpuBackend backend(threads);
  const absl::Status status = backend.Decode(p);
  EXPECT_TRUE(status.ok()) << status;
  return {fp8 ? HashOf(fp8_out) : HashOf(out), c.want_lse ? HashOf(lse) : 0};
}

// ---- The goldens, from the backend of commit 4710f01.

struct PrologueGolden {
  const char* name;
  PrologueHashes hashes;
};
struct DecodeGolden {
  const char* name;
  DecodeHashes hashes;
};

constexpr PrologueGolden kPrologueGoldens[] = {
    {"swa_h16_service_path", {0x421f13d5207f3a04ull, 0x3f93e9b4818867a2ull}},
    {"swa_h16_long", {0x7b041d8aeee1caf1ull, 0x968225d826cc540bull}},
    {"c4a_h4_padded_to_8", {0x227680b6d22ffb3bull, 0xd9a7d770f0d6dcd2ull}},
    {"c4a_h12_padded_to_16", {0x8ae5b3709683a629ull, 0xfcddbb3f3d41b309ull}},
    {"c128a_h64", {0xe163e50f3b8c0aceull, 0xf87274bd590b831full}},
    {"h1_padded_to_8", {0x901c6c22aa21304cull, 0x47ccd0df14beb1d8ull}},
    {"h7_padded_to_8", {0x72202be4be75c036ull, 0x5656d272afab90c0ull}},
    {"h128", {0xd045be8e725e4e50ull, 0x5b73770223e0ae19ull}},
    {"specials_h16", {0x80d852710c4f037eull, 0x998758bcb8347cd4ull}},
    {"specials_h5", {0x51f92708acb4011eull, 0xa049a6a2a57de86bull}},
    {"no_rows", {0x26277926f7425005ull, 0xfa8b7fded2353f24ull}},
};

constexpr DecodeGolden kDecodeGoldens[] = {
    {"swa_h16_service_path", {0x20210dec588bc15bull, 0x2253b2621ab33a0eull}},
    {"swa_h16_sinks_derotate", {0x438567cc31b53414ull, 0xae070903e5e02ecbull}},
    {"swa_h16_one_token", {0x05a67fe0c6cf92f8ull, 0x5b8de4efd232c0d5ull}},
    {"swa_h8_two_tokens", {0xdd6ab6e5557149cdull, 0x68e7137fbe9cbcbdull}},
    {"c4a_h16", {0x292d6715a465f867ull, 0x1aa5f56ec8f71a4bull}},
    {"c4a_h128", {0x4cf35174b268b883ull, 0x9d63f207ba8e5e08ull}},
    {"c4a_h4_padded", {0x4698695fb092a638ull, 0xc5f690716d562434ull}},
    {"c128a_h32", {0xbdf02bb1029f5507ull, 0x39b7ce01f1c7982dull}},
    {"c128a_h6_padded_no_lse", {0x1165a4ad20f43c57ull, 0x0000000000000000ull}},
    {"h12_padded", {0xd9dbb91a3790272eull, 0xa483daf0fb58f4abull}},
    {"extra_only", {0xb4c94eef7b4316a9ull, 0x681b2255bcffaec7ull}},
    {"nan_swa_h16", {0x04660b916f8660a1ull, 0xbe529938623d0c67ull}},
    {"nan_c4a_h8", {0x5550e7d1ef2844beull, 0x5c42b06bf037dd89ull}},
};

// The FP8 output (e4m3 then scale bytes) of the same cases, from the
// backend that introduced it; the lse is the bf16 run's (kDecodeGoldens).
constexpr DecodeGolden kFp8DecodeGoldens[] = {
    {"swa_h16_service_path", {0x1534f0b2a4b6db36ull, 0x2253b2621ab33a0eull}},
    {"swa_h16_sinks_derotate", {0xd21c8a248a5d3663ull, 0xae070903e5e02ecbull}},
    {"swa_h16_one_token", {0x74befeae035efc14ull, 0x5b8de4efd232c0d5ull}},
    {"swa_h8_two_tokens", {0x7b3dd46f19c7b039ull, 0x68e7137fbe9cbcbdull}},
    {"c4a_h16", {0x1002ca577209559dull, 0x1aa5f56ec8f71a4bull}},
    {"c4a_h128", {0xdec0a72f57929d7cull, 0x9d63f207ba8e5e08ull}},
    {"c4a_h4_padded", {0x952add80a1f3e83full, 0xc5f690716d562434ull}},
    {"c128a_h32", {0x85110e30b57418c8ull, 0x39b7ce01f1c7982dull}},
    {"c128a_h6_padded_no_lse", {0xabb85caad54909ccull, 0x0000000000000000ull}},
    {"h12_padded", {0xb9fb91f21dfad75cull, 0xa483daf0fb58f4abull}},
    {"extra_only", {0x72d727eb390c8857ull, 0x681b2255bcffaec7ull}},
    {"nan_swa_h16", {0x0b6c11aefbee9667ull, 0xbe529938623d0c67ull}},
    {"nan_c4a_h8", {0x7b24a52d22a31ef2ull, 0x5c42b06bf037dd89ull}},
};

bool PrintWanted() {
  const char* print = std::getenv("MLA_PRINT_BITS");
  return print != nullptr && std::string(print) == "1";
}

TEST(CpuBackendBitsTest, PrologueMatchesGoldens) {
  std::string table;
  for (const PrologueCase& c : PrologueCases()) {
    const PrologueHashes got = RunPrologue(c, 2);
    absl::StrAppend(&table, absl::StrFormat("    {\"%s\", {0x%016xull, 0x%016xull}},\n", c.name,
                                            got.q_out, got.pool));
  }
  if (PrintWanted()) std::printf("%s", table.c_str());
  for (const PrologueCase& c : PrologueCases()) {
    const PrologueGolden* golden = nullptr;
    for (const PrologueGolden& g : kPrologueGoldens) {
      if (c.name == g.name) golden = &g;
    }
    ASSERT_NE(golden, nullptr) << c.name << " has no golden";
    for (int threads : {1, 2, 3}) {
      const PrologueHashes got = RunPrologue(c, threads);
      EXPECT_EQ(got.q_out, golden->hashes.q_out) << c.name << " q_out, " << threads << " threads";
      EXPECT_EQ(got.pool, golden->hashes.pool) << c.name << " pool, " << threads << " threads";
    }
  }
}

TEST(CpuBackendBitsTest, DecodeMatchesGoldens) {
  std::string table;
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeHashes got = RunDecode(c, 2);
    absl::StrAppend(&table, absl::StrFormat("    {\"%s\", {0x%016xull, 0x%016xull}},\n", c.name,
                                            got.out, got.lse));
  }
  if (PrintWanted()) std::printf("%s", table.c_str());
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeGolden* golden = nullptr;
    for (const DecodeGolden& g : kDecodeGoldens) {
      if (c.name == g.name) golden = &g;
    }
    ASSERT_NE(golden, nullptr) << c.name << " has no golden";
    for (int threads : {1, 2, 3}) {
      const DecodeHashes got = RunDecode(c, threads);
      EXPECT_EQ(got.out, golden->hashes.out) << c.name << " out, " << threads << " threads";
      EXPECT_EQ(got.lse, golden->hashes.lse) << c.name << " lse, " << threads << " threads";
    }
  }
}

// The FP8 output quantises the fp32 o whose bf16 rounding is out: its
// bits are pinned the same way, at any thread count, and the lse is the
// bf16 run's bit for bit.
TEST(CpuBackendBitsTest, Fp8DecodeMatchesGoldens) {
  std::string table;
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeHashes got = RunDecode(c, 2, /*fp8=*/true);
    absl::StrAppend(&table, absl::StrFormat("    {\"%s\", {0x%016xull, 0x%016xull}},\n", c.name,
                                            got.out, got.lse));
  }
  if (PrintWanted()) std::printf("%s", table.c_str());
  for (const DecodeCase& c : DecodeCases()) {
    const DecodeGolden* golden = nullptr;
    const DecodeGolden* bf16 = nullptr;
    for (const DecodeGolden& g : kFp8DecodeGoldens) {
      if (c.name == g.name) golden = &g;
    }
    for (const DecodeGolden& g : kDecodeGoldens) {
      if (c.name == g.name) bf16 = &g;
    }
    ASSERT_NE(golden, nullptr) << c.name << " has no FP8 golden";
    ASSERT_NE(bf16, nullptr) << c.name << " has no golden";
    EXPECT_EQ(golden->hashes.lse, bf16->hashes.lse) << c.name << ": the FP8 lse is the bf16 one";
    for (int threads : {1, 2, 3}) {
      const DecodeHashes got = RunDecode(c, threads, /*fp8=*/true);
      EXPECT_EQ(got.out, golden->hashes.out) << c.name << " fp8 out, " << threads << " threads";
      EXPECT_EQ(got.lse, bf16->hashes.lse) << c.name << " lse, " << threads << " threads";
    }
  }
}

}  // namespace
}  // namespace mla
