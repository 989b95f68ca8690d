// Reads the ptxas reports of the CUDA kernels (nvcc -Xptxas -v, kept beside
// each object by cuda_library) and fails the build's tests when a kernel
// lost what its speed rests on, which otherwise shows only on a GPU:
//   - spills or a stack frame (every kernel here is written to fit its
//     registers; a frame also means an array indexed at run time). The
//     report does not count spills in code after a setmaxnreg that lowers
//     the registers: kernels/cuda/run_on_device.sh checks the SASS for
//     local loads and stores on the GPU machine, which has cuobjdump;
//   - wgmma serialised by ptxas (info C7515), or a wait ptxas injected
//     before registers an MMA writes (C7517): the MMAs no longer overlap
//     the work around them (RESULTS.md measured 122 -> 152 us at H = 128
//     with one such variant), or any other "Potential Performance Loss";
//   - a warp-specialised kernel compiled with other than the registers a
//     thread that its launch and setmaxnreg budget assume (the host refuses
//     to launch it then: PrepareWarpSpecialised).
// Needs no GPU; runs in CI. The figures are those of the nvcc that built the
// tree (the H200's binaries are built with the same one).
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace mla {
namespace {

constexpr const char* kReports[] = {
    "kernels/cuda/cuda_kernels_decode.ptxas.txt",
    "kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt",
    "kernels/cuda/cuda_kernels_decode_wgmma.ptxas.txt",
    "kernels/cuda/cuda_kernels_prologue.ptxas.txt",
};

// One kernel's figures from a report.
struct KernelReport {
  std::string name;  // mangled
  bool has_properties = false;  // its stack frame and spill line
  int registers = -1;
};

struct Report {
  std::vector<KernelReport> kernels;
  std::vector<std::string> lines;
};

// The number just before `unit` in `line` ("... 16 bytes spill stores"), or -1.
int NumberBefore(absl::string_view line, absl::string_view unit) {
  const size_t at = line.find(unit);
  if (at == absl::string_view::npos) return -1;
  absl::string_view head = line.substr(0, at);
  while (!head.empty() && head.back() == ' ') head.remove_suffix(1);
  const size_t space = head.find_last_of(' ');
  int value = -1;
  if (!absl::SimpleAtoi(head.substr(space == absl::string_view::npos ? 0 : space + 1), &value)) {
    return -1;
  }
  return value;
}

Report ReadReport(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file.good()) << "cannot read " << path;
  std::stringstream text;
  text << file.rdbuf();
  Report report;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    report.lines.emplace_back(line);
    constexpr absl::string_view kEntry = "Compiling entry function '";
    if (const size_t at = line.find(kEntry); at != absl::string_view::npos) {
      absl::string_view name = line.substr(at + kEntry.size());
      report.kernels.push_back(KernelReport{std::string(name.substr(0, name.find('\'')))});
      continue;
    }
    if (report.kernels.empty()) continue;
    KernelReport& kernel = report.kernels.back();
    if (absl::StrContains(line, "spill stores")) kernel.has_properties = true;
    if (absl::StrContains(line, "Used ")) kernel.registers = NumberBefore(line, "registers");
  }
  return report;
}

TEST(PtxasReportTest, EveryReportNamesItsKernels) {
  for (const char* path : kReports) {
    const Report report = ReadReport(path);
    EXPECT_FALSE(report.kernels.empty()) << path << " names no kernel";
    for (const KernelReport& kernel : report.kernels) {
      EXPECT_GE(kernel.registers, 0) << kernel.name << " in " << path << ": no register count";
      EXPECT_TRUE(kernel.has_properties) << kernel.name << " in " << path << ": no spill line";
    }
  }
}

// Every function's line (kernels and any device function ptxas kept apart).
TEST(PtxasReportTest, NoFunctionSpillsOrHasAStackFrame) {
  for (const char* path : kReports) {
    int lines = 0;
    for (const std::string& line : ReadReport(path).lines) {
      if (!absl::StrContains(line, "bytes spill stores")) continue;
      ++lines;
      EXPECT_EQ(NumberBefore(line, "bytes stack frame"), 0) << path << ": " << line;
      EXPECT_EQ(NumberBefore(line, "bytes spill stores"), 0) << path << ": " << line;
      EXPECT_EQ(NumberBefore(line, "bytes spill loads"), 0) << path << ": " << line;
    }
    EXPECT_GT(lines, 0) << path;
  }
}

TEST(PtxasReportTest, NoMmaSerialisedOrWaitInjected) {
  for (const char* path : kReports) {
    for (const std::string& line : ReadReport(path).lines) {
      EXPECT_FALSE(absl::StrContains(line, "(C7515)")) << path << ": " << line;
      EXPECT_FALSE(absl::StrContains(line, "(C7517)")) << path << ": " << line;
      EXPECT_FALSE(absl::StrContains(line, "Performance Loss")) << path << ": " << line;
    }
  }
}

// The registers a thread that each warp-specialised kernel's launch and
// setmaxnreg budget assume (kLaunchRegisters, NarrowShape<N>::kLaunchRegisters).
TEST(PtxasReportTest, WarpSpecialisedKernelsHaveTheirLaunchRegisters) {
  const struct {
    const char* report;
    const char* kernel;  // a piece of the mangled name
    int registers;
  } kExpected[] = {
      {"kernels/cuda/cuda_kernels_decode_wgmma.ptxas.txt", "DecodeWgmmaKernelILb0E", 128},
      {"kernels/cuda/cuda_kernels_decode_wgmma.ptxas.txt", "DecodeWgmmaKernelILb1E", 128},
      // <N, kRing>: Hp 8 and 16 with and without the producers' ring.
      {"kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt", "DecodeNarrowKernelILi8ELb0E", 96},
      {"kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt", "DecodeNarrowKernelILi8ELb1E", 96},
      {"kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt", "DecodeNarrowKernelILi16ELb0E", 96},
      {"kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt", "DecodeNarrowKernelILi16ELb1E", 96},
      {"kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt", "DecodeNarrowKernelILi24ELb1E", 168},
      {"kernels/cuda/cuda_kernels_decode_narrow.ptxas.txt", "DecodeNarrowKernelILi32ELb1E", 168},
  };
  for (const auto& expected : kExpected) {
    int found = 0;
    for (const KernelReport& kernel : ReadReport(expected.report).kernels) {
      if (!absl::StrContains(kernel.name, expected.kernel)) continue;
      ++found;
      EXPECT_EQ(kernel.registers, expected.registers) << expected.kernel;
    }
    EXPECT_EQ(found, 1) << expected.kernel << " in " << expected.report;
  }
}

}  // namespace
}  // namespace mla
