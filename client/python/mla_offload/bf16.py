"""bfloat16 as numpy uint16 bit patterns, the form bf16 tensors travel in.

numpy has no bfloat16 dtype, so this package holds bf16 values as their
16-bit patterns in uint16 arrays (the upper half of the float32 pattern), as
the wire does. These helpers convert between that form and float32.
"""

import numpy as np


def float32_to_bf16(values):
    """float32 (or anything numpy turns into float32) -> uint16 bf16 patterns.

    Rounds to nearest, ties to even, as the server and the model do.
    Overflow rounds to +-inf; NaN stays NaN (quiet, sign kept).
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x0040), rounded)
    return rounded.astype(np.uint16)


def bf16_to_float32(bits):
    """uint16 bf16 patterns -> float32 (exact)."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bf16 values must be uint16 bit patterns, got {bits.dtype}")
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_to_bf16(values):
    """float32 values rounded to the nearest bf16, as float32."""
    return bf16_to_float32(float32_to_bf16(values))
