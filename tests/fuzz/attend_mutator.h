// A structure-aware mutation of an AttendRequest, for the engine fuzzer's
// LLVMFuzzerCustomMutator.
//
// Most of an Attend message's bytes are tensor data, so libFuzzer's byte
// mutations mostly change query values and seldom the few bytes the engine's
// checks read: a head offset, a position, a row count, a shape. This parses
// the message with the codec, changes one thing as a client could (a number
// set to an edge of int32 or int64 or moved by a little, a session alias, a
// segment added or dropped, a tensor dropped or reshaped to fit the tokens,
// a top-k entry) and writes it back with the codec.
//
// Deterministic in `seed`. Thread-compatible (no state).
#ifndef MLA_OFFLOAD_TESTS_FUZZ_ATTEND_MUTATOR_H_
#define MLA_OFFLOAD_TESTS_FUZZ_ATTEND_MUTATOR_H_

#include <cstddef>
#include <cstdint>

namespace mla::fuzz {

// Mutates the AttendRequest in data[0, size) in place and returns its new
// size, at most max_size. Returns 0, leaving data as it was, when the bytes
// are no AttendRequest the codec parses or the result would not fit.
size_t MutateAttendRequest(uint8_t* data, size_t size, size_t max_size, unsigned int seed);

}  // namespace mla::fuzz

#endif  // MLA_OFFLOAD_TESTS_FUZZ_ATTEND_MUTATOR_H_
