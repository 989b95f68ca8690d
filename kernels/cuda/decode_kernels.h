// Which decode kernels the CUDA backend runs (spec section 5 in each):
// chosen once, when the backend is made, from MLA_CUDA_DECODE. Needs no CUDA
// headers, so that the backend's header stays free of them.
#ifndef MLA_OFFLOAD_KERNELS_CUDA_DECODE_KERNELS_H_
#define MLA_OFFLOAD_KERNELS_CUDA_DECODE_KERNELS_H_

#include <optional>
#include <string>

namespace mla {
namespace cuda {

enum class DecodeKernels {
  kWgmma,   // the default, warpgroup MMA: for Hp <= 32 with the heads as the
            // MMA's N (decode_narrow.cu), for Hp >= 40 with 64 heads a CTA
            // (decode_wgmma.cu)
  kPadded,  // decode_wgmma.cu at every Hp, a smaller one padded to 64 MMA
            // rows (the default before decode_narrow.cu): a cross-check
  kMma,     // tensor-core mma.sync, 16 or 32 heads a CTA (decode.cu): a cross-check
  kSimt,    // CUDA cores, fp32 throughout (decode.cu): a cross-check
};

// The kernels a value of MLA_CUDA_DECODE selects: unset, empty or "wgmma"
// the default, "padded", "mma", "simt"; nullopt for any other value
// (CudaBackend refuses it).
std::optional<DecodeKernels> DecodeKernelsFor(const char* value);

// "wgmma", "padded", "mma" or "simt".
const char* DecodeKernelsName(DecodeKernels kernels);

// Every value, for an error message: "wgmma (the default), padded, mma or simt".
std::string DecodeKernelsChoices();

}  // namespace cuda
}  // namespace mla

#endif  // MLA_OFFLOAD_KERNELS_CUDA_DECODE_KERNELS_H_
