"""The Attend stream: one message per layer step, answers in order.

An AttendStream is one bidirectional gRPC stream. submit() sends a message
without waiting for its answer and returns a concurrent.futures.Future; up to
`max_in_flight` messages may be unanswered at once (submit() blocks beyond
that). The server answers in the order sent, so futures complete in that
order. A message the server refuses completes its future with an
MlaOffloadError (its RequestStatus) and the stream goes on; a stream that
fails (deadline, cancellation, server gone) fails every unanswered future and
every later submit() with the stream's error.

Every message must be answered within `step_timeout` seconds of its submit()
(default 30 s, as the C++ client's StreamOptions::step_timeout); otherwise the
stream is cancelled and fails with DEADLINE_EXCEEDED: a layer step that late
means the server or the network is in trouble, and the answers after it
cannot come in order. An OK answer is checked to be out [T, H, 512] bf16 (with
fp8_output: e4m3fn, and out_scales [T, H, 4] UE8M0) and lse [T, H] float32,
which must be there when return_lse asked for it, for the message's T and H;
anything else fails its future with INTERNAL.

Thread safety: submit() and close() may be called from any thread; answers
are delivered by one reader thread per stream (future callbacks run on it,
and may call submit(), close() and cancel(), which then do not wait for the
reader). A watchdog thread per stream enforces step_timeout.
"""

import collections
import concurrent.futures
import dataclasses
import itertools
import threading
import time
import queue
from typing import Optional

import grpc
import numpy as np

from ._stubs import pb
from .errors import MlaOffloadError, status_code
from .regions import RegionArray, fill_region
from .tensors import fill_tensor, to_array

_METHOD = "Attend"
HEAD_DIM = 512
DEFAULT_STEP_TIMEOUT = 30.0  # seconds; the C++ client's StreamOptions::step_timeout


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

    out: uint16 bf16 patterns [T, H, 512], or with fp8_output uint8 e4m3fn
      codes [T, H, 512] (a read-only view of the response, or the region
      array the message named as `out`, the answer written in it).
    lse: float32 [T, H] when asked for (+inf where nothing was attended), else None.
    timing: the server's pb.Timing (queue_us, plan_us, upload_us, prologue_us,
        decode_us, readback_us, total_us, batch_tokens, serialize_us).
    out_scales: with fp8_output, uint8 UE8M0 [T, H, 4], the scale of each
      128-dim block of out (mla_offload.dequantize_fp8(out, out_scales)
      gives float32); else None.
    """
    request_id: int
    out: np.ndarray
    lse: Optional[np.ndarray]
    timing: object
    out_scales: Optional[np.ndarray] = None


def build_request(request_id, layer, segments, q, kv=None, compressed_kv=None, topk=None,
                  head_offset=0, return_lse=False, derotate_output=False, out=None, lse=None,
                  fp8_output=False, out_scales=None):
    """A pb.AttendRequest from numpy arrays and RegionArrays (see AttendStream.submit)."""
    request = pb.AttendRequest(request_id=request_id, layer=layer, head_offset=head_offset,
                               return_lse=return_lse, derotate_output=derotate_output,
                               fp8_output=fp8_output)
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
    if out is not None:
        fill_region(out, request.out_region)
    if lse is not None:
        fill_region(lse, request.lse_region)
    if out_scales is not None:
        fill_region(out_scales, request.out_scales_region)
    return request


@dataclasses.dataclass(frozen=True)
class _Pending:
    """A message sent and not yet answered, and what its answer must be."""
    request_id: int
    future: concurrent.futures.Future
    deadline: float  # time.monotonic() by which it must be answered
    tokens: int      # T
    heads: int       # H
    return_lse: bool
    out: Optional[RegionArray] = None  # where the answer is written instead
    lse: Optional[RegionArray] = None
    fp8_output: bool = False
    out_scales: Optional[RegionArray] = None


def _tensor_description(tensor):
    return f"{list(tensor.shape)} {pb.DType.Name(tensor.dtype)}"


def _check_tensor(response, field, dtype, shape):
    """ValueError unless response.<field> is there with this dtype and shape."""
    expected = f"{list(shape)} {pb.DType.Name(dtype)}"
    if not response.HasField(field):
        raise ValueError(f"AttendResponse.{field} is missing where {expected} is expected")
    tensor = getattr(response, field)
    if tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"AttendResponse.{field} is {_tensor_description(tensor)} where "
                         f"{expected} is expected")


def parse_response(response, tokens=None, heads=None, return_lse=False, out=None, lse=None,
                   fp8_output=False, out_scales=None):
    """An AttendResult, or the MlaOffloadError of a refused message.

    With tokens and heads (the message's T and H), an OK answer must hold out
    bf16 [T, H, 512] (with fp8_output e4m3fn, and out_scales UE8M0 [T, H, 4])
    and lse float32 [T, H] when present or return_lse; ValueError otherwise
    (a server fault, not something to hand on). With `out` (the RegionArray
    the message named, and `lse`, `out_scales`), the answer is in their
    arrays and the response must carry no tensors.
    """
    if response.HasField("status") and response.status.code != 0:
        return MlaOffloadError(status_code(response.status.code), response.status.message,
                               _METHOD, response.request_id)
    if out is not None:
        if any(response.HasField(field) for field in ("out", "lse", "out_scales")):
            raise ValueError("an answer written into out_region carries tensors too")
        return AttendResult(response.request_id, out.array,
                            lse.array if lse is not None else None, response.timing,
                            out_scales.array if out_scales is not None else None)
    if tokens is not None and heads is not None:
        _check_tensor(response, "out", pb.DTYPE_E4M3FN if fp8_output else pb.DTYPE_BF16,
                      (tokens, heads, HEAD_DIM))
        if fp8_output or response.HasField("out_scales"):
            if not fp8_output:
                raise ValueError("a bf16 answer carries out_scales")
            _check_tensor(response, "out_scales", pb.DTYPE_UE8M0, (tokens, heads, 4))
        if return_lse or response.HasField("lse"):
            _check_tensor(response, "lse", pb.DTYPE_F32, (tokens, heads))
    lse = to_array(response.lse, "lse") if response.HasField("lse") else None
    scales = (to_array(response.out_scales, "out_scales")
              if response.HasField("out_scales") else None)
    return AttendResult(response.request_id, to_array(response.out, "out"), lse, response.timing,
                        scales)


class AttendStream:
    """One Attend stream (see the module's docstring). Use as a context manager,
    or call close()."""

    def __init__(self, stub, timeout=None, metadata=None, max_in_flight=8,
                 step_timeout=DEFAULT_STEP_TIMEOUT):
        """timeout: the deadline of the whole stream, seconds (None: none).
        max_in_flight: messages unanswered at once. step_timeout: seconds within
        which each message must be answered (and submit() must find room, and
        the server must end the stream after close()); positive and finite."""
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if not 0 < step_timeout < float("inf"):
            raise ValueError(f"step_timeout must be a positive number of seconds, "
                             f"got {step_timeout}")
        self._requests = queue.SimpleQueue()
        self._pending = collections.deque()  # of _Pending
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # wakes the watchdog
        self._slots = threading.Semaphore(max_in_flight)
        self._max_in_flight = max_in_flight
        self._step_timeout = step_timeout
        self._ids = itertools.count(1)
        self._error = None
        self._overdue = None  # the watchdog's DEADLINE_EXCEEDED, once it cancelled the call
        self._closed = False
        self._ended = False  # the reader is done: every future is complete
        self._end_deadline = None  # after close(): when the server must have ended the stream
        self._call = stub.Attend(self._outgoing(), timeout=timeout, metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="mla-offload-attend", daemon=True)
        self._watchdog = threading.Thread(target=self._watch, name="mla-offload-attend-watchdog",
                                          daemon=True)
        self._reader.start()
        self._watchdog.start()

    def submit(self, layer, segments, q, kv=None, compressed_kv=None, topk=None, head_offset=0,
               return_lse=False, derotate_output=False, request_id=None, out=None, lse=None,
               fp8_output=False, out_scales=None):
        """Sends one layer step; returns a Future of its AttendResult.

        layer: the attention layer. segments: Segment list (T = sum of num_tokens).
        q: uint16 bf16 [T, H, 512] (wq_b output before the per-head norm).
        kv: uint16 bf16 [T, 512], the tokens' new SWA rows (None: another
          tensor-parallel rank of the session sends them).
        compressed_kv: uint16 bf16 [rows, 512], the segments' new compressed rows.
        topk: int32 [T, K] of C4A layers, session-relative rows, -1 pads.
        head_offset: this rank's first query head. return_lse, derotate_output:
          see proto/mla_offload.proto. request_id: echoed; default 1, 2, 3, ...
        Same host (regions.py): q, kv and compressed_kv may be RegionArrays
          (HostRegion.ref), sent as references; out (and, with return_lse,
          lse) a RegionArray of out [T, H, 512] uint16 (lse [T, H] float32)
          the server writes the answer into: the result's out and lse are
          then those arrays, filled.
        fp8_output: the output in FP8 (fp8.py): out uint8 e4m3fn [T, H, 512]
          and out_scales uint8 UE8M0 [T, H, 4], 516 bytes a head back instead
          of 1024; into a region, out is then a uint8 RegionArray and
          out_scales one of [T, H, 4] uint8 (at an offset that is a multiple
          of 4).
        Blocks while max_in_flight messages are unanswered, at most step_timeout
        (then MlaOffloadError DEADLINE_EXCEEDED, nothing sent). Raises
        MlaOffloadError if the stream has failed or was closed.
        """
        if request_id is None:
            request_id = next(self._ids)
        request = build_request(request_id, layer, segments, q, kv, compressed_kv, topk,
                                head_offset, return_lse, derotate_output, out, lse, fp8_output,
                                out_scales)
        # The answer's T and H, as the server checks q against the segments.
        tokens = sum(int(segment.num_tokens) for segment in segments)
        q_values = int(np.prod(tuple(request.q.shape), dtype=np.int64))
        heads = q_values // (tokens * HEAD_DIM) if tokens > 0 else 0
        if not self._slots.acquire(timeout=self._step_timeout):
            raise MlaOffloadError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no room within step_timeout={self._step_timeout:g} s: "
                f"max_in_flight={self._max_in_flight} messages are unanswered; nothing sent",
                _METHOD, request_id)
        future = concurrent.futures.Future()
        with self._lock:
            if self._error is not None or self._closed:
                self._slots.release()
                raise self._error or MlaOffloadError(grpc.StatusCode.FAILED_PRECONDITION,
                                                     "the stream is closed", _METHOD, request_id)
            future.set_running_or_notify_cancel()
            self._pending.append(_Pending(request_id, future,
                                          time.monotonic() + self._step_timeout, tokens, heads,
                                          bool(return_lse), out, lse, bool(fp8_output),
                                          out_scales))
            if len(self._pending) == 1:
                self._changed.notify_all()  # the watchdog may be waiting for no deadline
            self._requests.put(request)
        return future

    def attend(self, *args, timeout=None, **kwargs):
        """submit(...) and wait for the answer: an AttendResult, or raises
        MlaOffloadError (concurrent.futures.TimeoutError after `timeout` s)."""
        return self.submit(*args, **kwargs).result(timeout)

    def close(self, timeout=None):
        """Ends the stream after every submitted message is answered; raises the
        stream's MlaOffloadError if it failed. Idempotent.

        Waits at most `timeout` seconds (None: until the stream ends, which
        step_timeout bounds); if the stream has not ended by then, raises
        MlaOffloadError DEADLINE_EXCEEDED and leaves it as it is (its answers
        may still come; cancel() stops it). Called from a future's callback (the
        reader thread), it half-closes the stream and returns without waiting.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._requests.put(None)
                self._changed.notify_all()
        if not self._on_reader_thread():
            self._reader.join(timeout)
            with self._lock:
                if not self._ended:
                    raise MlaOffloadError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"the stream did not end within close(timeout={timeout}) seconds: "
                        f"{len(self._pending)} messages unanswered", _METHOD)
        if self._error is not None:
            raise self._error

    def cancel(self):
        """Cancels the stream at once: unanswered futures fail with CANCELLED.
        Called from a future's callback (the reader thread), it does not wait
        for the other futures to fail."""
        self._call.cancel()
        with self._lock:
            if not self._closed:
                self._closed = True
                self._requests.put(None)
                self._changed.notify_all()
        if not self._on_reader_thread():
            self._reader.join()

    def _on_reader_thread(self):
        # Joining the reader from its own thread would raise RuntimeError.
        return threading.current_thread() is self._reader

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.close()
        else:
            self.cancel()
        return False

    @staticmethod
    def _deliver(response, pending):
        request_id, future = pending.request_id, pending.future
        try:
            result = parse_response(response, pending.tokens, pending.heads, pending.return_lse,
                                    pending.out, pending.lse, pending.fp8_output,
                                    pending.out_scales)
        except ValueError as malformed:  # not the answer asked for, or out's bytes do not fit
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
                    pending = self._pending.popleft()
                self._slots.release()  # first, so that the future's callbacks may submit()
                self._deliver(response, pending)
            error = None
        except grpc.RpcError as rpc_error:
            error = MlaOffloadError.from_rpc_error(rpc_error, _METHOD)
        except Exception as broken:  # the stream cannot go on; fail its futures
            self._call.cancel()
            error = MlaOffloadError(grpc.StatusCode.INTERNAL, str(broken), _METHOD)
        with self._lock:
            if self._overdue is not None and (error is not None or self._pending):
                error = self._overdue  # the watchdog cancelled the call
            if error is None and self._pending:
                error = MlaOffloadError(grpc.StatusCode.INTERNAL,
                                        "the stream ended with messages unanswered", _METHOD)
            self._error = error
            if not self._closed:
                self._closed = True
                self._requests.put(None)  # ends _outgoing, which gRPC may still be reading
            pending, self._pending = list(self._pending), collections.deque()
            self._ended = True
            self._changed.notify_all()
        for unanswered in pending:
            self._slots.release()
            unanswered.future.set_exception(
                MlaOffloadError(error.code, error.message, _METHOD, unanswered.request_id))

    def _watch(self):
        """Cancels the call with DEADLINE_EXCEEDED when the oldest message is
        not answered within step_timeout of its submit(), or the server has
        not ended the stream within step_timeout once close() left nothing
        unanswered."""
        with self._lock:
            while True:
                if self._ended:
                    return
                now = time.monotonic()
                if self._pending:
                    deadline = self._pending[0].deadline
                elif self._closed:
                    if self._end_deadline is None:
                        self._end_deadline = now + self._step_timeout
                    deadline = self._end_deadline
                else:
                    deadline = None
                if deadline is None or now < deadline:
                    self._changed.wait(None if deadline is None else deadline - now)
                    continue
                limit = f"within step_timeout={self._step_timeout:g} s"
                if self._pending:
                    message = (f"message {self._pending[0].request_id} was not answered {limit} "
                               "of its submit(); the stream is cancelled")
                else:
                    message = (f"the server did not end the stream {limit} of close(); "
                               "the stream is cancelled")
                self._overdue = MlaOffloadError(grpc.StatusCode.DEADLINE_EXCEEDED, message,
                                                _METHOD)
                break
        self._call.cancel()
