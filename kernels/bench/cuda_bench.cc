// Benchmark of the CUDA backend (kernels/cuda) on one GPU, with the ceilings
// it is judged against, measured in the same run.
//
//   cuda_bench [--out=results.json] [--iters=50] [--commit=abc123]
//              [--b=1,2,4,8,16,64,128,512] [--heads=8,16,...,128] [--prologue=1]
//              [--decode=1]
// (--b and --heads keep only those decode shapes, --prologue=0 skips the
// prologue shapes and --decode=0 the decode's: for profiling one shape or
// an A/B of one kernel; RESULTS.md holds full runs.
// --help prints the flags; a flag it does not know is refused.)
//
// Ceilings: a device-to-device cudaMemcpy of 2 GiB (bytes read + written per
// second), and an 8192^3 bf16 matmul through cuBLAS (cublasGemmEx, fp32
// accumulation) when libcublas.so can be opened at run time (dlopen: the
// toolkit ships no static cuBLAS here); without it the matmul ceiling is the
// 770 TFLOP/s of shared/notes/build.md, marked "not measured".
//
// Decode: b tokens, H heads, 128 SWA entries + topk compressed entries per
// token, every entry a distinct random slot of a 1M-slot pool (613 MB, about
// 12 times the L2), 8 index sets rotated between launches so that no launch
// finds the previous one's rows in L2. Times are the median of `iters`
// launches, each timed with CUDA events around the backend's Decode (the main
// kernel and, when the keys are split, the combine kernel).
// Head counts 8, 16, 32, 64 (and 128 for V4-Pro) at every b; 24 and 48, the
// counts between them (spec section 6), at b = 128 unless --heads names them.
// At b = 128 each decode shape also runs
// - with the FP8 output (op "decode_fp8": out_e4m3 and out_scales instead of
//   bf16 out), and
// - as a layer step with its prologue (b tokens' q, b SWA rows and b/4
//   compressed rows inserted): op "prologue+decode" is the backend's
//   PrologueAndDecode (fused: the inserts, then the decode making the query
//   rows while they run), op "prologue;decode" the two calls one after the
//   other (the decode reading the prologue's q_out); beside "decode" they
//   show what the prologue adds.
// FLOPs: 4 * H * 512 per key entry (2*512 for q.K, 2*512 for P.V, real heads
// only, padding heads not counted). Bytes: 584 per key entry (the cache row;
// q, indices and out are not counted).
//
// Gather ceiling: the same cache rows read at random slots of the pool by a
// kernel that does nothing else (kernels/bench/gather_ceiling.cu): what the
// decode's "GB/s of cache rows" can reach at best on this access pattern.
// Then the same gather spread in other ways (the "gather sweep" lines): rows
// in flight an SM, the warps that issue them, and shared memory held (less
// L1), the resources a decode kernel trades for its other work; then the
// copy engine's bulk copies (TMA) into shared memory, by one or by several
// independent streams of stages a CTA.
//
// Prologue: b tokens of H heads, b SWA rows and b/4 compressed rows (one per
// 4 tokens, as a C4A layer makes them). Bytes: q read + q_out written +
// KV rows read (1 KiB each) + cache rows written (584 B each).
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cublas_api.h"
#include "kernels/bench/gather_ceiling.h"
#include "kernels/bf16.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kernels.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/rope.h"

namespace mla {
namespace {

#define CHECK_CUDA(call)                                                              \
  do {                                                                                \
    cudaError_t error_ = (call);                                                      \
    if (error_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(error_));                                       \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

#define CHECK_OK(expr)                                                                \
  do {                                                                                \
    absl::Status status_ = (expr);                                                    \
    if (!status_.ok()) {                                                              \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, status_.ToString().c_str()); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time in microseconds of `iters` runs of fn(i), each between events.
template <typename Fn>
double TimeUs(int iters, cudaStream_t stream, Fn fn) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) fn(i);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    fn(i);
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1000.0);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return Median(times);
}

// Median time of one fn(i) in microseconds: fn(0..kLaunches-1) is captured
// into a CUDA graph on `stream` (back-to-back launches, no host gaps), and
// each of `iters` replays is timed with events; time per replay / kLaunches.
constexpr int kLaunches = 8;
template <typename Fn>
double TimeGraphUs(int iters, cudaStream_t stream, Fn fn) {
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < kLaunches; ++i) fn(i);
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const double us = TimeUs(iters, stream, [&](int) { CHECK_CUDA(cudaGraphLaunch(exec, stream)); });
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return us / kLaunches;
}

// Device memory holding `bytes` of host data.
DeviceBuffer Put(CudaBackend& backend, const void* data, size_t bytes) {
  absl::StatusOr<DeviceBuffer> buffer = backend.Allocate(bytes);
  CHECK_OK(buffer.status());
  CHECK_OK(backend.CopyToDevice(buffer->data(), data, bytes));
  return std::move(*buffer);
}

double CopyCeilingGbps(int iters) {
  const size_t bytes = static_cast<size_t>(2) << 30;
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  const double us = TimeUs(iters, nullptr, [&](int) {
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr));
  });
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * bytes / (us * 1e-6) / 1e9;
}

// cuBLAS through dlopen; returns 0 when it cannot be loaded.
double MatmulCeilingTflops(int iters, std::string* note) {
  void* lib = dlopen("libcublas.so.13", RTLD_NOW);
  if (lib == nullptr) lib = dlopen("libcublas.so", RTLD_NOW);
  if (lib == nullptr) {
    *note = std::string("cuBLAS not loadable: ") + dlerror();
    return 0.0;
  }
  auto create = reinterpret_cast<decltype(&cublasCreate_v2)>(dlsym(lib, "cublasCreate_v2"));
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  auto gemm = reinterpret_cast<GemmEx>(dlsym(lib, "cublasGemmEx"));
  auto destroy = reinterpret_cast<decltype(&cublasDestroy_v2)>(dlsym(lib, "cublasDestroy_v2"));
  if (create == nullptr || gemm == nullptr || destroy == nullptr) {
    *note = "cuBLAS symbols missing";
    return 0.0;
  }
  cublasHandle_t handle;
  if (create(&handle) != CUBLAS_STATUS_SUCCESS) {
    *note = "cublasCreate failed";
    return 0.0;
  }
  const int n = 8192;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<uint16_t> host(elems);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < 1 << 20; ++i) host[i] = FloatToBf16(normal(rng));
  for (size_t i = 1 << 20; i < elems; ++i) host[i] = host[(i * 2654435761u) % (1 << 20)];
  void *a, *b, *c;
  CHECK_CUDA(cudaMalloc(&a, elems * 2));
  CHECK_CUDA(cudaMalloc(&b, elems * 2));
  CHECK_CUDA(cudaMalloc(&c, elems * 2));
  CHECK_CUDA(cudaMemcpy(a, host.data(), elems * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(b, host.data(), elems * 2, cudaMemcpyHostToDevice));
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t last = CUBLAS_STATUS_SUCCESS;
  const double us = TimeUs(iters, nullptr, [&](int) {
    last = gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b,
                CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT);
  });
  destroy(handle);
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(c));
  if (last != CUBLAS_STATUS_SUCCESS) {
    *note = "cublasGemmEx failed";
    return 0.0;
  }
  *note = "measured: cublasGemmEx 8192^3 bf16, fp32 accumulation";
  return 2.0 * n * static_cast<double>(n) * n / (us * 1e-6) / 1e12;
}

struct Result {
  std::string model, op;
  int heads = 0, tokens = 0, topk_main = 0, topk_extra = 0;
  double time_us = 0, tflops = 0, gbps = 0;
};

std::vector<uint16_t> RandomBf16(size_t count, uint64_t seed, float sigma) {
  std::vector<uint16_t> out(count);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  for (uint16_t& v : out) {
    do {
      v = FloatToBf16(normal(rng));
    } while ((v & 0x7fff) == 0);
  }
  return out;
}

// The inputs of a prologue of b tokens of H heads (Hp padded) in device
// memory: q from seed q_seed, b SWA rows and b/4 compressed rows (one per 4
// tokens, as a C4A layer makes them) from kv_seed, at random slots of a
// pool of pool_slots drawn from rng; Params() fills all but q_out.
class PrologueInputs {
 public:
  PrologueInputs(CudaBackend& backend, int b, int heads, int hp, uint64_t q_seed, uint64_t kv_seed,
                 std::mt19937_64& rng, int64_t pool_slots)
      : b_(b), heads_(heads), hp_(hp), compressed_rows_(b / 4) {
    const std::vector<uint16_t> q = RandomBf16(static_cast<size_t>(b) * heads * kHeadDim, q_seed, 1.0f);
    const std::vector<uint16_t> kv =
        RandomBf16(static_cast<size_t>(b + compressed_rows_) * kHeadDim, kv_seed, 1.0f);
    std::vector<int32_t> positions(b), slots(b), cpos(compressed_rows_), cslots(compressed_rows_);
    for (int i = 0; i < b; ++i) {
      positions[i] = 100000 + i;
      slots[i] = static_cast<int32_t>(rng() % pool_slots);
    }
    for (int i = 0; i < compressed_rows_; ++i) {
      cpos[i] = 4 * i;
      cslots[i] = static_cast<int32_t>(rng() % pool_slots);
    }
    q_ = Put(backend, q.data(), q.size() * 2);
    kv_ = Put(backend, kv.data(), kv.size() * 2);
    positions_ = Put(backend, positions.data(), b * 4);
    slots_ = Put(backend, slots.data(), b * 4);
    compressed_positions_ = Put(backend, cpos.data(), compressed_rows_ * 4);
    compressed_slots_ = Put(backend, cslots.data(), compressed_rows_ * 4);
  }

  int compressed_rows() const { return compressed_rows_; }

  PrologueParams Params(const RopeTableView& rope, const DeviceBuffer& pool,
                        int64_t pool_blocks) const {
    PrologueParams p;
    p.num_tokens = b_;
    p.num_heads = heads_;
    p.padded_heads = hp_;
    p.q = q_.as<uint16_t>();
    p.positions = positions_.as<int32_t>();
    p.rope = rope;
    p.swa = {b_, kv_.as<uint16_t>(), positions_.as<int32_t>(), slots_.as<int32_t>(),
             {pool.as<uint8_t>(), pool_blocks}};
    p.compressed = {compressed_rows_, kv_.as<uint16_t>() + static_cast<size_t>(b_) * kHeadDim,
                    compressed_positions_.as<int32_t>(), compressed_slots_.as<int32_t>(),
                    {pool.as<uint8_t>(), pool_blocks}};
    return p;
  }

 private:
  int b_, heads_, hp_, compressed_rows_;
  DeviceBuffer q_, kv_, positions_, slots_, compressed_positions_, compressed_slots_;
};


constexpr char kUsage[] =
    "cuda_bench: the CUDA backend's decode and prologue on GPU 0, with the copy,\n"
    "matmul and random-row gather ceilings measured in the same run\n"
    "(kernels/bench/RESULTS.md says how to read it).\n"
    "\n"
    "  --out=FILE        results.json to write (default results.json)\n"
    "  --iters=N         graph replays a shape, the median is taken (default 50)\n"
    "  --commit=REV      the commit recorded in results.json (default unknown)\n"
    "  --b=LIST          decode batch sizes to run, of 1,2,4,8,16,64,128,512 (default all)\n"
    "  --heads=LIST      decode head counts to run, multiples of 8 from 8 to 128\n"
    "                    (default 8,16,32,64,128 at every b and 24,48 at b=128)\n"
    "  --prologue=0|1    run the prologue shapes (default 1)\n"
    "  --decode=0|1      run the decode shapes (default 1)\n"
    "  --help            this text\n";

struct Options {
  std::string out_path = "results.json";
  std::string commit = "unknown";
  int iters = 50;
  std::vector<int> only_b, only_heads;  // empty: all
  bool run_prologue = true;
  bool run_decode = true;
};

// A comma-separated list of values, each one of `allowed`; an error message
// naming the flag when it is not.
std::string ParseList(const std::string& flag, const std::string& text,
                      const std::vector<int>& allowed, std::vector<int>* values) {
  std::string allowed_text;
  for (int a : allowed) allowed_text += (allowed_text.empty() ? "" : ",") + std::to_string(a);
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' ||
        std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
      return flag + " takes values of " + allowed_text + ", not '" + item + "'";
    }
    values->push_back(static_cast<int>(value));
    start = comma + 1;
  }
  return "";
}

// The options, or an error message (empty when they parsed).
std::string ParseOptions(int argc, char** argv, Options* options, bool* help) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value_of = [&](const char* flag) -> const char* {
      const size_t n = std::strlen(flag);
      return arg.compare(0, n, flag) == 0 ? arg.c_str() + n : nullptr;
    };
    std::string error;
    if (arg == "--help" || arg == "-h") {
      *help = true;
    } else if (const char* v = value_of("--out=")) {
      options->out_path = v;
      if (options->out_path.empty()) error = "--out takes a file name";
    } else if (const char* v = value_of("--iters=")) {
      char* end = nullptr;
      const long iters = std::strtol(v, &end, 10);
      if (*v == '\0' || *end != '\0' || iters < 1 || iters > 100000) {
        error = std::string("--iters takes a count of 1 to 100000, not '") + v + "'";
      }
      options->iters = static_cast<int>(iters);
    } else if (const char* v = value_of("--commit=")) {
      options->commit = v;
    } else if (const char* v = value_of("--b=")) {
      error = ParseList("--b", v, {1, 2, 4, 8, 16, 64, 128, 512}, &options->only_b);
    } else if (const char* v = value_of("--heads=")) {
      error = ParseList("--heads", v,
                        std::vector<int>(kSupportedHeadCounts.begin(), kSupportedHeadCounts.end()),
                        &options->only_heads);
    } else if (const char* v = value_of("--prologue=")) {
      if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
        error = std::string("--prologue takes 0 or 1, not '") + v + "'";
      }
      options->run_prologue = std::strcmp(v, "1") == 0;
    } else if (const char* v = value_of("--decode=")) {
      if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
        error = std::string("--decode takes 0 or 1, not '") + v + "'";
      }
      options->run_decode = std::strcmp(v, "1") == 0;
    } else {
      error = "unknown flag '" + arg + "'";
    }
    if (!error.empty()) return error;
  }
  return "";
}

}  // namespace
}  // namespace mla

int main(int argc, char** argv) {
  using namespace mla;
  Options options;
  bool help = false;
  const std::string error = ParseOptions(argc, argv, &options, &help);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!error.empty()) {
    std::fprintf(stderr, "cuda_bench: %s\n\n%s", error.c_str(), kUsage);
    return 2;
  }
  const std::string& out_path = options.out_path;
  const std::string& commit = options.commit;
  const int iters = options.iters;
  const bool run_prologue = options.run_prologue;
  auto kept = [&](const std::vector<int>& list, int value) {
    return options.run_decode &&
           (list.empty() || std::find(list.begin(), list.end(), value) != list.end());
  };
  const std::vector<int>& only_b = options.only_b;
  const std::vector<int>& only_heads = options.only_heads;
  absl::StatusOr<std::unique_ptr<CudaBackend>> created = CudaBackend::Create(0);
  CHECK_OK(created.status());
  CudaBackend& backend = **created;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const std::string gpu = prop.name;
  const std::string decode_kernels = cuda::DecodeKernelsName(backend.decode_kernels());
  std::printf("device: %s, %d SMs, L2 %d MB, backend %s, decode kernels %s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, backend.Describe().c_str(),
              decode_kernels.c_str());

  const double copy_gbps = CopyCeilingGbps(20);
  std::string matmul_note;
  double matmul_tflops = MatmulCeilingTflops(20, &matmul_note);
  bool matmul_measured = matmul_tflops > 0;
  if (!matmul_measured) {
    matmul_note += "; using 770 TFLOP/s from shared/notes/build.md (not measured in this run)";
    matmul_tflops = 770.0;
  }
  std::printf("ceiling: device-to-device copy %.0f GB/s (read + write)\n", copy_gbps);
  std::printf("ceiling: bf16 matmul %.0f TFLOP/s (%s)\n", matmul_tflops, matmul_note.c_str());

  // The pool: 1M slots filled by the backend's own prologue (random rows).
  const int64_t pool_slots = int64_t{1} << 20;
  const int64_t pool_blocks = pool_slots / kBlockTokens;
  absl::StatusOr<DeviceBuffer> pool = backend.Allocate(pool_blocks * kBlockBytes);
  CHECK_OK(pool.status());
  const RopeTable table(RopeKind::kYarn, 1 << 17);
  std::vector<float> table_host(table.data(), table.data() + table.num_positions() * kRopeDim);
  absl::StatusOr<DeviceBuffer> table_device = backend.Allocate(table.bytes());
  CHECK_OK(table_device.status());
  CHECK_OK(backend.CopyToDevice(table_device->data(), table_host.data(), table.bytes()));
  const RopeTableView rope{table_device->as<float>(), table.num_positions()};
  {
    const int64_t batch = 65536;
    const std::vector<uint16_t> rows = RandomBf16(batch * kHeadDim, 11, 1.0f);
    std::vector<int32_t> positions(batch);
    std::mt19937 rng(5);
    for (int32_t& p : positions) p = static_cast<int32_t>(rng() % table.num_positions());
    absl::StatusOr<DeviceBuffer> d_rows = backend.Allocate(rows.size() * 2);
    absl::StatusOr<DeviceBuffer> d_pos = backend.Allocate(batch * 4);
    absl::StatusOr<DeviceBuffer> d_slots = backend.Allocate(batch * 4);
    CHECK_OK(d_rows.status());
    CHECK_OK(d_pos.status());
    CHECK_OK(d_slots.status());
    CHECK_OK(backend.CopyToDevice(d_rows->data(), rows.data(), rows.size() * 2));
    CHECK_OK(backend.CopyToDevice(d_pos->data(), positions.data(), batch * 4));
    std::vector<int32_t> slots(batch);
    for (int64_t first = 0; first < pool_slots; first += batch) {
      for (int64_t r = 0; r < batch; ++r) slots[r] = static_cast<int32_t>(first + r);
      CHECK_OK(backend.CopyToDevice(d_slots->data(), slots.data(), batch * 4));
      PrologueParams fill;
      fill.num_heads = 8;
      fill.padded_heads = 8;
      fill.rope = rope;
      fill.swa = {batch, d_rows->as<uint16_t>(), d_pos->as<int32_t>(), d_slots->as<int32_t>(),
                  {pool->as<uint8_t>(), pool_blocks}};
      CHECK_OK(backend.Prologue(fill));
      CHECK_OK(backend.Synchronize());
    }
  }

  // Ceiling 3: the cache rows of the decode shapes alone, read at random
  // slots of the same pool with nothing else done (8 sets of 128 x 640 rows,
  // rotated; 40 launches between two events).
  double gather_gbps = 0;
  {
    constexpr int64_t kRows = 128 * 640;
    constexpr int kGatherSets = 8, kLaunches = 40;
    std::vector<int32_t> slots(kRows * kGatherSets);
    std::mt19937_64 gather_rng(7);
    for (int32_t& slot : slots) slot = static_cast<int32_t>(gather_rng() % pool_slots);
    absl::StatusOr<DeviceBuffer> d_slots = backend.Allocate(slots.size() * 4);
    absl::StatusOr<DeviceBuffer> d_sink = backend.Allocate(4);
    CHECK_OK(d_slots.status());
    CHECK_OK(d_sink.status());
    CHECK_OK(backend.CopyToDevice(d_slots->data(), slots.data(), slots.size() * 4));
    cudaStream_t stream = static_cast<cudaStream_t>(backend.native_stream());
    // GB/s of cache rows read with `shape`.
    auto gather_rate = [&](const GatherShape& shape) {
      auto launch = [&](int i) {
        CHECK_CUDA(LaunchGatherRows(pool->as<uint8_t>(),
                                    d_slots->as<int32_t>() + (i % kGatherSets) * kRows, kRows,
                                    d_sink->as<uint32_t>(), prop.multiProcessorCount, shape,
                                    stream));
      };
      for (int i = 0; i < kGatherSets; ++i) launch(i);  // warm-up
      cudaEvent_t start, stop;
      CHECK_CUDA(cudaEventCreate(&start));
      CHECK_CUDA(cudaEventCreate(&stop));
      CHECK_CUDA(cudaEventRecord(start, stream));
      for (int i = 0; i < kLaunches; ++i) launch(i);
      CHECK_CUDA(cudaEventRecord(stop, stream));
      CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      CHECK_CUDA(cudaEventDestroy(start));
      CHECK_CUDA(cudaEventDestroy(stop));
      return kRows * static_cast<double>(kTokenBytes) / (1e-3 * ms / kLaunches) / 1e9;
    };
    gather_gbps = gather_rate(GatherShape{});
    std::printf("ceiling: random 584-byte row gather %.0f GB/s (%.1f us for %lld rows at random "
                "slots of the %.0f MB pool; %.0f%% of copy)\n",
                gather_gbps, kRows * static_cast<double>(kTokenBytes) / gather_gbps / 1e3,
                static_cast<long long>(kRows),
                pool_blocks * static_cast<double>(kBlockBytes) / 1e6, 100.0 * gather_gbps / copy_gbps);
    // The decode CTA (DecodeWgmmaKernel) holds 206,152 B of shared memory,
    // one an SM; its producers are 8 warps with 64 rows in flight. The bulk
    // lines (fifth field: stages, sixth: groups) ask whether the copy engine
    // lifts one CTA an SM above its own load path's rate, and whether that
    // takes more rows in flight or more streams waited for independently.
    const GatherShape sweep[] = {
        {1, 256, 4, 0},       {1, 256, 8, 0},      {1, 128, 16, 0},     {1, 128, 16, 206152},
        {1, 256, 8, 206152},  {1, 256, 16, 206152}, {2, 256, 8, 100000}, {8, 256, 4, 24000},
        {1, 64, 0, 0, 2},     {1, 128, 0, 0, 2},    {1, 128, 0, 0, 4},   {2, 128, 0, 0, 2},
        {4, 64, 0, 0, 1},     {1, 128, 0, 0, 2, 2}, {1, 256, 0, 0, 1, 4},
    };
    for (const GatherShape& shape : sweep) {
      const double gbps = gather_rate(shape);
      if (shape.bulk_stages > 0) {
        std::printf("gather sweep: %d CTA(s) x %3d threads an SM, bulk copies (TMA) by %d "
                    "group(s) a CTA, %d stage(s) of 64 rows a group (%3d rows in flight an SM): "
                    "%5.0f GB/s (%.0f%% of the ceiling)\n",
                    shape.ctas_per_sm, shape.threads, shape.bulk_groups, shape.bulk_stages,
                    shape.ctas_per_sm * shape.bulk_groups * shape.bulk_stages * 64, gbps,
                    100.0 * gbps / gather_gbps);
        continue;
      }
      std::printf("gather sweep: %d CTA(s) x %3d threads an SM, %2d rows a warp (%3d rows in flight "
                  "an SM), %6d B shared memory a CTA: %5.0f GB/s (%.0f%% of the ceiling)\n",
                  shape.ctas_per_sm, shape.threads, shape.rows_per_warp,
                  shape.ctas_per_sm * shape.threads / 32 * shape.rows_per_warp, shape.smem_bytes,
                  gbps, 100.0 * gbps / gather_gbps);
    }
  }

  std::vector<Result> results;
  constexpr int kSets = 8;
  struct DecodeShape {
    const char* model;
    int topk;
    int heads;
    bool every_b;  // false: b = 128 only, unless --heads names it
  };
  std::vector<DecodeShape> shapes;
  for (int h : {8, 16, 24, 32, 48, 64}) shapes.push_back({"V4-Flash", 512, h, h != 24 && h != 48});
  for (int h : {8, 16, 24, 32, 48, 64, 128}) {
    shapes.push_back({"V4-Pro", 1024, h, h != 24 && h != 48});
  }
  for (int h : only_heads) {  // a count of neither model's list
    bool listed = false;
    for (const DecodeShape& shape : shapes) listed |= shape.heads == h;
    if (!listed) {
      shapes.push_back({"V4-Flash", 512, h, true});
      shapes.push_back({"V4-Pro", 1024, h, true});
    }
  }
  std::mt19937_64 rng(99);
  // Few sequences decoding (1..16) as well as full batches.
  for (int b : {1, 2, 4, 8, 16, 64, 128, 512}) {
    if (!kept(only_b, b)) continue;
    for (const DecodeShape& shape : shapes) {
      if (!kept(only_heads, shape.heads)) continue;
      if (!shape.every_b && b != 128 && only_heads.empty()) continue;
      const int hp = *PaddedHeadCount(shape.heads);
      const int width_main = kSwaWindow, width_extra = shape.topk;
      // Index sets: distinct random slots (a partial shuffle of the pool).
      std::vector<int32_t> main_idx(static_cast<size_t>(kSets) * b * width_main);
      std::vector<int32_t> extra_idx(static_cast<size_t>(kSets) * b * width_extra);
      for (int32_t& v : main_idx) v = static_cast<int32_t>(rng() % pool_slots);
      for (int32_t& v : extra_idx) v = static_cast<int32_t>(rng() % pool_slots);
      const std::vector<uint16_t> q = RandomBf16(static_cast<size_t>(b) * hp * kHeadDim, 3, 1.0f);
      std::vector<float> sinks(shape.heads, 0.5f);
      absl::StatusOr<DeviceBuffer> d_main = backend.Allocate(main_idx.size() * 4);
      absl::StatusOr<DeviceBuffer> d_extra = backend.Allocate(extra_idx.size() * 4);
      absl::StatusOr<DeviceBuffer> d_q = backend.Allocate(q.size() * 2);
      absl::StatusOr<DeviceBuffer> d_sinks = backend.Allocate(sinks.size() * 4);
      absl::StatusOr<DeviceBuffer> d_out = backend.Allocate(static_cast<size_t>(b) * shape.heads * kHeadDim * 2);
      absl::StatusOr<DeviceBuffer> d_lse = backend.Allocate(static_cast<size_t>(b) * shape.heads * 4);
      for (auto* buffer : {&d_main, &d_extra, &d_q, &d_sinks, &d_out, &d_lse}) {
        CHECK_OK(buffer->status());
      }
      CHECK_OK(backend.CopyToDevice(d_main->data(), main_idx.data(), main_idx.size() * 4));
      CHECK_OK(backend.CopyToDevice(d_extra->data(), extra_idx.data(), extra_idx.size() * 4));
      CHECK_OK(backend.CopyToDevice(d_q->data(), q.data(), q.size() * 2));
      CHECK_OK(backend.CopyToDevice(d_sinks->data(), sinks.data(), sinks.size() * 4));
      DecodeParams p;
      p.num_tokens = b;
      p.num_heads = shape.heads;
      p.padded_heads = hp;
      p.q = d_q->as<uint16_t>();
      p.softmax_scale = 0.04419417382415922f;
      p.sinks = d_sinks->as<float>();
      p.main.width = width_main;
      p.main.pool = {pool->as<uint8_t>(), pool_blocks};
      p.extra.width = width_extra;
      p.extra.pool = {pool->as<uint8_t>(), pool_blocks};
      p.out = d_out->as<uint16_t>();
      p.lse = d_lse->as<float>();
      // Warm up once so that the scratch allocation happens outside timing.
      p.main.indices = d_main->as<int32_t>();
      p.extra.indices = d_extra->as<int32_t>();
      CHECK_OK(backend.Decode(p));
      CHECK_OK(backend.Synchronize());
      cudaStream_t stream = static_cast<cudaStream_t>(backend.native_stream());
      const double time_us = TimeGraphUs(iters, stream, [&](int i) {
        const int set = i % kSets;
        p.main.indices = d_main->as<int32_t>() + static_cast<size_t>(set) * b * width_main;
        p.extra.indices = d_extra->as<int32_t>() + static_cast<size_t>(set) * b * width_extra;
        CHECK_OK(backend.Decode(p));
      });
      CHECK_OK(backend.Synchronize());
      // A row of results.json and of the log: FLOPs and cache bytes are the
      // decode's, whatever else the op ran.
      auto record = [&](const char* op, double us) {
        Result r;
        r.model = shape.model;
        r.op = op;
        r.heads = shape.heads;
        r.tokens = b;
        r.topk_main = width_main;
        r.topk_extra = width_extra;
        r.time_us = us;
        const double keys = static_cast<double>(b) * (width_main + width_extra);
        r.tflops = 4.0 * shape.heads * kHeadDim * keys / (r.time_us * 1e-6) / 1e12;
        r.gbps = keys * kTokenBytes / (r.time_us * 1e-6) / 1e9;
        results.push_back(r);
        std::printf("%-15s %-8s H=%3d b=%3d topk=%4d+%4d: %9.1f us %7.2f TFLOP/s %7.0f GB/s (%.0f%% of copy, %.0f%% of gather)\n",
                    op, shape.model, shape.heads, b, width_main, width_extra, r.time_us,
                    r.tflops, r.gbps, 100.0 * r.gbps / copy_gbps, 100.0 * r.gbps / gather_gbps);
        std::fflush(stdout);
      };
      record("decode", time_us);
      if (b != 128) continue;
      auto rotated = [&](DecodeParams& params, int i) {
        const int set = i % kSets;
        params.main.indices = d_main->as<int32_t>() + static_cast<size_t>(set) * b * width_main;
        params.extra.indices = d_extra->as<int32_t>() + static_cast<size_t>(set) * b * width_extra;
      };
      {
        absl::StatusOr<DeviceBuffer> d_e4m3 = backend.Allocate(static_cast<size_t>(b) * shape.heads * kHeadDim);
        absl::StatusOr<DeviceBuffer> d_scales =
            backend.Allocate(static_cast<size_t>(b) * shape.heads * kOutputQuantBlocks);
        CHECK_OK(d_e4m3.status());
        CHECK_OK(d_scales.status());
        DecodeParams fp8 = p;
        fp8.out = nullptr;
        fp8.out_e4m3 = d_e4m3->as<uint8_t>();
        fp8.out_scales = d_scales->as<uint8_t>();
        record("decode_fp8", TimeGraphUs(iters, stream, [&](int i) {
                 rotated(fp8, i);
                 CHECK_OK(backend.Decode(fp8));
               }));
        CHECK_OK(backend.Synchronize());
      }
      if (!run_prologue) continue;
      // The prologue of these b tokens: q of H heads in, q_out of Hp heads
      // the decode reads; its rows inserted at random slots of the pool
      // (random rows over random rows).
      const PrologueInputs inputs(backend, b, shape.heads, hp, 23, 24, rng, pool_slots);
      PrologueParams pro = inputs.Params(rope, *pool, pool_blocks);
      pro.q_out = d_q->as<uint16_t>();  // the decode's q
      record("prologue+decode", TimeGraphUs(iters, stream, [&](int i) {
               rotated(p, i);
               CHECK_OK(backend.PrologueAndDecode(pro, p));
             }));
      record("prologue;decode", TimeGraphUs(iters, stream, [&](int i) {
               rotated(p, i);
               CHECK_OK(backend.Prologue(pro));
               CHECK_OK(backend.Decode(p));
             }));
      CHECK_OK(backend.Synchronize());
    }
  }

  // Prologue shapes.
  struct PrologueShape {
    int tokens, heads;
  };
  for (const PrologueShape shape : {PrologueShape{128, 16}, PrologueShape{128, 64},
                                    PrologueShape{128, 128}, PrologueShape{4096, 16},
                                    PrologueShape{4096, 64}}) {
    if (!run_prologue) break;
    const int b = shape.tokens;
    const int hp = *PaddedHeadCount(shape.heads);
    const PrologueInputs inputs(backend, b, shape.heads, hp, 21, 22, rng, pool_slots);
    const int compressed_rows = inputs.compressed_rows();
    absl::StatusOr<DeviceBuffer> d_qout = backend.Allocate(static_cast<size_t>(b) * hp * kHeadDim * 2);
    CHECK_OK(d_qout.status());
    PrologueParams p = inputs.Params(rope, *pool, pool_blocks);
    p.q_out = d_qout->as<uint16_t>();
    cudaStream_t stream = static_cast<cudaStream_t>(backend.native_stream());
    const double time_us =
        TimeGraphUs(iters, stream, [&](int) { CHECK_OK(backend.Prologue(p)); });
    CHECK_OK(backend.Synchronize());
    Result r;
    r.model = "V4";
    r.op = "prologue";
    r.heads = shape.heads;
    r.tokens = b;
    r.time_us = time_us;
    const double bytes = static_cast<double>(b) * shape.heads * 1024 + static_cast<double>(b) * hp * 1024 +
                         static_cast<double>(b + compressed_rows) * (1024 + kTokenBytes);
    r.gbps = bytes / (r.time_us * 1e-6) / 1e9;
    results.push_back(r);
    std::printf("prologue H=%3d b=%4d (+%d compressed rows): %8.1f us %7.0f GB/s\n", shape.heads,
                b, compressed_rows, r.time_us, r.gbps);
  }

  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  FILE* f = std::fopen(out_path.c_str(), "w");
  if (f == nullptr) {
    std::perror(out_path.c_str());
    return 1;
  }
  std::fprintf(f, "[\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f,
                 "  {\"model\": \"%s\", \"op\": \"%s\", \"H\": %d, \"b\": %d, \"topk_main\": %d, "
                 "\"topk_extra\": %d, \"time_us\": %.2f, \"tflops\": %.3f, \"gbps\": %.1f, "
                 "\"copy_gbps_ceiling\": %.1f, \"gather_gbps_ceiling\": %.1f, \"matmul_tflops_ceiling\": %.1f, "
                 "\"matmul_ceiling_measured\": %s, \"decode_kernels\": \"%s\", \"gpu\": \"%s\", "
                 "\"date\": \"%s\", \"commit\": \"%s\"}%s\n",
                 r.model.c_str(), r.op.c_str(), r.heads, r.tokens, r.topk_main, r.topk_extra,
                 r.time_us, r.tflops, r.gbps, copy_gbps, gather_gbps, matmul_tflops,
                 matmul_measured ? "true" : "false", decode_kernels.c_str(), gpu.c_str(), date,
                 commit.c_str(),
                 i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, "]\n");
  std::fclose(f);
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
