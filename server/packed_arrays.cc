#include "server/packed_arrays.h"

namespace mla {

void PackedArrays::Allocate() { data_.reset(new uint8_t[std::max<size_t>(bytes_, 1)]); }

}  // namespace mla
