// A wire::TensorView (proto/views.h) that owns its data: for
// messages the fuzzers' seed writer and mutator build. The view's keep_alive
// holds the values, so the view may be copied and serialised freely.
#ifndef MLA_OFFLOAD_TESTS_FUZZ_OWNED_TENSOR_H_
#define MLA_OFFLOAD_TESTS_FUZZ_OWNED_TENSOR_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "proto/views.h"

namespace mla::fuzz {

template <typename T>
wire::TensorView OwnedTensor(wire::DType dtype, std::vector<int64_t> shape,
                             std::vector<T> values) {
  auto data = std::make_shared<const std::vector<T>>(std::move(values));
  return wire::MakeTensorView(dtype, std::move(shape), data->data(), data->size() * sizeof(T),
                              data);
}

}  // namespace mla::fuzz

#endif  // MLA_OFFLOAD_TESTS_FUZZ_OWNED_TENSOR_H_
