// The compute backend interface: the two operations of one attention layer
// step (spec sections 4 and 5) and the memory they run on.
//
// A backend owns an address space (host memory for the CPU backend, one GPU
// for the CUDA backend). Every pointer inside PrologueParams, DecodeParams
// and KeyListBuildParams points into that space: callers allocate with
// Allocate() and move bytes with CopyToDevice()/CopyToHost() or their Async
// forms. BuildKeyLists(), Prologue(), Decode() and the Async copies may run
// asynchronously and in order; Synchronize() waits for all of them and
// reports the first failure. Mark() notes points in that order:
// WaitForMark() waits for the work before one of them only (so that one
// launch's answer can be read while the next one runs), and afterwards
// MarkedMicros() says how long the work between two took. The structure of
// the parameters (counts, head counts, null pointers) is checked on every
// call and a bad one is InvalidArgument with nothing written; the values inside index and slot arrays are the caller's
// contract (spec section 5): check them with kernels/validation.h first.
//
// A backend object is used by one thread at a time (the server gives each
// device one engine thread); it may use many threads internally.
#ifndef MLA_OFFLOAD_KERNELS_BACKEND_H_
#define MLA_OFFLOAD_KERNELS_BACKEND_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cache_format.h"

namespace mla {

// A RoPE table (kernels/rope.h) in backend memory: rows [num_positions][64].
struct RopeTableView {
  const float* data = nullptr;
  int64_t num_positions = 0;
};

// Rows to rotate, round to bf16, quantise and write into one pool.
struct KvInsertParams {
  int64_t num_rows = 0;
  const uint16_t* rows = nullptr;      // [num_rows, 512] bf16
  const int32_t* positions = nullptr;  // [num_rows] RoPE position of each row
  const int32_t* slots = nullptr;      // [num_rows] global slot; -1 writes nothing
  CachePoolView pool;
};

// Spec section 4 for one batch of tokens of one layer.
struct PrologueParams {
  int64_t num_tokens = 0;
  int num_heads = 0;     // H: heads present in q
  int padded_heads = 0;  // Hp: a supported head count >= H (kernels/head_padding.h)
  const uint16_t* q = nullptr;          // [N, H, 512] bf16, before the per-head norm
  const int32_t* positions = nullptr;   // [N] query positions
  uint16_t* q_out = nullptr;            // [N, Hp, 512] bf16; heads H..Hp-1 are +0
  float rms_norm_eps = 1e-6f;
  RopeTableView rope;                   // the layer's table
  KvInsertParams swa;                   // the tokens' new SWA rows (may be empty)
  KvInsertParams compressed;            // new compressed rows (may be empty)
};

// The keys of each token in one pool: row t of `indices` lists global slots,
// of which the first lengths[t] entries are used and -1 entries are skipped.
struct KeyListParams {
  int width = 0;                      // entries per token; 0 = no list (both lists
                                      // together at most kMaxKeysPerToken)
  const int32_t* indices = nullptr;   // [N, width]
  const int32_t* lengths = nullptr;   // [N], each in [0, width]; null = width
  CachePoolView pool;
};

// The most key entries a token's two lists may have together (main width +
// extra width): far above any model's (V4-Pro: 128 + 1024), and low enough
// that a kernel's int arithmetic on entry numbers cannot overflow.
inline constexpr int64_t kMaxKeysPerToken = int64_t{1} << 24;

// Spec section 5: sparse MLA decode with attention sink over two key lists
// (main = SWA, extra = compressed) that share one softmax.
struct DecodeParams {
  int64_t num_tokens = 0;
  int num_heads = 0;     // H: heads written to out and lse (the first H of q)
  int padded_heads = 0;  // Hp: heads in q (the prologue's q_out)
  const uint16_t* q = nullptr;  // [N, Hp, 512] bf16
  float softmax_scale = 0.0f;
  // Attention sink logits, fp32: [H] for every token, or [N, H] when
  // sinks_per_token (a batch mixing sessions or layers); null = no sink.
  const float* sinks = nullptr;
  bool sinks_per_token = false;
  KeyListParams main;
  KeyListParams extra;
  // De-rotate output dims 448..511 by the query position before rounding.
  bool derotate = false;
  const int32_t* positions = nullptr;  // [N]; needed when derotate
  RopeTableView rope;                  // needed when derotate
  // The output, in one of two formats (spec section 5), aligned as the
  // kernels write it (kDecodeOutAlignment and the others below;
  // CheckDecodeParams refuses less):
  // - bf16: out [N, H, 512], at least 4-byte aligned (out_e4m3 null);
  // - FP8 (out null): out_e4m3 [N, H, 512] e4m3fn, 16-byte aligned, and
  //   out_scales [N, H, 4] UE8M0 bytes, 4-byte aligned: block k of a head,
  //   dims 128k .. 128k + 127, is out_e4m3 * 2^(out_scales[k] - 127).
  uint16_t* out = nullptr;
  uint8_t* out_e4m3 = nullptr;
  uint8_t* out_scales = nullptr;
  float* lse = nullptr;  // [N, H] natural-log sum of exp; null = not wanted
};

// The byte alignment of DecodeParams' outputs: the CUDA kernels store out
// by 4-byte words at the least, out_e4m3 by 16-byte pieces, out_scales by
// words, lse by floats. A caller with memory aligned less (an answer region
// at the client's offset) decodes elsewhere and copies.
inline constexpr int64_t kDecodeOutAlignment = 4;
inline constexpr int64_t kDecodeE4m3Alignment = 16;
inline constexpr int64_t kDecodeScalesAlignment = 4;
inline constexpr int64_t kDecodeLseAlignment = 4;
// Whether `address` is a multiple of `alignment`.
inline bool AlignedTo(const void* address, int64_t alignment) {
  return reinterpret_cast<uintptr_t>(address) % static_cast<uintptr_t>(alignment) == 0;
}

// The key lists of a batch of decode tokens (DecodeParams::main and ::extra,
// spec section 5), built by the backend from the sessions' page tables, so
// that the host never translates a key to its slot. Row r of a page table
// that starts at pages[at] has the global slot
// pages[at + r / kBlockTokens] * kBlockTokens + r % kBlockTokens.
// For token t at position p:
// - main (kSwaWindow wide): the SWA rows of positions max(0, p - 127)..p in
//   order, then -1; length p - max(0, p - 127) + 1. The SWA row of position
//   w is row w % (swa_ring_pages * kBlockTokens) of the token's SWA table.
// - extra (extra_width wide), by extra_rule[t]:
//     K > 0: a C4A token; entries 0..K-1 of its extra row hold the indexer's
//            top-k compressed rows on entry (-1 pads) and their slots on
//            return (-1 stays -1); length K;
//     -R < 0: a C128A token (compress ratio R): every compressed row
//            j < (p + 1) / R; length (p + 1) / R;
//     0:     no compressed keys; length 0.
//   Every other entry becomes -1.
// Before the lists are built, the table writes set entries of `pages`:
// pages[table_write_at[i]] = table_write_page[i] for i < num_table_writes
// (the server keeps its page tables in backend memory between launches and
// sends only the entries that changed); a write at an entry outside
// 0..num_pages-1 is skipped.
// The values (tables, rows, positions) are the caller's contract: every row
// named must have its page in the table.
struct KeyListBuildParams {
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;         // [N]
  int32_t* pages = nullptr;                   // the page tables: [num_pages]
  int64_t num_pages = 0;
  int64_t num_table_writes = 0;
  const int32_t* table_write_at = nullptr;    // [num_table_writes] entries of pages
  const int32_t* table_write_page = nullptr;  // [num_table_writes] what they become
  int swa_ring_pages = 0;                     // pages of an SWA table (ring)
  const int32_t* swa_table = nullptr;         // [N] index in pages of the token's SWA table
  const int32_t* compressed_table = nullptr;  // [N] ... of its compressed table
  const int32_t* extra_rule = nullptr;        // [N] see above
  int32_t* main_indices = nullptr;            // [N, kSwaWindow] written
  int32_t* main_lengths = nullptr;            // [N] written
  int extra_width = 0;
  int32_t* extra_indices = nullptr;           // [N, extra_width] read (top-k rows) and written
  int32_t* extra_lengths = nullptr;           // [N] written
};

// Memory owned by a backend; released when destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(void* data, int64_t bytes, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void Reset();

  void* data_ = nullptr;
  int64_t bytes_ = 0;
  std::function<void(void*)> release_;
};

// Makes host memory that its caller mapped itself (a client's shared-memory
// region) as fast to copy to and from the device as AllocateHost's: pinned
// on a GPU (cudaHostRegister), so that copies from it go by DMA and
// asynchronously. Thread-safe, callable from any thread, and independent of
// the backend that made it (it may outlive it). Unpin takes what Pin pinned.
class HostPinner {
 public:
  virtual ~HostPinner() = default;
  virtual absl::Status Pin(void* data, int64_t bytes) = 0;
  virtual void Unpin(void* data) = 0;
};

// Device memory of this host that another process exported (a CUDA IPC
// memory handle), opened for a backend's kernels and copies: `data` is
// device memory the backend reaches (its own GPU's, or a peer GPU's), never
// host memory; `bytes` is the whole allocation as it was exported, from
// `data` on. `mapping` closes it when its last copy goes, on whichever
// thread that is.
struct ImportedMemory {
  std::shared_ptr<const void> mapping;
  uint8_t* data = nullptr;
  int64_t bytes = 0;
};

// Opens device memory that another process of this host exported, for one
// backend. Thread-safe, callable from any thread, and independent of the
// backend that made it (it may outlive it).
class DeviceImporter {
 public:
  virtual ~DeviceImporter() = default;
  // `handle` is a cudaIpcMemHandle_t's bytes, `device_uuid` the UUID of the
  // GPU the memory is on as nvidia-smi -L prints it ("GPU-" and 36
  // characters). INVALID_ARGUMENT for a malformed handle or UUID, or one
  // the driver refuses to open; NOT_FOUND for a UUID of no GPU of this host;
  // FAILED_PRECONDITION for a GPU the backend's cannot reach (no peer
  // access).
  virtual absl::StatusOr<ImportedMemory> Import(absl::string_view handle,
                                                absl::string_view device_uuid) = 0;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // A line for logs and server info, e.g. "cpu (2 threads)".
  virtual std::string Describe() const = 0;

  // True when backend memory is ordinary host memory (no copies needed).
  virtual bool host_accessible() const = 0;

  // The device's memory as the device reports it (on a GPU every process's
  // use counts, the CUDA context's included); nullopt for a backend whose
  // memory is the host's.
  struct MemoryInfo {
    int64_t used = 0;
    int64_t total = 0;
  };
  virtual std::optional<MemoryInfo> Memory() const { return std::nullopt; }

  // Zero-filled memory in the backend's address space.
  virtual absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) = 0;
  // Host memory that CopyToDevice and CopyToHost move fastest (page-locked
  // on a GPU, so copies go by DMA without a staging bounce); contents
  // undefined. The default is ordinary heap memory.
  virtual absl::StatusOr<DeviceBuffer> AllocateHost(int64_t bytes);
  // What pins host memory for this backend's copies; null for a backend
  // whose memory is the host's (the default: nothing to pin).
  virtual std::shared_ptr<HostPinner> MakeHostPinner() const { return nullptr; }
  // What opens other processes' device memory for this backend (CUDA IPC);
  // null for a backend without device memory (the default).
  virtual std::shared_ptr<DeviceImporter> MakeDeviceImporter() const { return nullptr; }
  // Whether CopyToDevice*'s `host_src` at `data` is memory the device copies
  // from directly (AllocateHost's, pinned by a HostPinner, or device memory
  // a DeviceImporter opened), so that a copy from it may be queued without
  // staging it first. The default: false.
  virtual bool CopiesDirectlyFrom(const void* data) const { return false; }
  // Returns once `host_src` may be reused; the bytes are in place for every
  // later Prologue/Decode (and copy) of this backend, in call order.
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
  // Returns with the bytes in `host_dst`, after everything issued before.
  virtual absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;
  // The same copies, in order with the other work and possibly not done on
  // return: `host_src` must stay unchanged, and `host_dst` holds the bytes,
  // only once the next Synchronize(), or a WaitForMark() of a mark set after
  // the copy, has returned OK. Fastest from and into
  // AllocateHost memory. The host side of these two and of
  // CopyToDeviceQueued may also be device memory a DeviceImporter opened
  // (the copy then runs on the device). The defaults copy at once.
  virtual absl::Status CopyToDeviceAsync(void* device_dst, const void* host_src, int64_t bytes);
  virtual absl::Status CopyToHostAsync(void* host_dst, const void* device_src, int64_t bytes);
  // The copy queue: copies to the device that run beside the other work (on
  // a GPU a second stream), so that the next launch's inputs go in while
  // this one computes. CopyToDeviceQueued enqueues one there (host_src must
  // stay unchanged until a mark after it has been waited for); MarkCopies
  // sets a mark in the copy queue's order; JoinCopies makes everything
  // issued after it wait for every copy queued before it, and the work a
  // queued copy overwrites must have finished before it is queued. The
  // defaults have one queue: CopyToDeviceAsync, Mark, nothing.
  virtual absl::Status CopyToDeviceQueued(void* device_dst, const void* host_src, int64_t bytes);
  virtual absl::Status MarkCopies(int mark);
  virtual absl::Status JoinCopies();

  // Builds the key lists (KeyListBuildParams). The default runs on the host
  // (BuildKeyListsOnHost, kernels/key_lists.h) and serves backends whose
  // memory is host memory; others must override it.
  virtual absl::Status BuildKeyLists(const KeyListBuildParams& params);

  virtual absl::Status Prologue(const PrologueParams& params) = 0;
  virtual absl::Status Decode(const DecodeParams& params) = 0;

  // A layer step: Prologue(prologue), then Decode(decode) of the same tokens
  // and heads with decode.q the prologue's q_out. A backend may fuse the two
  // (the CUDA one makes the query rows inside the decode, which starts while
  // the inserts run): out, lse and the cache are then as the two calls leave
  // them, but q_out's contents are unspecified. The default makes the two
  // calls.
  virtual absl::Status PrologueAndDecode(const PrologueParams& prologue,
                                         const DecodeParams& decode);

  // Waits for every operation issued so far.
  virtual absl::Status Synchronize() = 0;

  // Mark(i) (0 <= i < kMaxMarks) notes the point at which everything issued
  // before it has finished, replacing the last mark i; MarkedMicros(a, b),
  // after a Synchronize() or WaitForMark() that followed both, is the time
  // from mark a to mark b in microseconds (0 for a mark not set). The
  // defaults read the host's clock when Mark is called, which is right for a
  // backend whose operations are done when they return.
  static constexpr int kMaxMarks = 16;
  virtual absl::Status Mark(int mark);
  virtual double MarkedMicros(int from, int to) const;
  // Waits until everything issued before the last Mark(mark) has finished,
  // but not for what was issued after it (work of a later launch may still
  // run); a failure of the device while it waited is returned (the owning
  // thread's next Synchronize clears it). A mark not set has nothing to wait
  // for. Unlike every other call, WaitForMark and then MarkedMicros of marks
  // before it may be called from one other thread while the owning thread
  // issues work, as long as that thread does not set those marks again
  // meanwhile. The default returns at once: operations are done when they
  // return.
  virtual absl::Status WaitForMark(int mark);

 protected:
  // InvalidArgument unless 0 <= mark < kMaxMarks (for Mark's overrides).
  static absl::Status CheckMark(int mark);

 private:
  std::chrono::steady_clock::time_point host_marks_[kMaxMarks] = {};
};

// Structural checks shared by every backend (no element of any array is read).
absl::Status CheckPrologueParams(const PrologueParams& params);
absl::Status CheckDecodeParams(const DecodeParams& params);
absl::Status CheckKeyListBuildParams(const KeyListBuildParams& params);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_BACKEND_H_
