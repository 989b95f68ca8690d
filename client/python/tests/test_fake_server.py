"""What the client does when the server misbehaves, against an in-process
gRPC Python server of the same service (the real server does not misbehave
on purpose): answers of the wrong dtype or shape, or without the lse asked
for; messages never answered (step_timeout, close(timeout)); close() and
cancel() from a future's callback; and CreateSession's idle TTL as the
client sends it.

The fake's Attend answers each message by its first segment's session id:
"ok" a well-formed answer (an FP8 one when asked), "wrong-out" out float32
[3, 7], "no-lse" no lse (whatever return_lse), "wrong-lse" lse bf16,
"bf16-out" a bf16 out whatever fp8_output, "no-scales" an FP8 out without
out_scales, "scales" out_scales beside whatever out, "silent" nothing, to
it and to every later message, and the stream ends only when the client
cancels it.
"""

import concurrent.futures
import threading
import time
import unittest

import grpc
import numpy as np

import mla_offload as mo
from mla_offload._stubs import pb, pb_grpc

DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED
INTERNAL = grpc.StatusCode.INTERNAL
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT


def tensor(dtype, shape):
    itemsize = {pb.DTYPE_F32: 4, pb.DTYPE_E4M3FN: 1, pb.DTYPE_UE8M0: 1}.get(dtype, 2)
    return pb.Tensor(dtype=dtype, shape=shape, data=bytes(int(np.prod(shape)) * itemsize))


class FakeService(pb_grpc.MlaOffloadServicer):
    def __init__(self):
        self.create_requests = []

    def CreateSession(self, request, context):
        self.create_requests.append(request)
        return pb.CreateSessionResponse(session_id="fake", num_heads=request.num_heads,
                                        padded_heads=8)

    def Attend(self, request_iterator, context):
        ended = threading.Event()
        context.add_callback(ended.set)
        silent = False
        for request in request_iterator:
            kind = request.segments[0].session_id
            if kind == "silent" or silent:  # answers after a silent one would be out of order
                silent = True
                continue
            tokens, heads = request.q.shape[0], request.q.shape[1]
            fp8 = request.fp8_output and kind != "bf16-out"
            response = pb.AttendResponse(
                request_id=request.request_id,
                out=tensor(pb.DTYPE_E4M3FN if fp8 else pb.DTYPE_BF16, [tokens, heads, 512]))
            if (fp8 and kind != "no-scales") or kind == "scales":
                response.out_scales.CopyFrom(tensor(pb.DTYPE_UE8M0, [tokens, heads, 4]))
            if request.return_lse:
                response.lse.CopyFrom(tensor(pb.DTYPE_F32, [tokens, heads]))
            if kind == "wrong-out":
                response.out.CopyFrom(tensor(pb.DTYPE_F32, [3, 7]))
            elif kind == "no-lse":
                response.ClearField("lse")
            elif kind == "wrong-lse":
                response.lse.CopyFrom(tensor(pb.DTYPE_BF16, [tokens, heads]))
            yield response
        if silent:  # a hung server: the stream ends only when the client cancels it
            ended.wait(30)


def q(tokens=1, heads=4):
    return np.zeros((tokens, heads, 512), np.uint16)


class FakeServerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.service = FakeService()
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_MlaOffloadServicer_to_server(cls.service, cls.server)
        cls.port = cls.server.add_insecure_port("127.0.0.1:0")
        cls.server.start()
        cls.client = mo.connect(f"127.0.0.1:{cls.port}", timeout=10.0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop(None)

    def assertFails(self, future, code, *fragments):
        with self.assertRaises(mo.MlaOffloadError) as raised:
            future.result(10)
        self.assertEqual(raised.exception.code, code, raised.exception.message)
        for fragment in fragments:
            self.assertIn(fragment, raised.exception.message)
        return raised.exception

    def test_answers_not_shaped_like_the_message_are_internal(self):
        with self.client.attend() as stream:
            wrong_out = stream.submit(0, [mo.Segment("wrong-out", 0)], q(), return_lse=True)
            no_lse = stream.submit(0, [mo.Segment("no-lse", 0, 2)], q(2, 4), return_lse=True)
            wrong_lse = stream.submit(0, [mo.Segment("wrong-lse", 0)], q(), return_lse=True)
            ok = stream.submit(0, [mo.Segment("ok", 0)], q(), return_lse=True)
            ok_without_lse = stream.submit(0, [mo.Segment("no-lse", 0, 2)], q(2, 16))
            error = self.assertFails(wrong_out, INTERNAL, "AttendResponse.out is [3, 7] DTYPE_F32",
                                     "[1, 4, 512] DTYPE_BF16 is expected")
            self.assertEqual(error.request_id, 1)
            self.assertFails(no_lse, INTERNAL, "AttendResponse.lse is missing",
                             "[2, 4] DTYPE_F32 is expected")
            self.assertFails(wrong_lse, INTERNAL, "AttendResponse.lse is [1, 4] DTYPE_BF16",
                             "[1, 4] DTYPE_F32 is expected")
            # A bad answer fails alone: the stream goes on.
            self.assertEqual(ok.result(10).out.shape, (1, 4, 512))
            self.assertEqual(ok.result(10).lse.shape, (1, 4))
            self.assertEqual(ok_without_lse.result(10).out.shape, (2, 16, 512))
            self.assertIsNone(ok_without_lse.result(10).lse)

    def test_an_fp8_message_needs_an_fp8_answer(self):
        with self.client.attend() as stream:
            bf16_out = stream.submit(0, [mo.Segment("bf16-out", 0)], q(), fp8_output=True)
            no_scales = stream.submit(0, [mo.Segment("no-scales", 0)], q(), fp8_output=True)
            stray_scales = stream.submit(0, [mo.Segment("scales", 0)], q())
            ok = stream.submit(0, [mo.Segment("ok", 0, 2)], q(2, 4), fp8_output=True)
            self.assertFails(bf16_out, INTERNAL, "AttendResponse.out is [1, 4, 512] DTYPE_BF16",
                             "[1, 4, 512] DTYPE_E4M3FN is expected")
            self.assertFails(no_scales, INTERNAL, "AttendResponse.out_scales is missing",
                             "[1, 4, 4] DTYPE_UE8M0 is expected")
            self.assertFails(stray_scales, INTERNAL, "a bf16 answer carries out_scales")
            result = ok.result(10)
            self.assertEqual((result.out.shape, result.out.dtype), ((2, 4, 512), np.uint8))
            self.assertEqual((result.out_scales.shape, result.out_scales.dtype),
                             ((2, 4, 4), np.uint8))

    def test_an_unanswered_message_fails_within_the_step_timeout(self):
        stream = self.client.attend(step_timeout=0.3)
        started = time.monotonic()
        silent = stream.submit(0, [mo.Segment("silent", 0)], q())
        later = stream.submit(0, [mo.Segment("ok", 0)], q())
        error = self.assertFails(silent, DEADLINE_EXCEEDED, "message 1 was not answered",
                                 "step_timeout=0.3")
        self.assertEqual(error.request_id, 1)
        self.assertLess(time.monotonic() - started, 5)
        self.assertFails(later, DEADLINE_EXCEEDED)  # the stream is cancelled
        with self.assertRaises(mo.MlaOffloadError) as raised:
            stream.submit(0, [mo.Segment("ok", 0)], q())
        self.assertEqual(raised.exception.code, DEADLINE_EXCEEDED)
        with self.assertRaises(mo.MlaOffloadError):
            stream.close()

    def test_submit_does_not_wait_forever_for_room(self):
        stream = self.client.attend(max_in_flight=1, step_timeout=0.3)
        stream.submit(0, [mo.Segment("silent", 0)], q())
        raised = []

        def submit_again():
            try:
                stream.submit(0, [mo.Segment("ok", 0)], q())
            except mo.MlaOffloadError as error:
                raised.append(error)

        waiting = threading.Thread(target=submit_again, daemon=True)
        started = time.monotonic()
        waiting.start()
        waiting.join(10)
        self.assertFalse(waiting.is_alive(), "submit() still waits for room")
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual([error.code for error in raised], [DEADLINE_EXCEEDED])
        stream.cancel()

    def test_submit_from_a_callback_with_no_room_times_out(self):
        # The callback runs on the reader thread, so no answer can free room
        # until it returns: without a bound on the wait this would hang.
        stream = self.client.attend(max_in_flight=1, step_timeout=0.3)
        # Not stream.cancel(), which would wait for a reader stuck in the callback.
        self.addCleanup(stream._call.cancel)
        raised = []

        def submit_again(_):
            try:
                stream.submit(0, [mo.Segment("ok", 0)], q())
                stream.submit(0, [mo.Segment("ok", 0)], q())
            except mo.MlaOffloadError as error:
                raised.append(error)

        stream.submit(0, [mo.Segment("ok", 0)], q()).add_done_callback(submit_again)
        deadline = time.monotonic() + 10
        while not raised and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual([error.code for error in raised], [DEADLINE_EXCEEDED])
        self.assertIn("max_in_flight=1", raised[0].message)

    def test_close_with_a_timeout_raises_when_messages_are_unanswered(self):
        stream = self.client.attend()
        stream.submit(0, [mo.Segment("silent", 0)], q())
        started = time.monotonic()
        with self.assertRaises(mo.MlaOffloadError) as raised:
            stream.close(timeout=0.2)
        self.assertEqual(raised.exception.code, DEADLINE_EXCEEDED)
        self.assertIn("1 messages unanswered", raised.exception.message)
        self.assertLess(time.monotonic() - started, 5)
        stream.cancel()

    def test_close_and_cancel_from_a_callback(self):
        for method in ("close", "cancel"):
            with self.subTest(method):
                stream = self.client.attend()
                raised = []
                called = threading.Event()

                def end_stream(_):
                    try:
                        getattr(stream, method)()
                    except Exception as error:  # callbacks' exceptions are only logged
                        raised.append(error)
                    finally:
                        called.set()

                stream.submit(0, [mo.Segment("ok", 0)], q()).add_done_callback(end_stream)
                self.assertTrue(called.wait(10))
                self.assertEqual(raised, [])
                with self.assertRaises(mo.MlaOffloadError) as refused:
                    stream.submit(0, [mo.Segment("ok", 0)], q())
                self.assertIn(refused.exception.code,
                              (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED))
                if method == "close":
                    stream.close(timeout=10)

    def test_step_timeout_must_be_positive(self):
        for step_timeout in (0, -1, float("inf"), float("nan")):
            with self.subTest(step_timeout=step_timeout):
                with self.assertRaisesRegex(ValueError, "step_timeout"):
                    self.client.attend(step_timeout=step_timeout)

    def test_idle_ttl_is_sent_in_whole_seconds_up_to_the_int32_limit(self):
        for given, sent in ((0, 0), (1, 1), (1.5, 2), (0.001, 1), (2**31 - 1, 2**31 - 1),
                            (2**31, 2**31 - 1), (1e30, 2**31 - 1), (float("inf"), 2**31 - 1)):
            with self.subTest(given=given):
                self.client.create_session("m", 8, idle_ttl_seconds=given)
                self.assertEqual(self.service.create_requests[-1].idle_ttl_seconds, sent)

    def test_a_negative_idle_ttl_is_refused_before_sending(self):
        sent = len(self.service.create_requests)
        for given in (-1, -0.5, float("-inf"), float("nan")):
            with self.subTest(given=given):
                with self.assertRaises(mo.MlaOffloadError) as raised:
                    self.client.create_session("m", 8, idle_ttl_seconds=given)
                self.assertEqual(raised.exception.code, INVALID_ARGUMENT)
                self.assertEqual(raised.exception.method, "CreateSession")
                self.assertIn("idle_ttl_seconds", raised.exception.message)
        self.assertEqual(len(self.service.create_requests), sent)


if __name__ == "__main__":
    unittest.main()
