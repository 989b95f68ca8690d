#include "kernels/tool/demo.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/geometry.h"
#include "kernels/head_padding.h"
#include "kernels/reference/reference_f64.h"
#include "kernels/reference/tolerance.h"
#include "kernels/rope.h"
#include "kernels/tool/demo_workload.h"
#include "kernels/tool/move_into.h"
#include "kernels/tool/staging.h"

namespace mla {
namespace {

constexpr absl::Duration kProgressAfter = absl::Seconds(3);

// Says on stderr what is running once it has run for kProgressAfter.
class ProgressNote {
 public:
  explicit ProgressNote(std::string what)
      : what_(std::move(what)), watcher_([this] {
          if (!done_.WaitForNotificationWithTimeout(kProgressAfter)) {
            std::fprintf(stderr, "  ... %s (still running)\n", what_.c_str());
          }
        }) {}
  ~ProgressNote() {
    done_.Notify();
    watcher_.join();
  }

 private:
  const std::string what_;
  absl::Notification done_;
  std::thread watcher_;
};

absl::StatusOr<double> MedianSeconds(ComputeBackend& backend, int runs,
                                     absl::FunctionRef<absl::Status()> call) {
  std::vector<double> seconds;
  for (int r = 0; r < runs; ++r) {
    if (absl::Status status = backend.Synchronize(); !status.ok()) return status;
    const absl::Time start = absl::Now();
    if (absl::Status status = call(); !status.ok()) return status;
    if (absl::Status status = backend.Synchronize(); !status.ok()) return status;
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Every row of `insert` against its reference, at its slot of `pool`.
absl::Status CheckInsertedRows(const OwnedInsert& insert, absl::string_view label,
                               absl::Span<const uint8_t> pool, const RopeTable& table,
                               reference::ComparisonReport& report) {
  for (size_t r = 0; r < insert.slots.size(); ++r) {
    absl::StatusOr<reference::KvRowReference> expected =
        reference::ReferenceKvRow(absl::MakeConstSpan(insert.rows).subspan(r * kHeadDim, kHeadDim),
                                  insert.positions[r], table);
    if (!expected.ok()) return expected.status();
    reference::CompareCacheRow(pool, insert.slots[r], *expected,
                               absl::StrCat(label, " row ", r, " (slot ", insert.slots[r], ")"),
                               report);
  }
  return absl::OkStatus();
}

// What the backend computed, copied back to the host.
struct DemoOutputs {
  NpyArray q_out;
  NpyArray swa_pool;
  NpyArray compressed_pool;
  NpyArray out;
  NpyArray lse;
};

// One report per output: q_out, the rows inserted into each pool, out, lse.
absl::StatusOr<std::vector<reference::ComparisonReport>> CheckAgainstReference(
    const DemoWorkload& w, const RopeTable& table, int padded_heads, bool derotate,
    const DemoOutputs& outputs) {
  std::vector<reference::ComparisonReport> reports;
  absl::StatusOr<reference::QueryReference> query = reference::ReferenceQuery(
      w.q, w.positions, w.shape.num_heads, padded_heads, w.shape.layer.rms_norm_eps, table);
  if (!query.ok()) return query.status();
  reports.push_back(reference::CompareQueryOut(outputs.q_out.values<uint16_t>(), *query));

  const absl::Span<const uint8_t> swa_pool = outputs.swa_pool.values<uint8_t>();
  reports.emplace_back("swa pool");
  for (absl::Status status : {
           CheckInsertedRows(w.history_swa, "history", swa_pool, table, reports.back()),
           CheckInsertedRows(w.new_swa, "new", swa_pool, table, reports.back()),
       }) {
    if (!status.ok()) return status;
  }
  const absl::Span<const uint8_t> compressed_pool = outputs.compressed_pool.values<uint8_t>();
  if (w.extra_width > 0) {
    reports.emplace_back("compressed pool");
    if (absl::Status status = CheckInsertedRows(w.history_compressed, "compressed", compressed_pool,
                                                table, reports.back());
        !status.ok()) {
      return status;
    }
  }

  const HostDecode host = w.StepDecode(outputs.q_out.values<uint16_t>(), padded_heads, derotate);
  reference::DecodeInputs inputs;
  inputs.num_tokens = w.shape.batch;
  inputs.num_heads = host.num_heads;
  inputs.padded_heads = host.padded_heads;
  inputs.q = host.q;
  inputs.softmax_scale = host.softmax_scale;
  inputs.sinks = host.sinks;
  inputs.main = {host.main.width, host.main.indices, host.main.lengths, swa_pool};
  inputs.extra = {host.extra.width, host.extra.indices, host.extra.lengths, compressed_pool};
  inputs.derotate = host.derotate;
  inputs.positions = host.positions;
  inputs.rope = &table;
  absl::StatusOr<reference::DecodeReference> expected = reference::ReferenceDecode(inputs);
  if (!expected.ok()) return expected.status();
  reports.push_back(reference::CompareDecodeOut(outputs.out.values<uint16_t>(), *expected));
  reports.push_back(reference::CompareLse(outputs.lse.values<float>(), *expected));
  return reports;
}

std::string Milliseconds(double seconds) { return absl::StrFormat("%.3f ms", seconds * 1e3); }

}  // namespace

absl::Status RunDemo(ComputeBackend& backend, const DemoOptions& options) {
  const LayerConfig& layer = options.layer;
  WorkloadShape shape;
  shape.layer = layer;
  shape.num_heads = layer.profile->num_query_heads / options.tp;
  shape.batch = options.batch;
  shape.context = options.context;
  shape.seed = options.seed;
  absl::StatusOr<int> padded_heads = PaddedHeadCount(shape.num_heads);
  if (!padded_heads.ok()) return padded_heads.status();

  std::printf("DeepSeek-V4 sparse MLA demo\n");
  std::printf("  shape     %s; TP %d -> %d heads per rank, kernel runs %d\n",
              layer.Describe().c_str(), options.tp, shape.num_heads, *padded_heads);
  std::printf("  backend   %s\n", backend.Describe().c_str());
  std::fflush(stdout);
  const DemoWorkload w = [&] {
    ProgressNote note("generating random inputs");
    return MakeDemoWorkload(shape);
  }();
  const auto [lowest, highest] = std::minmax_element(w.positions.begin(), w.positions.end());
  std::printf("  tokens    %lld (one new token per sequence) at positions %d..%d, context %lld\n",
              static_cast<long long>(options.batch), *lowest, *highest,
              static_cast<long long>(options.context));
  const std::string extra_text =
      w.extra_width == 0 ? ""
      : layer.kind == LayerKind::kC4A
          ? absl::StrCat(" + up to ", w.extra_width, " compressed (indexer top-k)")
          : absl::StrCat(" + every compressed row (up to ", w.extra_width, ")");
  std::printf("  keys      %d SWA%s per token: %lld rows read, %.2f MB of cache\n", w.main_width,
              extra_text.c_str(), static_cast<long long>(w.keys_read),
              w.keys_read * kTokenBytes / 1e6);
  std::fflush(stdout);

  const RopeTable table(layer.rope_kind, w.rope_rows);
  absl::StatusOr<DeviceRope> rope = UploadRope(backend, table);
  if (!rope.ok()) return rope.status();
  absl::StatusOr<DevicePool> swa_pool =
      UploadPool(backend, NpyArray::Zeros(NpyDtype::kUint8, {w.swa_blocks, kBlockBytes}));
  if (!swa_pool.ok()) return swa_pool.status();
  absl::StatusOr<DevicePool> compressed_pool =
      UploadPool(backend, NpyArray::Zeros(NpyDtype::kUint8, {w.compressed_blocks, kBlockBytes}));
  if (!compressed_pool.ok()) return compressed_pool.status();

  {
    ProgressNote note("filling the pools with the history");
    absl::StatusOr<PreparedPrologue> fill =
        PreparedPrologue::Create(backend, w.HistoryPrologue(), *rope, *swa_pool, *compressed_pool);
    if (!fill.ok()) return fill.status();
    if (absl::Status status = fill->Run(); !status.ok()) return status;
    if (absl::Status status = backend.Synchronize(); !status.ok()) return status;
  }

  absl::StatusOr<PreparedPrologue> prologue =
      PreparedPrologue::Create(backend, w.StepPrologue(), *rope, *swa_pool, *compressed_pool);
  if (!prologue.ok()) return prologue.status();
  const absl::StatusOr<double> prologue_seconds = [&] {
    ProgressNote note("timing the prologue");
    return MedianSeconds(backend, options.runs, [&] { return prologue->Run(); });
  }();
  if (!prologue_seconds.ok()) return prologue_seconds.status();
  std::printf("  prologue  %s (median of %d), %.0f tokens/s\n",
              Milliseconds(*prologue_seconds).c_str(), options.runs,
              options.batch / *prologue_seconds);
  absl::StatusOr<NpyArray> q_out = prologue->QOut();
  if (!q_out.ok()) return q_out.status();

  absl::StatusOr<PreparedDecode> decode = PreparedDecode::Create(
      backend, w.StepDecode(q_out->values<uint16_t>(), *padded_heads, options.derotate), *swa_pool,
      *compressed_pool, &*rope);
  if (!decode.ok()) return decode.status();
  const absl::StatusOr<double> decode_seconds = [&] {
    ProgressNote note("timing the decode");
    return MedianSeconds(backend, options.runs, [&] { return decode->Run(); });
  }();
  if (!decode_seconds.ok()) return decode_seconds.status();
  std::printf(
      "  decode    %s (median of %d), %.0f tokens/s, %.2f GB/s of cache rows (584 B each)\n",
      Milliseconds(*decode_seconds).c_str(), options.runs, options.batch / *decode_seconds,
      w.keys_read * kTokenBytes / *decode_seconds / 1e9);
  std::fflush(stdout);

  DemoOutputs outputs;
  outputs.q_out = *std::move(q_out);
  for (absl::Status status : {
           MoveInto(DownloadPool(backend, *swa_pool), outputs.swa_pool),
           MoveInto(DownloadPool(backend, *compressed_pool), outputs.compressed_pool),
           MoveInto(decode->Out(), outputs.out),
           MoveInto(decode->Lse(), outputs.lse),
       }) {
    if (!status.ok()) return status;
  }
  absl::StatusOr<std::vector<reference::ComparisonReport>> reports = [&] {
    ProgressNote note("checking against the float64 reference");
    return CheckAgainstReference(w, table, *padded_heads, options.derotate, outputs);
  }();
  if (!reports.ok()) return reports.status();

  std::printf("  check     against the float64 reference, tolerances of spec section 7:\n");
  int failed = 0;
  for (const reference::ComparisonReport& report : *reports) {
    std::printf("    %s\n", report.ToString().c_str());
    failed += !report.ok();
  }
  std::printf("  result    %s\n", failed == 0 ? "PASS" : "FAIL");
  std::fflush(stdout);
  if (failed > 0) {
    return absl::InternalError(absl::StrCat(failed, " of ", reports->size(),
                                            " checks against the float64 reference failed "
                                            "(details above)"));
  }
  return absl::OkStatus();
}

}  // namespace mla
