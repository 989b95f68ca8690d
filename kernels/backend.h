// The compute backend interface: the two operations of one attention layer
// step (spec sections 4 and 5) and the memory they run on.
//
// A backend owns an address space (host memory for the CPU backend, one GPU
// for the CUDA backend). Every pointer inside PrologueParams and DecodeParams
// points into that space: callers allocate with Allocate() and move bytes with
// CopyToDevice()/CopyToHost(). Prologue() and Decode() may run asynchronously
// and in order; Synchronize() waits for all of them and reports the first
// failure. The structure of the parameters (counts, head counts, null
// pointers) is checked on every call and a bad one is InvalidArgument with
// nothing written; the values inside index and slot arrays are the caller's
// contract (spec section 5): check them with kernels/validation.h first.
//
// A backend object is used by one thread at a time (the server gives each
// device one engine thread); it may use many threads internally.
#ifndef MLA_OFFLOAD_KERNELS_BACKEND_H_
#define MLA_OFFLOAD_KERNELS_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  uint16_t* out = nullptr;  // [N, H, 512] bf16, at least 4-byte aligned
  float* lse = nullptr;     // [N, H] natural-log sum of exp; null = not wanted
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

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // A line for logs and server info, e.g. "cpu (2 threads)".
  virtual std::string Describe() const = 0;

  // True when backend memory is ordinary host memory (no copies needed).
  virtual bool host_accessible() const = 0;

  // Zero-filled memory in the backend's address space.
  virtual absl::StatusOr<DeviceBuffer> Allocate(int64_t bytes) = 0;
  // Host memory that CopyToDevice and CopyToHost move fastest (page-locked
  // on a GPU, so copies go by DMA without a staging bounce); contents
  // undefined. The default is ordinary heap memory.
  virtual absl::StatusOr<DeviceBuffer> AllocateHost(int64_t bytes);
  // Returns once `host_src` may be reused; the bytes are in place for every
  // later Prologue/Decode (and copy) of this backend, in call order.
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) = 0;
  // Returns with the bytes in `host_dst`, after everything issued before.
  virtual absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) = 0;

  virtual absl::Status Prologue(const PrologueParams& params) = 0;
  virtual absl::Status Decode(const DecodeParams& params) = 0;

  // Waits for every operation issued so far.
  virtual absl::Status Synchronize() = 0;
};

// Structural checks shared by every backend (no element of any array is read).
absl::Status CheckPrologueParams(const PrologueParams& params);
absl::Status CheckDecodeParams(const DecodeParams& params);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_BACKEND_H_
