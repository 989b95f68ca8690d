// The Attend stream's parsed wire messages (proto/attend_codec.h) as the
// engine's inputs (server/requests.h): what the service hands the scheduler
// for each message it reads, and what the engine fuzzer
// (tests/fuzz/engine_fuzzer.cc) runs, so both take the same path.
//
// No bytes are copied and nothing is checked here: the tensors' pieces point
// into the slices the view keeps alive, the numbers are passed on as they
// came, and the engine validates everything. The returned input owns the view
// (and so the slices) and is immutable; it may be read from any thread.
#ifndef MLA_OFFLOAD_SERVER_WIRE_INPUTS_H_
#define MLA_OFFLOAD_SERVER_WIRE_INPUTS_H_

#include <memory>

#include "absl/time/time.h"
#include "proto/attend_codec.h"
#include "server/requests.h"

namespace mla {

// The AttendInput of a parsed message that arrived at `arrival` (on the
// scheduler's clock). It shares ownership of `view`, whose slices its
// tensors point at.
std::shared_ptr<const AttendInput> ToAttendInput(wire::AttendRequestView view, absl::Time arrival);

}  // namespace mla

#endif  // MLA_OFFLOAD_SERVER_WIRE_INPUTS_H_
