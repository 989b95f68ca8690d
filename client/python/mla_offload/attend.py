"""The Attend stream: one message per layer step, answers in order.

An AttendStream is one bidirectional gRPC stream. submit() sends a message
without waiting for its answer and returns a concurrent.futures.Future; up to
`max_in_flight` messages may be unanswered at once (submit() blocks beyond
that). The server answers in the order sent, so futures complete in that
order. A message the server refuses completes its future with an
MlaOffloadError (its RequestStatus) and the stream goes on; a stream that
fails (deadline, cancellation, server gone) fails every unanswered future and
every later submit() with the stream's error.

Thread safety: submit() and close() may be called from any thread; answers
are delivered by one reader thread per stream (future callbacks run on it).
"""

import collections
import concurrent.futures
import dataclasses
import itertools
import threading
import queue
from typing import Optional

import grpc
import numpy as np

from ._stubs import pb
from .errors import MlaOffloadError, status_code
from .tensors import fill_tensor, to_array

_METHOD = "Attend"


def session_id_of(session):
    """The id of a Session, or the string itself."""
    return session if isinstance(session, str) else session.session_id


@dataclasses.dataclass(frozen=True)
class Segment:
    """num_tokens consecutive positions of one session, from `position`.

    first_compressed_row / num_compressed_rows: the new compressed rows of
    this session in this layer step (C4A/C128A layers), taken in order from
    the message's compressed_kv.
    """
    session: object  # a Session or its id
    position: int
    num_tokens: int = 1
    first_compressed_row: int = 0
    num_compressed_rows: int = 0


@dataclasses.dataclass(frozen=True)
class AttendResult:
    """The answer to one Attend message.

    out: uint16 bf16 patterns [T, H, 512] (a read-only view of the response).
    lse: float32 [T, H] when asked for (+inf where nothing was attended), else None.
    timing: the server's pb.Timing (queue_us, prologue_us, decode_us, total_us, batch_tokens).
    """
    request_id: int
    out: np.ndarray
    lse: Optional[np.ndarray]
    timing: object


def build_request(request_id, layer, segments, q, kv=None, compressed_kv=None, topk=None,
                  head_offset=0, return_lse=False, derotate_output=False):
    """A pb.AttendRequest from numpy arrays (see AttendStream.submit)."""
    request = pb.AttendRequest(request_id=request_id, layer=layer, head_offset=head_offset,
                               return_lse=return_lse, derotate_output=derotate_output)
    for segment in segments:
        request.segments.add(session_id=session_id_of(segment.session), position=segment.position,
                             num_tokens=segment.num_tokens,
                             first_compressed_row=segment.first_compressed_row,
                             num_compressed_rows=segment.num_compressed_rows)
    fill_tensor(request.q, q, pb.DTYPE_BF16, "q")
    if kv is not None:
        fill_tensor(request.kv, kv, pb.DTYPE_BF16, "kv")
    if compressed_kv is not None:
        fill_tensor(request.compressed_kv, compressed_kv, pb.DTYPE_BF16, "compressed_kv")
    if topk is not None:
        fill_tensor(request.topk, topk, pb.DTYPE_I32, "topk")
    return request


def parse_response(response):
    """An AttendResult, or the MlaOffloadError of a refused message."""
    if response.HasField("status") and response.status.code != 0:
        return MlaOffloadError(status_code(response.status.code), response.status.message,
                               _METHOD, response.request_id)
    lse = to_array(response.lse, "lse") if response.HasField("lse") else None
    return AttendResult(response.request_id, to_array(response.out, "out"), lse, response.timing)


class AttendStream:
    """One Attend stream (see the module's docstring). Use as a context manager,
    or call close()."""

    def __init__(self, stub, timeout=None, metadata=None, max_in_flight=8):
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self._requests = queue.SimpleQueue()
        self._pending = collections.deque()
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(max_in_flight)
        self._ids = itertools.count(1)
        self._error = None
        self._closed = False
        self._call = stub.Attend(self._outgoing(), timeout=timeout, metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="mla-offload-attend", daemon=True)
        self._reader.start()

    def submit(self, layer, segments, q, kv=None, compressed_kv=None, topk=None, head_offset=0,
               return_lse=False, derotate_output=False, request_id=None):
        """Sends one layer step; returns a Future of its AttendResult.

        layer: the attention layer. segments: Segment list (T = sum of num_tokens).
        q: uint16 bf16 [T, H, 512] (wq_b output before the per-head norm).
        kv: uint16 bf16 [T, 512], the tokens' new SWA rows (None: another
          tensor-parallel rank of the session sends them).
        compressed_kv: uint16 bf16 [rows, 512], the segments' new compressed rows.
        topk: int32 [T, K] of C4A layers, session-relative rows, -1 pads.
        head_offset: this rank's first query head. return_lse, derotate_output:
          see proto/mla_offload.proto. request_id: echoed; default 1, 2, 3, ...
        Blocks while max_in_flight messages are unanswered. Raises
        MlaOffloadError if the stream has failed or was closed.
        """
        if request_id is None:
            request_id = next(self._ids)
        request = build_request(request_id, layer, segments, q, kv, compressed_kv, topk,
                                head_offset, return_lse, derotate_output)
        self._slots.acquire()
        future = concurrent.futures.Future()
        with self._lock:
            if self._error is not None or self._closed:
                self._slots.release()
                raise self._error or MlaOffloadError(grpc.StatusCode.FAILED_PRECONDITION,
                                                     "the stream is closed", _METHOD, request_id)
            future.set_running_or_notify_cancel()
            self._pending.append((request_id, future))
            self._requests.put(request)
        return future

    def attend(self, *args, timeout=None, **kwargs):
        """submit(...) and wait for the answer: an AttendResult, or raises
        MlaOffloadError (concurrent.futures.TimeoutError after `timeout` s)."""
        return self.submit(*args, **kwargs).result(timeout)

    def close(self, timeout=None):
        """Ends the stream after every submitted message is answered; raises the
        stream's MlaOffloadError if it failed. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._requests.put(None)
        self._reader.join(timeout)
        if self._error is not None:
            raise self._error

    def cancel(self):
        """Cancels the stream at once: unanswered futures fail with CANCELLED."""
        self._call.cancel()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._requests.put(None)
        self._reader.join()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.cancel()
        return False

    @staticmethod
    def _deliver(response, request_id, future):
        try:
            result = parse_response(response)
        except ValueError as malformed:  # e.g. out's bytes do not fit its shape
            result = MlaOffloadError(grpc.StatusCode.INTERNAL, str(malformed), _METHOD, request_id)
        if isinstance(result, MlaOffloadError):
            # The server's refusal, named by our id whatever id it could read.
            future.set_exception(MlaOffloadError(result.code, result.message, _METHOD, request_id))
        elif response.request_id != request_id:
            future.set_exception(MlaOffloadError(
                grpc.StatusCode.INTERNAL, f"the answer to request {response.request_id} came "
                f"in the place of request {request_id}'s", _METHOD, request_id))
        else:
            future.set_result(result)

    def _outgoing(self):
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def _read(self):
        try:
            for response in self._call:
                with self._lock:
                    if not self._pending:
                        raise RuntimeError(f"an answer (request {response.request_id}) to no message")
                    request_id, future = self._pending.popleft()
                self._deliver(response, request_id, future)
                self._slots.release()
            error = None
        except grpc.RpcError as rpc_error:
            error = MlaOffloadError.from_rpc_error(rpc_error, _METHOD)
        except Exception as broken:  # the stream cannot go on; fail its futures
            self._call.cancel()
            error = MlaOffloadError(grpc.StatusCode.INTERNAL, str(broken), _METHOD)
        with self._lock:
            if error is None and self._pending:
                error = MlaOffloadError(grpc.StatusCode.INTERNAL,
                                        "the stream ended with messages unanswered", _METHOD)
            self._error = error
            if not self._closed:
                self._closed = True
                self._requests.put(None)  # ends _outgoing, which gRPC may still be reading
            pending, self._pending = list(self._pending), collections.deque()
        for request_id, future in pending:
            self._slots.release()
            future.set_exception(MlaOffloadError(error.code, error.message, _METHOD, request_id))
