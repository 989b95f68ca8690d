"""The FP8 output of an Attend message (AttendRequest.fp8_output; spec
section 5): per token and head, 512 e4m3fn codes (uint8) in four blocks of
128 dims, and one UE8M0 scale byte a block (uint8 [T, H, 4]); element d of a
head is e4m3(code) * 2^(scale[d // 128] - 127).

    result = stream.attend(layer, segments, q, fp8_output=True)
    out = mo.dequantize_fp8(result.out, result.out_scales)   # float32 [T, H, 512]

e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 holds
the subnormals m * 2^-9; no infinities, 0x7f and 0xff are NaN; the largest
magnitude is 448.
"""

import numpy as np

BLOCK = 128  # dims a scale covers


def _e4m3_values():
    codes = np.arange(256)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9,
                         (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    magnitude[(codes & 0x7F) == 0x7F] = np.nan
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.float32)


E4M3_VALUES = _e4m3_values()  # float32 [256]: the value of each code


def dequantize_fp8(e4m3, scales):
    """float32 [..., 512] from e4m3 codes uint8 [..., 512] and UE8M0 scales
    uint8 [..., 4] (an AttendResult's out and out_scales). Exact: every value
    is an e4m3 value times a power of two that float32 holds."""
    e4m3 = np.asarray(e4m3)
    scales = np.asarray(scales)
    if e4m3.dtype != np.uint8 or scales.dtype != np.uint8:
        raise TypeError(f"e4m3 codes and scales are uint8, got {e4m3.dtype} and {scales.dtype}")
    if e4m3.shape[-1:] != (4 * BLOCK,) or scales.shape != e4m3.shape[:-1] + (4,):
        raise ValueError(f"e4m3 [..., 512] and scales [..., 4] of the same leading shape, got "
                         f"{list(e4m3.shape)} and {list(scales.shape)}")
    # 2^(byte - 127) for bytes 0..255: byte 0 is 2^-127, a float32
    # subnormal; byte 255 is 2^128, past float32 (inf), as the kernels' would be.
    with np.errstate(over="ignore"):
        factor = np.ldexp(1.0, scales.astype(np.int32) - 127).astype(np.float32)
        return E4M3_VALUES[e4m3] * np.repeat(factor, BLOCK, axis=-1)
