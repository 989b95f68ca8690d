"""Host regions: numpy arrays over shared memory that the server on the same
host reads q, kv and compressed rows from and writes answers into, so that
Attend messages carry no tensor bytes (the same-host data plane).

    with client.host_region(8 << 20) as region:
        q = region.array((T, H, 512), np.uint16)            # fill it in place
        out = region.array((T, H, 512), np.uint16, offset=q.nbytes)
        result = stream.attend(layer=0, segments=[...], q=region.ref(q), out=region.ref(out))
        # result.out is `out`, the server's answer already in it

A HostRegion is a POSIX shared-memory object of its own (/dev/shm/mla-PID-
RANDOM, mode 0600: the server must run as this user, on this host) mapped
here and registered with one server; close() (or leaving the `with`)
unregisters it and unlinks its name (the mapping goes with the last array
over it). Bytes a message reads must stay unchanged until its answer
has come; changing them can corrupt only this client's answer. The top-k
always travels inline.
"""

import dataclasses
import mmap
import os
import secrets

import numpy as np

from .errors import MlaOffloadError


@dataclasses.dataclass(frozen=True)
class RegionArray:
    """A numpy array that lies in a registered region, sent as a reference
    (region_id, offset, its bytes) instead of its bytes. HostRegion.ref makes one."""
    region_id: int
    offset: int
    array: np.ndarray


def fill_region(reference, region_ref):
    """Sets the pb.RegionRef `region_ref` to name `reference`'s bytes."""
    region_ref.region_id = reference.region_id
    region_ref.offset = reference.offset
    region_ref.byte_size = reference.array.nbytes


class HostRegion:
    """Shared memory of this host registered with `client`'s server (see the
    module's docstring). Use as a context manager, or call close()."""

    def __init__(self, client, nbytes, timeout=None):
        if nbytes < 1:
            raise ValueError(f"a region needs at least 1 byte, got {nbytes}")
        self.name = f"/mla-{os.getpid()}-{secrets.token_hex(8)}"  # as shm_open takes it
        self.size = nbytes
        self._path = "/dev/shm" + self.name
        fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            self._map = mmap.mmap(fd, nbytes)
        except OSError:
            os.unlink(self._path)
            raise
        finally:
            os.close(fd)
        self._client = client
        self._bytes = np.frombuffer(self._map, dtype=np.uint8)
        try:
            self.id = client.register_region(self.name, nbytes, timeout)
        except MlaOffloadError:
            self._release()
            raise

    def array(self, shape, dtype, offset=0):
        """A numpy array of `shape` and `dtype` over the region's bytes from
        `offset` on (a view: writing it writes the region)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if offset < 0 or offset % dtype.itemsize or offset + count * dtype.itemsize > self.size:
            raise ValueError(f"{count} values of {dtype} at offset {offset} do not fit the "
                             f"region's {self.size} bytes (or are not aligned)")
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset).reshape(shape)

    def ref(self, array):
        """The RegionArray of `array`, a C-contiguous view of this region (from
        array()); ValueError for any other array."""
        base = self._bytes.ctypes.data
        start = array.ctypes.data if array.size else base
        if not array.flags.c_contiguous or not base <= start <= base + self.size - array.nbytes:
            raise ValueError("the array is not a C-contiguous view of this region; make it "
                             "with HostRegion.array")
        return RegionArray(self.id, start - base, array)

    def close(self, timeout=None):
        """Unregisters the region (a server that has gone dropped it already)
        and unlinks and releases the memory (which arrays over it keep mapped
        until they go)."""
        if self._map is None:
            return
        try:
            self._client.unregister_region(self.id, timeout)
        except MlaOffloadError:
            pass
        self._release()

    def _release(self):
        self._bytes = None
        os.unlink(self._path)
        try:
            self._map.close()
        except BufferError:
            pass  # the caller's arrays still view it: it is unmapped when they go
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

