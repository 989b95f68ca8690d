// The latency picture of --plot_out: a histogram (log time axis) and a CDF of
// the per-layer-step latency of each series (the Attend load, and the Echo
// baseline when it ran), with the first series' p50 and p99 marked, drawn by
// gnuplot (Debian's gnuplot-nox) into a PNG or SVG file chosen by the
// output's extension.
//
// The data files and the script go to a temporary folder that is removed
// afterwards. Errors: InvalidArgument for an extension other than .png or
// .svg; FailedPrecondition naming the package when gnuplot is not found;
// Internal with gnuplot's own message when it fails or writes nothing.
#ifndef MLA_OFFLOAD_CLIENT_LOADTEST_PLOT_H_
#define MLA_OFFLOAD_CLIENT_LOADTEST_PLOT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/loadtest/latency_histogram.h"

namespace mla::loadtest {

struct PlotSeries {
  std::string title;
  const LatencyHistogram* latency = nullptr;  // series without samples are skipped
};

// "pngcairo ..." or "svg ..." for the path's extension.
absl::StatusOr<std::string> GnuplotTerminal(const std::string& path);

// The executable `gnuplot` (a path, or a bare name looked up in $PATH);
// FailedPrecondition naming the package when there is none. A run looks
// before it starts, so a missing gnuplot does not cost the run.
absl::StatusOr<std::string> FindGnuplot(const std::string& gnuplot);

// `gnuplot` is a path, or a bare name looked up in $PATH.
absl::Status WriteLatencyPlot(const std::vector<PlotSeries>& series, const std::string& title,
                              const std::string& output_path, const std::string& gnuplot);

}  // namespace mla::loadtest

#endif  // MLA_OFFLOAD_CLIENT_LOADTEST_PLOT_H_
