// Which decode kernels the CUDA backend runs (spec section 5 in each):
// chosen once, when the backend is made, from MLA_CUDA_DECODE. Needs no CUDA
// headers, so that the backend's header stays free of them.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_DECODE_KERNELS_H_
#define MLA_OFFLOAD_KERNELS_CUDA_DECODE_KERNELS_H_

#include <optional>

namespace mla {
namespace cuda {

enum class DecodeKernels {
  kWgmma,   // warpgroup MMA, 64 heads a CTA (decode_wgmma.cu): the default
  kMma,     // tensor-core mma.sync, 16 or 32 heads a CTA (decode.cu): a cross-check
  kSimt,    // CUDA cores, fp32 throughout (decode.cu): a cross-check
  kNarrow,  // Hp <= 32: warpgroup MMA with the heads as N (decode_narrow.cu),
            // Hp >= 64: as kWgmma. Written, not yet run on a GPU.
};

// The kernels a value of MLA_CUDA_DECODE selects: unset, empty or "wgmma"
// the default, "mma", "simt", "narrow"; nullopt for any other value
// (CudaBackend refuses it).
std::optional<DecodeKernels> DecodeKernelsFor(const char* value);

// "wgmma", "mma", "simt" or "narrow".
const char* DecodeKernelsName(DecodeKernels kernels);

}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_DECODE_KERNELS_H_
