"""numpy arrays <-> mla_offload.v1.Tensor (raw little-endian bytes, C order).

bf16 tensors are uint16 arrays of bit patterns (see bf16.py); int32 and
float32 tensors are arrays of those types; the FP8 output's e4m3fn codes and
UE8M0 scales (fp8.py) are uint8 arrays. Arrays of another type are refused
rather than converted, so that no rounding happens behind the caller's back.
The shape is sent as the array has it: the server checks it and names the
field when it is wrong.
"""

import numpy as np

from ._stubs import pb
from .regions import RegionArray, fill_region

_WIRE = {
    pb.DTYPE_BF16: np.dtype("<u2"),
    pb.DTYPE_F32: np.dtype("<f4"),
    pb.DTYPE_I32: np.dtype("<i4"),
    # The FP8 output's codes and scales (fp8.py), as uint8.
    pb.DTYPE_E4M3FN: np.dtype("u1"),
    pb.DTYPE_UE8M0: np.dtype("u1"),
}
_NAMES = {pb.DTYPE_BF16: "bf16 (uint16 bit patterns)", pb.DTYPE_F32: "float32", pb.DTYPE_I32: "int32"}


def fill_tensor(tensor, array, dtype, field):
    """Sets the pb.Tensor `tensor` to `array` as `dtype` (a pb.DType value);
    a RegionArray (regions.py) is sent as a reference to its region."""
    reference = array if isinstance(array, RegionArray) else None
    array = np.asarray(array.array if reference is not None else array)
    wire = _WIRE[dtype]
    accepted = {
        pb.DTYPE_BF16: array.dtype == np.uint16,
        pb.DTYPE_F32: array.dtype == np.float32,
        pb.DTYPE_I32: array.dtype.kind in "iu",
    }[dtype]
    if not accepted:
        hint = " (convert with mla_offload.float32_to_bf16)" if dtype == pb.DTYPE_BF16 else ""
        raise TypeError(f"{field}: expected {_NAMES[dtype]}, got {array.dtype}{hint}")
    if dtype == pb.DTYPE_I32 and array.size and (
            array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{field}: values do not fit in int32")
    tensor.dtype = dtype
    tensor.shape[:] = array.shape
    if reference is not None:
        fill_region(reference, tensor.region)
        return
    tensor.data = np.ascontiguousarray(array, dtype=wire).tobytes()


def to_array(tensor, field):
    """The numpy array a pb.Tensor holds: a read-only view of its bytes."""
    if tensor.dtype not in _WIRE:
        raise ValueError(f"{field}: unknown dtype {tensor.dtype}")
    wire = _WIRE[tensor.dtype]
    shape = tuple(tensor.shape)
    count = int(np.prod(shape, dtype=np.int64))
    if len(tensor.data) != count * wire.itemsize:
        raise ValueError(f"{field}: shape {list(shape)} needs {count * wire.itemsize} bytes, "
                         f"got {len(tensor.data)}")
    return np.frombuffer(tensor.data, dtype=wire).reshape(shape)
