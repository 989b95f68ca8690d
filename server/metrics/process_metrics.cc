#include "server/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mla::metrics {
namespace {

// The fields of /proc/self/stat after the command name (which may hold
// spaces and parentheses, so the split starts after its last ')'): field 3
// of proc(5) first.
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  std::vector<std::string> fields;
  if (close == std::string::npos) return fields;
  std::istringstream rest(line.substr(close + 1));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

// proc(5) field `number` (1-based, as the manual counts) of `fields`
// (StatFields) as a number; 0 when it is missing.
double Field(const std::vector<std::string>& fields, int number) {
  const size_t at = static_cast<size_t>(number - 3);
  return at < fields.size() ? std::strtod(fields[at].c_str(), nullptr) : 0;
}

// One field of a fresh read of /proc/self/stat.
double StatField(int number) { return Field(StatFields(), number); }

double CpuSeconds() {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const std::vector<std::string> fields = StatFields();  // one read for both
  return ticks > 0 ? (Field(fields, 14) + Field(fields, 15)) / ticks : 0;  // utime + stime
}

double ResidentBytes() { return StatField(24) * static_cast<double>(sysconf(_SC_PAGESIZE)); }

double OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  double count = 0;
  while (const dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count - 1;  // the directory's own descriptor
}

double MaxFds() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<double>(limit.rlim_cur);
}

// The start time in seconds since the epoch: boot time (/proc/stat's btime)
// plus proc(5) field 22 (start time after boot, in clock ticks).
double StartTimeSeconds() {
  std::ifstream in("/proc/stat");
  double boot = 0;
  for (std::string key; in >> key;) {
    if (key == "btime") {
      in >> boot;
      break;
    }
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return boot > 0 && ticks > 0 ? boot + StatField(22) / ticks : 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProcessMetrics>> ProcessMetrics::Add(Registry& registry) {
  std::unique_ptr<ProcessMetrics> process(new ProcessMetrics());
  const double start = StartTimeSeconds();
  const struct {
    const char* name;
    const char* help;
    std::function<double()> read;
  } metrics[] = {
      {"process_cpu_seconds_total", "User and system CPU time spent, in seconds.", CpuSeconds},
      {"process_resident_memory_bytes", "Resident memory size in bytes.", ResidentBytes},
      {"process_virtual_memory_bytes", "Virtual memory size in bytes.",
       [] { return StatField(23); }},
      {"process_open_fds", "Open file descriptors.", OpenFds},
      {"process_max_fds", "The most file descriptors the process may open.", MaxFds},
      {"process_threads", "Threads of the process.", [] { return StatField(20); }},
      {"process_start_time_seconds", "Start time of the process since the Unix epoch, in seconds.",
       [start] { return start; }},
  };
  for (const auto& metric : metrics) {
    absl::StatusOr<CallbackGaugeFamily*> family = registry.AddCallbackGauge(metric.name, metric.help);
    if (!family.ok()) return family.status();
    absl::StatusOr<GaugeCallbackRegistration> callback = (*family)->AddCallback({}, metric.read);
    if (!callback.ok()) return callback.status();
    process->callbacks_.push_back(*std::move(callback));
  }
  return process;
}

}  // namespace mla::metrics
