// The kernel tool's demo: one random decode step of a V4 layer (see
// demo_workload.h) through a backend, timed and checked.
//
// Fills the pools with the step's history through the backend's prologue,
// times the step's prologue and decode (median of `runs`, wall clock between
// two Synchronize() calls, so an asynchronous backend is timed to completion),
// then holds q_out, every inserted cache row, out and lse to the float64
// reference and the tolerances of spec section 7 (kernels/reference). The
// report goes to stdout; a note goes to stderr when a phase runs for more than
// a few seconds.
#ifndef MLA_OFFLOAD_KERNELS_TOOL_DEMO_H_
#define MLA_OFFLOAD_KERNELS_TOOL_DEMO_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/tool/layer_config.h"

namespace mla {

struct DemoOptions {
  LayerConfig layer;
  int tp = 1;              // heads per rank: h_total / tp
  int64_t batch = 8;       // sequences, one new token each
  int64_t context = 8192;  // positions are drawn from its last quarter
  int runs = 5;            // timed repetitions of each call
  bool derotate = false;
  uint64_t seed = 1;
};

// OK when every check passes; otherwise a one-line error saying which failed
// (the report above it has the details) or what else went wrong.
absl::Status RunDemo(ComputeBackend& backend, const DemoOptions& options);

}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_TOOL_DEMO_H_
