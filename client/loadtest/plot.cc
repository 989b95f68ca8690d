#include "client/loadtest/plot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace mla::loadtest {
namespace {

constexpr int kHistogramBins = 40;

// A gnuplot single-quoted string.
std::string Quote(const std::string& text) {
  return absl::StrCat("'", absl::StrReplaceAll(text, {{"'", "''"}}), "'");
}

std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (!dir.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Removes the files it was told about, then the folder.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr && *base ? base : "/tmp", "/mla_loadtest_plot_XXXXXX");
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    for (const std::string& file : files_) std::remove(file.c_str());
    if (!path_.empty()) rmdir(path_.c_str());
  }
  bool ok() const { return !path_.empty(); }
  std::string File(absl::string_view name) {
    files_.push_back(absl::StrCat(path_, "/", name));
    return files_.back();
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

// Histogram in kHistogramBins log-spaced bins from the minimum to the
// maximum: "center_ms fraction" lines (buckets are placed by their midpoint).
std::string HistogramData(const LatencyHistogram& latency) {
  const double lo = std::max<double>(1.0, latency.min_ns());
  const double hi = std::max<double>(lo * 1.01, latency.max_ns());
  const double step = std::log(hi / lo) / kHistogramBins;
  std::vector<int64_t> bins(kHistogramBins, 0);
  for (const LatencyHistogram::Bucket& bucket : latency.NonEmptyBuckets()) {
    const double mid = std::clamp(0.5 * (bucket.lower_ns + bucket.upper_ns), lo, hi);
    const int bin = std::min(kHistogramBins - 1, static_cast<int>(std::log(mid / lo) / step));
    bins[bin] += bucket.count;
  }
  std::string data;
  for (int i = 0; i < kHistogramBins; ++i) {
    const double center = lo * std::exp((i + 0.5) * step);
    absl::StrAppendFormat(&data, "%.6g %.6g\n", center / 1e6,
                          static_cast<double>(bins[i]) / latency.count());
  }
  return data;
}

// "upper_ms cumulative_fraction" per non-empty bucket, from (min, 0).
std::string CdfData(const LatencyHistogram& latency) {
  std::string data = absl::StrFormat("%.6g 0\n", latency.min_ns() / 1e6);
  int64_t seen = 0;
  for (const LatencyHistogram::Bucket& bucket : latency.NonEmptyBuckets()) {
    seen += bucket.count;
    const double upper = std::min<double>(bucket.upper_ns, latency.max_ns());
    absl::StrAppendFormat(&data, "%.6g %.6g\n", upper / 1e6,
                          static_cast<double>(seen) / latency.count());
  }
  return data;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream file(path);
  file << text;
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> GnuplotTerminal(const std::string& path) {
  if (absl::EndsWithIgnoreCase(path, ".png"))
    return std::string("pngcairo size 1200,500 font 'sans,10'");
  if (absl::EndsWithIgnoreCase(path, ".svg"))
    return std::string("svg size 1200,500 dynamic font 'sans,10'");
  return absl::InvalidArgumentError(
      absl::StrCat("--plot_out=", path, ": the picture must end in .png or .svg"));
}

absl::StatusOr<std::string> FindGnuplot(const std::string& gnuplot) {
  std::string binary = FindExecutable(gnuplot);
  if (!binary.empty()) return binary;
  return absl::FailedPreconditionError(absl::StrCat(
      "--plot_out needs gnuplot, which was not found as '", gnuplot,
      "': install Debian's gnuplot-nox (apt-get install gnuplot-nox) or pass --gnuplot=PATH"));
}

absl::Status WriteLatencyPlot(const std::vector<PlotSeries>& series, const std::string& title,
                              const std::string& output_path, const std::string& gnuplot) {
  absl::StatusOr<std::string> terminal = GnuplotTerminal(output_path);
  if (!terminal.ok()) return terminal.status();
  absl::StatusOr<std::string> found = FindGnuplot(gnuplot);
  if (!found.ok()) return found.status();
  const std::string& binary = *found;
  TempDir dir;
  if (!dir.ok()) return absl::InternalError("cannot create a temporary folder for the plot data");

  std::string histogram_plot, cdf_plot, marks;
  bool first = true;
  for (size_t i = 0; i < series.size(); ++i) {
    const LatencyHistogram* latency = series[i].latency;
    if (latency == nullptr || latency->count() == 0) continue;
    const std::string hist_file = dir.File(absl::StrCat("hist", i, ".dat"));
    const std::string cdf_file = dir.File(absl::StrCat("cdf", i, ".dat"));
    if (absl::Status s = WriteText(hist_file, HistogramData(*latency)); !s.ok()) return s;
    if (absl::Status s = WriteText(cdf_file, CdfData(*latency)); !s.ok()) return s;
    const std::string name = Quote(absl::StrCat(series[i].title, " (n=", latency->count(), ")"));
    absl::StrAppend(&histogram_plot, histogram_plot.empty() ? "" : ", ", Quote(hist_file),
                    " using 1:2 with histeps lw 2 title ", name);
    absl::StrAppend(&cdf_plot, cdf_plot.empty() ? "" : ", ", Quote(cdf_file),
                    " using 1:2 with steps lw 2 title ", name);
    if (first) {
      // p50 labelled left of its line, p99 right of its line, so that
      // close ones do not overlap.
      const double p50 = latency->Percentile(0.5) / 1e6, p99 = latency->Percentile(0.99) / 1e6;
      absl::StrAppendFormat(
          &marks,
          "set arrow from %.6g, graph 0 to %.6g, graph 1 nohead dt 2 lc rgb 'gray40'\n"
          "set label 'p50 %.3g ms' at %.6g, graph 0.6 right offset -0.5,0 tc rgb 'gray30'\n"
          "set arrow from %.6g, graph 0 to %.6g, graph 1 nohead dt 2 lc rgb 'gray40'\n"
          "set label 'p99 %.3g ms' at %.6g, graph 0.5 left offset 0.5,0 tc rgb 'gray30'\n",
          p50, p50, p50, p50, p99, p99, p99, p99);
      first = false;
    }
  }
  if (histogram_plot.empty()) return absl::FailedPreconditionError("no latency samples to plot");

  std::string script =
      absl::StrCat("set terminal ", *terminal, "\nset output ", Quote(output_path), "\n");
  absl::StrAppend(&script, "set multiplot layout 1,2 title ", Quote(title), "\n",
                  "set logscale x\nset grid\nset key top right\n",
                  "set xlabel 'latency per layer step (ms, log scale)'\n",
                  "set ylabel 'fraction of layer steps'\nset title 'histogram'\n", "plot ",
                  histogram_plot, "\n");
  absl::StrAppend(&script, "set title 'CDF'\nset ylabel 'fraction answered within x'\n",
                  "set yrange [0:1.02]\nset key bottom right\n", marks, "plot ", cdf_plot, "\n",
                  "unset multiplot\n");
  const std::string script_file = dir.File("plot.gp");
  const std::string errors_file = dir.File("gnuplot.err");
  if (absl::Status s = WriteText(script_file, script); !s.ok()) return s;

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errors_file.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<char*> argv = {const_cast<char*>(binary.c_str()),
                             const_cast<char*>(script_file.c_str()), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": ", std::strerror(rc)));
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream errors_in(errors_file);
  std::stringstream errors;
  errors << errors_in.rdbuf();
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError(
        absl::StrCat(binary, " failed drawing ", output_path, ": ", errors.str()));
  }
  struct stat info;
  if (stat(output_path.c_str(), &info) != 0 || info.st_size == 0) {
    return absl::InternalError(
        absl::StrCat(binary, " wrote nothing to ", output_path, ": ", errors.str()));
  }
  return absl::OkStatus();
}

}  // namespace mla::loadtest
