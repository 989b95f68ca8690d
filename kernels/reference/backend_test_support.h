// Test support shared by the backend tests
// (kernels/reference/cpu_backend_test.cc and
// kernels/cuda/cuda_backend_test.cc): random inputs with fixed seeds, backend
// memory through the ComputeBackend interface only, the test cases, and test
// bodies that hold any ComputeBackend to the float64 reference of
// kernels/reference/ under the tolerances of spec section 7.
//
// Inputs are never zero, with magnitudes that vary from tile to tile so that
// scales differ; every output is poisoned before a run (bf16 0xffff, NaN
// lse, and for the FP8 output NaN codes 0x7f and scale bytes 0xff) and
// compared in full afterwards, and pool bytes that must not be written hold
// random garbage that must survive. Test only.
#ifndef KERNELS_REFERENCE_BACKEND_TEST_SUPPORT_H_
#define KERNELS_REFERENCE_BACKEND_TEST_SUPPORT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/geometry.h"
#include "kernels/model_profile.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/rope.h"

namespace mla {
namespace backend_test {

// Past YaRN's original context (65536), so that long angles are exercised.
constexpr int32_t kMaxPosition = 70000;
constexpr uint16_t kPoisonBf16 = 0xffff;  // a NaN
constexpr uint8_t kPoisonE4m3 = 0x7f;     // a NaN
constexpr uint8_t kPoisonScale = 0xff;    // 2^128, no block's scale
// Powers of two, the multiples of 8 between them (24, 48, 96: section 6) and
// one count that pads (4).
constexpr int kHeadCounts[] = {4, 8, 16, 24, 32, 48, 64, 96, 128};
constexpr float kInf = std::numeric_limits<float>::infinity();

// A new backend for one run, or why none could be made (a failed device).
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<ComputeBackend>>()>;

// The plain or YaRN table of positions 0..kMaxPosition, built once.
const RopeTable& SharedTable(RopeKind kind);

// Random inputs from a fixed seed (std::mt19937_64).
class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}

  int64_t Uniform(int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(engine_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  double Normal() { return std::normal_distribution<double>()(engine_); }
  uint8_t Byte() { return static_cast<uint8_t>(engine_()); }

  // Bf16 rows whose 64-wide tiles have standard deviations spread over
  // 2^-8..2^4, so tile scales differ; about one tile in twenty lies wholly
  // below the 1e-4 floor of the scale, and about one value in a hundred is
  // 2^-12 of its tile's size, so e4m3 subnormals and (negative) zeros occur.
  // No value is zero.
  std::vector<uint16_t> Rows(int64_t count) {
    std::vector<uint16_t> rows(count * kHeadDim);
    for (int64_t r = 0; r < count; ++r) {
      for (int tile = 0; tile < kHeadDim / kQuantTile; ++tile) {
        const double sigma =
            Chance(0.05) ? 1e-6 : std::exp2(std::uniform_real_distribution<double>(-8, 4)(engine_));
        for (int i = 0; i < kQuantTile; ++i) {
          const double tiny = Chance(0.01) ? std::exp2(-12) : 1.0;
          uint16_t bits;
          do {
            bits = reference::RoundToBf16(Normal() * sigma * tiny);
          } while ((bits & 0x7fff) == 0);
          rows[r * kHeadDim + tile * kQuantTile + i] = bits;
        }
      }
    }
    return rows;
  }

  template <typename T>
  void Shuffle(std::vector<T>& values) {
    std::shuffle(values.begin(), values.end(), engine_);
  }

  // `count` distinct slots of a pool of `pool_slots`, every fourth one -1.
  std::vector<int32_t> InsertSlots(int64_t count, int64_t pool_slots) {
    std::vector<int32_t> all(pool_slots);
    for (int64_t s = 0; s < pool_slots; ++s) all[s] = static_cast<int32_t>(s);
    Shuffle(all);
    all.resize(count);
    for (int64_t r = 3; r < count; r += 4) all[r] = -1;
    return all;
  }

  std::vector<uint8_t> Garbage(int64_t bytes) {
    std::vector<uint8_t> out(bytes);
    for (uint8_t& b : out) b = Byte();
    return out;
  }

 private:
  std::mt19937_64 engine_;
};

// Backend memory for one test: arrays are copied in and read back through
// the ComputeBackend interface.
class DeviceArena {
 public:
  explicit DeviceArena(ComputeBackend& backend) : backend_(backend) {}

  template <typename T>
  T* Put(const std::vector<T>& host) {
    T* device = Zeros<T>(host.size());
    if (device == nullptr) return nullptr;
    const absl::Status copied = backend_.CopyToDevice(
        device, host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
    EXPECT_TRUE(copied.ok()) << copied;
    return device;
  }

  // `count` zero elements (Allocate's memory is zero-filled).
  template <typename T>
  T* Zeros(size_t count) {
    absl::StatusOr<DeviceBuffer> buffer =
        backend_.Allocate(static_cast<int64_t>(count * sizeof(T)));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    if (!buffer.ok()) return nullptr;
    T* device = buffer->as<T>();
    buffers_.push_back(std::move(*buffer));
    return device;
  }

  template <typename T>
  std::vector<T> Get(const T* device, size_t count) {
    std::vector<T> host(count);
    const absl::Status copied = backend_.CopyToHost(host.data(), device, count * sizeof(T));
    EXPECT_TRUE(copied.ok()) << copied;
    return host;
  }

  RopeTableView PutTable(const RopeTable& table) {
    std::vector<float> host(table.data(), table.data() + table.num_positions() * kRopeDim);
    return {Put(host), table.num_positions()};
  }

 private:
  ComputeBackend& backend_;
  std::vector<DeviceBuffer> buffers_;
};

// ---- Layer kinds of the built-in profiles.

// The first layer of one kind in one built-in profile.
struct LayerCase {
  const ModelProfile* profile;
  int layer;  // the first layer of its kind
  LayerKind kind;
  int ratio;
  RopeKind rope;

  std::string Name() const;  // the profile's last word, "_", the kind
};

// Every layer kind (SWA-only, C4A, C128A) of every built-in profile: 6 cases.
std::vector<LayerCase> LayerCases();

// ---- Inserts.

// Rows to insert into one pool, and the pool's bytes before the insert.
struct InsertBatch {
  std::vector<uint16_t> rows;
  std::vector<int32_t> positions;
  std::vector<int32_t> slots;
  std::vector<uint8_t> pool;  // random garbage where nothing may be written
  int64_t num_blocks = 0;

  int64_t num_rows() const { return static_cast<int64_t>(positions.size()); }
};

// Random rows at `positions` into random distinct slots of a garbage pool.
InsertBatch MakeInsert(Random& rng, std::vector<int32_t> positions, int64_t num_blocks);

// The batch in backend memory; `pool` is the batch's pool there, null puts
// batch.pool there.
KvInsertParams PutInsert(DeviceArena& arena, const InsertBatch& batch, uint8_t* pool = nullptr);

// The float64 reference of every row of the batch.
std::vector<reference::KvRowReference> ReferenceRows(const InsertBatch& batch,
                                                     const RopeTable& table);

// The inserted rows match the reference, and no other byte of the pool moved.
void ExpectInserted(const InsertBatch& batch, const std::vector<uint8_t>& after,
                    const RopeTable& table, absl::string_view subject);

// ---- Prologue on random inputs.

// One random prologue: a layer kind, H heads, N tokens, the seed of its inputs.
struct PrologueCase {
  LayerCase layer;
  int heads;
  int tokens;
  uint64_t seed;
};

// Every layer kind with every head count (N from 64 down to 1), seeds 1000+.
std::vector<PrologueCase> PrologueCases();

// Host inputs of one prologue case, made from its seed.
struct PrologueRandomInputs {
  std::vector<uint16_t> q;
  std::vector<int32_t> positions;
  InsertBatch swa;
  InsertBatch compressed;
};

// The inputs of case `c`: queries, positions (kMaxPosition and 0 among them),
// one SWA row per token and compressed rows at multiples of the ratio.
PrologueRandomInputs MakePrologueInputs(const PrologueCase& c);

// The prologue parameters of case `c` over `in` in backend memory, q_out
// poisoned.
PrologueParams PutPrologue(DeviceArena& arena, const PrologueCase& c,
                           const PrologueRandomInputs& in);

// Further checks after a prologue case matched the reference.
using PrologueCheck = std::function<void(const PrologueRandomInputs& in, DeviceArena& arena,
                                         const PrologueParams& params)>;

// Runs case `c` on `backend` and holds q_out and both pools to the reference;
// then, unless an assertion failed, `also_check` (when set).
void RunPrologueCase(ComputeBackend& backend, const PrologueCase& c,
                     const PrologueCheck& also_check = nullptr);

// gtest prints a parameter on failure: its name, not its bytes.
void PrintTo(const LayerCase& c, std::ostream* os);
void PrintTo(const PrologueCase& c, std::ostream* os);

// ---- Decode on random inputs.

// How the attention sinks of a decode case are set.
enum class SinkMode { kNone, kNegativeInfinity, kZero, kLarge, kMixed, kPerToken };

// The sink mode's part of a test name, e.g. "sinkmixed".
absl::string_view SinkModeName(SinkMode mode);

// Sinks of H heads ([N, H] for kPerToken, a different logit for every token
// and head); empty for kNone (the backend then gets a null pointer).
std::vector<float> MakeSinks(Random& rng, SinkMode mode, int heads, int64_t tokens);

// A pool of `num_blocks` whose every slot holds a reference row of random
// data; rows of compressed pools are rotated at multiples of the ratio.
std::vector<uint8_t> MakePool(Random& rng, int64_t num_blocks, int ratio, const RopeTable& table);

// One key list for N tokens.
struct KeyList {
  int width = 0;
  std::vector<int32_t> indices;
  std::vector<int32_t> lengths;  // empty: the backend gets null (every length is width)
  std::vector<uint8_t> pool;
  int64_t num_blocks = 0;
};

// Fills row t with `length` used entries (the width without explicit
// lengths) over the list's pool: -1 entries and repeated slots mixed in. The
// entries past the length hold values that would be invalid if read. An
// empty row is length 0, or all -1 without explicit lengths.
void FillKeyRow(Random& rng, KeyList& list, int64_t t, int length, bool empty);

// The key list in backend memory (default parameters for width 0).
KeyListParams PutKeyList(DeviceArena& arena, const KeyList& list);

// The key list as the float64 reference takes it.
reference::KeyListInputs KeyListInputsOf(const KeyList& list);

// One random decode: layer kind, H, N, sinks, de-rotation, lse, lengths,
// seed, and the output's format and place.
struct DecodeCase {
  LayerCase layer;
  int heads;
  int tokens;
  SinkMode sinks;
  bool derotate;
  bool want_lse;
  bool explicit_lengths;
  uint64_t seed;
  // Elements of poison before `out` in its buffer: 2 makes the view only
  // 4-byte aligned (callers may pass sub-views; the rest start aligned).
  // With fp8_output, bytes before out_e4m3 (a multiple of 16, its
  // alignment) and out_offset / 4 bytes before out_scales.
  int out_offset = 0;
  // The FP8 output (out_e4m3 and out_scales, spec section 5) instead of
  // bf16 out, held to CompareDecodeOutFp8.
  bool fp8_output = false;

  std::string Name() const;  // the test name
};

// Every layer kind with every head count; sink modes, de-rotation, lse and
// lengths cycle so that each combination of sink mode and de-rotation occurs
// (seeds 2000+), and a batch of one token (seed 2100).
std::vector<DecodeCase> DecodeCases();

// The FP8 output: every layer kind at two head counts each (4 to 128 over
// the six), de-rotation on and off for each kind, sink modes cycling, lse
// and lengths varied (seeds 2200+), one token, and output views that start
// 16 bytes (e4m3) and 4 bytes (scales) into their buffers.
std::vector<DecodeCase> Fp8DecodeCases();

// gtest prints a parameter on failure: its name and seed.
void PrintTo(const DecodeCase& c, std::ostream* os);

// Runs case `c` on `backend` and holds out (or the FP8 output) and lse to
// the reference; empty key sets give exactly 0 (FP8: 0x00 codes, scale byte
// 105), nothing is written outside the output views and no pool is written.
void RunDecodeCase(ComputeBackend& backend, const DecodeCase& c);

// ---- One realistic layer step: prologue, then decode over what it wrote.

// Tokens at consecutive positions near kMaxPosition; the SWA pool holds the
// window of each, the compressed pool the rows the layer kind attends (all
// j < (p+1)/128 for C128A, a top-k chosen among j < (p+1)/4 for C4A). The
// history is inserted first, then the step's own rows with its queries; the
// decode reads the backend's q_out and pools, and must match the reference,
// once with the bf16 output and once with the FP8 one.
void RunLayerStep(ComputeBackend& backend, const LayerCase& layer);

// ---- Bad parameters: InvalidArgument, nothing written.

// Host inputs of a small valid prologue, broken one way at a time by tests.
// Arrays are sized for 129 heads, so a backend that failed to reject a bad
// head count would still stay inside them (and be caught by the checks).
struct PrologueInputs {
  static constexpr int kTokens = 3;
  static constexpr int kHeads = 16;
  static constexpr int kRoomHeads = 129;

  PrologueInputs();  // seed 42

  Random rng;
  RopeTable table;
  std::vector<uint16_t> q;
  std::vector<int32_t> positions;
  InsertBatch swa;
  InsertBatch compressed;
};

// Runs the prologue on a new backend and `inputs` with `mutate` applied to its
// parameters, and returns its status after checking that q_out and both pools
// are untouched.
absl::Status RunBrokenPrologue(const BackendFactory& make_backend, const PrologueInputs& inputs,
                               const std::function<void(PrologueParams&)>& mutate);

// RunBrokenPrologue answers InvalidArgument; `what` names the breakage.
void ExpectPrologueRejected(const BackendFactory& make_backend, const PrologueInputs& inputs,
                            const std::function<void(PrologueParams&)>& mutate,
                            absl::string_view what);

// The mutation that breaks nothing.
void NoChange(PrologueParams&);

// Bad H and Hp are rejected.
void ExpectPrologueRejectsBadHeadCounts(const BackendFactory& make_backend);

// Null pointers and negative counts are rejected.
void ExpectPrologueRejectsNullPointersAndNegativeCounts(const BackendFactory& make_backend);

// Host inputs of a small valid decode, broken one way at a time by tests.
struct DecodeInputsForRejects {
  static constexpr int kTokens = 3;
  static constexpr int kHeads = 16;
  static constexpr int kRoomHeads = 129;

  DecodeInputsForRejects();  // seed 43

  Random rng;
  RopeTable table;
  std::vector<uint16_t> q;
  std::vector<int32_t> positions;
  std::vector<float> sinks;
  KeyList main;
  KeyList extra;
};

// What a decode wrote: out (bf16 bits) and lse of every token and head.
struct DecodeOutputs {
  std::vector<uint16_t> out;
  std::vector<float> lse;
};

// Runs the decode on a new backend and `inputs` with `mutate` applied to its
// parameters, and returns its status after checking that out, lse and the
// main pool are untouched when it failed. When it succeeded and `outputs` is
// given, waits for it (Synchronize, whose failure is returned) and fills
// `outputs`.
absl::Status RunBrokenDecode(const BackendFactory& make_backend,
                             const DecodeInputsForRejects& inputs,
                             const std::function<void(DecodeParams&)>& mutate,
                             DecodeOutputs* outputs = nullptr);

// RunBrokenDecode answers InvalidArgument; `what` names the breakage.
void ExpectDecodeRejected(const BackendFactory& make_backend, const DecodeInputsForRejects& inputs,
                          const std::function<void(DecodeParams&)>& mutate, absl::string_view what);

// The mutation that breaks nothing.
void NoDecodeChange(DecodeParams&);

// Bad H and Hp are rejected.
void ExpectDecodeRejectsBadHeadCounts(const BackendFactory& make_backend);

// Null pointers and negative counts are rejected, and so are outputs in
// both formats at once or half of the FP8 one.
void ExpectDecodeRejectsNullPointersAndNegativeCounts(const BackendFactory& make_backend);

// Outputs aligned less than the kernels write them (kDecodeOutAlignment and
// the others) are rejected, naming the field; those aligned as asked are not.
void ExpectDecodeRejectsMisalignedOutputs(const BackendFactory& make_backend);

// Entries past a token's length are never read, so they may hold anything.
void ExpectDecodeIgnoresEntriesPastTheLength(const BackendFactory& make_backend);

}  // namespace backend_test
}  // namespace mla

#endif  // KERNELS_REFERENCE_BACKEND_TEST_SUPPORT_H_
