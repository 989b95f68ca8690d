// Deterministic bf16 KV and query rows for tests that talk to the real
// server (tests/integration, client/).
#ifndef MLA_OFFLOAD_TESTS_SUPPORT_TEST_ROWS_H_
#define MLA_OFFLOAD_TESTS_SUPPORT_TEST_ROWS_H_

#include <cstdint>
#include <vector>

namespace mla {

// `count` rows of 512 bf16 values, a pure function of `seed`, none zero:
// normal values times a scale of 2^-3..2^1 that changes from one 64-wide tile
// to the next, so that the cache's tile scales differ and logits spread over
// about one unit.
std::vector<uint16_t> TestRows(uint64_t seed, int64_t count);

}  // namespace mla

#endif  // MLA_OFFLOAD_TESTS_SUPPORT_TEST_ROWS_H_
