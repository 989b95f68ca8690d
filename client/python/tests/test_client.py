"""The client against the real server: server info, sessions, AppendKV, the
Attend stream (pipelined, in order), Echo, deadlines, and errors with their
gRPC codes and messages, leaving every session as it was."""

import concurrent.futures
import signal
import time

import grpc
import numpy as np

import mla_offload as mo
from server_test_case import FLASH, PRO, ServerTestCase, prompt_layers, random_bf16

NOT_FOUND = grpc.StatusCode.NOT_FOUND
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


class Sequence:
    """A session and the random inputs of its steps (a pure function of the
    seed, so that a twin session can be given the same ones)."""

    def __init__(self, client, model, heads, seed, prompt):
        self.model = model
        self.heads = heads
        self.seed = seed
        self.session = client.create_session(model.name, heads)
        rng = np.random.default_rng(seed)
        client.append_kv(self.session, 0, prompt_layers(rng, model, 0, prompt))

    def step(self, layer, position, **kwargs):
        """submit() arguments of one token at `position` of `layer`."""
        rng = np.random.default_rng([self.seed, layer, position])
        ratio = self.model.compress_ratios[layer]
        segment = mo.Segment(self.session, position)
        compressed = None
        topk = None
        if ratio:
            new_rows = (position + 1) // ratio - position // ratio
            segment = mo.Segment(self.session, position, 1, position // ratio, new_rows)
            compressed = random_bf16(rng, (new_rows, 512)) if new_rows else None
        if ratio == 4:
            rows = (position + 1) // 4
            topk = np.full((1, 16), -1, np.int32)
            topk[0, :min(rows, 12)] = rng.permutation(rows)[:12]
        arguments = dict(layer=layer, segments=[segment],
                         q=random_bf16(rng, (1, self.heads, 512)),
                         kv=random_bf16(rng, (1, 512)), compressed_kv=compressed, topk=topk,
                         return_lse=True)
        arguments.update(kwargs)
        return arguments


class ClientTest(ServerTestCase):

    def test_server_info_describes_the_server(self):
        info = self.client.server_info()
        self.assertTrue(info.version.startswith("mla-offload"), info.version)
        self.assertTrue(info.backend.startswith("cpu"), info.backend)
        self.assertEqual(list(info.supported_head_counts), list(range(8, 129, 8)))
        self.assertEqual(info.kv_block_tokens, 64)
        self.assertEqual(info.kv_bytes_per_token, 584)
        self.assertEqual(info.max_position, 8192)
        self.assertGreater(info.kv_blocks_total, 0)
        models = {model.name: model for model in info.models}
        self.assertEqual(set(models), {FLASH, PRO})
        flash, pro = models[FLASH], models[PRO]
        self.assertEqual((flash.num_layers, flash.num_attention_layers, flash.num_query_heads),
                         (43, 44, 64))
        self.assertEqual(list(flash.compress_ratios), [0, 0] + [4, 128] * 20 + [4, 0])
        self.assertEqual(list(pro.compress_ratios), [128, 128] + [4, 128] * 29 + [4, 0])
        self.assertEqual((pro.num_query_heads, pro.indexer_topk), (128, 1024))
        for model in (flash, pro):
            self.assertEqual((model.head_dim, model.swa_window), (512, 128))
            self.assertAlmostEqual(model.softmax_scale, 512 ** -0.5, places=7)
        with self.assertRaises(KeyError):
            self.client.model("deepseek-v9")

    def test_health_is_serving(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health(service=mo.READINESS_SERVICE), "SERVING")

    def test_session_lifecycle(self):
        sessions_before = self.client.server_info().sessions
        blocks_before = self.client.server_info().kv_blocks_used
        sinks = np.linspace(2.0, 7.0, 44 * 64, dtype=np.float32).reshape(44, 64)
        full = self.client.create_session(FLASH, 16, sinks=sinks)
        small = self.client.create_session(PRO, 4, idle_ttl_seconds=600)
        self.assertEqual((full.num_heads, full.padded_heads, full.model), (16, 16, FLASH))
        self.assertEqual((small.num_heads, small.padded_heads), (4, 8))
        self.assertNotEqual(full.session_id, small.session_id)
        self.assertGreaterEqual(len(full.session_id), 16)

        listed = self.listed(full)
        self.assertIsNotNone(listed)
        self.assertEqual((listed.model, listed.num_heads, listed.next_position), (FLASH, 16, 0))
        self.assertEqual(self.listed(small).model, PRO)
        info = self.client.server_info()
        self.assertEqual(info.sessions, sessions_before + 2)
        self.assertEqual(info.kv_blocks_used,
                         blocks_before + listed.kv_blocks + self.listed(small).kv_blocks)

        self.assertEqual(self.client.close_session(full), listed.kv_blocks)
        self.assertIsNone(self.listed(full))
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.close_session(full)
        self.assertError(raised, NOT_FOUND, full.session_id)
        self.assertEqual(raised.exception.method, "CloseSession")
        self.client.close_session(small.session_id)
        info = self.client.server_info()
        self.assertEqual((info.sessions, info.kv_blocks_used), (sessions_before, blocks_before))

    def test_append_kv_continues_the_session(self):
        rng = np.random.default_rng(1)
        session = self.client.create_session(FLASH, 8)
        first = self.client.append_kv(session, 0, prompt_layers(rng, self.flash, 0, 70))
        self.assertEqual(first.next_position, 70)
        second = self.client.append_kv(session, 70, prompt_layers(rng, self.flash, 70, 190))
        self.assertEqual(second.next_position, 260)
        # 44 SWA rings of 4 blocks, then 64-row pages: 65 rows of each C4A
        # layer take 2 pages, the 2 rows of each C128A layer 1.
        self.assertEqual(first.kv_blocks_used, 44 * 4 + 21)
        self.assertEqual(second.kv_blocks_used, 44 * 4 + 21 * 2 + 20)
        listed = self.listed(session)
        self.assertEqual((listed.next_position, listed.kv_blocks), (260, second.kv_blocks_used))
        with self.assertRaises(mo.MlaOffloadError) as raised:  # a gap
            self.client.append_kv(session, 300, prompt_layers(rng, self.flash, 300, 4))
        self.assertError(raised, FAILED_PRECONDITION, "first_position", "260")
        self.client.close_session(session)

    def test_unknown_session_is_not_found(self):
        rng = np.random.default_rng(2)
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.append_kv("no-such-session", 0, prompt_layers(rng, self.flash, 0, 4))
        self.assertError(raised, NOT_FOUND, "no-such-session")
        self.assertEqual(raised.exception.method, "AppendKV")

        sequence = Sequence(self.client, self.flash, 8, 3, 20)
        with self.client.attend() as stream:
            refused = stream.submit(0, [mo.Segment("no-such-session", 20)],
                                    random_bf16(rng, (1, 8, 512)), kv=random_bf16(rng, (1, 512)))
            served = stream.submit(**sequence.step(0, 20))
            with self.assertRaises(mo.MlaOffloadError) as raised:
                refused.result(30)
            self.assertError(raised, NOT_FOUND, "no-such-session")
            self.assertEqual((raised.exception.method, raised.exception.request_id), ("Attend", 1))
            result = served.result(30)  # the stream goes on
            self.assertEqual(result.request_id, 2)
            self.assertEqual(result.out.shape, (1, 8, 512))
        self.client.close_session(sequence.session)

    def test_wrong_shapes_are_invalid_argument_naming_the_field_and_change_nothing(self):
        rng = np.random.default_rng(4)
        session = self.client.create_session(FLASH, 8)
        layers = prompt_layers(rng, self.flash, 0, 24)
        bad = list(layers)
        bad[5] = mo.LayerRows(5, layers[5].swa_kv[:23], layers[5].compressed_kv,
                              layers[5].first_compressed_row)
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.append_kv(session, 0, bad, num_positions=24)
        self.assertError(raised, INVALID_ARGUMENT, "layers[layer=5].swa_kv", "[23, 512]")
        listed = self.listed(session)
        self.assertEqual(listed.next_position, 0)
        self.assertEqual(self.client.append_kv(session, 0, layers).next_position, 24)
        self.client.close_session(session)

        # Twin sessions with the same prompt and steps: one is sent broken
        # messages first. Its answers must be the other's, bit for bit.
        tried = Sequence(self.client, self.flash, 8, 5, 43)
        clean = Sequence(self.client, self.flash, 8, 5, 43)
        blocks = self.listed(tried.session).kv_blocks
        broken = [
            ("q", dict(q=random_bf16(rng, (1, 9, 512)))),
            ("kv", dict(kv=random_bf16(rng, (2, 512)))),
            ("topk", dict(topk=np.zeros((2, 16), np.int32))),
            ("compressed_kv", dict(compressed_kv=random_bf16(rng, (1, 511)))),
        ]
        with self.client.attend() as stream:
            for field, change in broken:
                with self.subTest(field=field):
                    with self.assertRaises(mo.MlaOffloadError) as raised:
                        stream.attend(**tried.step(2, 43, **change), timeout=30)
                    self.assertError(raised, INVALID_ARGUMENT, field)
            self.assertEqual(self.listed(tried.session).kv_blocks, blocks)
            for layer in (2, 3, 0):
                after_failures = stream.attend(**tried.step(layer, 43), timeout=30)
                untouched = stream.attend(**clean.step(layer, 43), timeout=30)
                np.testing.assert_array_equal(after_failures.out, untouched.out)
                np.testing.assert_array_equal(after_failures.lse, untouched.lse)
        self.client.close_session(tried.session)
        self.client.close_session(clean.session)

    def test_pipelined_attend_answers_in_order(self):
        sequences = [Sequence(self.client, self.flash, 8, seed, 63) for seed in (6, 7)]
        twins = [Sequence(self.client, self.flash, 8, seed, 63) for seed in (6, 7)]
        # Two positions of four layers of two sessions (the first brings a new
        # C4A row), and one message the server refuses in the middle: eight
        # unanswered at once at most.
        plan = [(s, layer, position) for position in (63, 64) for layer in (0, 1, 2, 3)
                for s in (0, 1)]
        refused_at = 5
        with self.client.attend(max_in_flight=8) as stream:
            futures = []
            for i, (s, layer, position) in enumerate(plan):
                arguments = sequences[s].step(layer, position, request_id=1000 + i)
                if i == refused_at:
                    futures.append(stream.submit(**dict(arguments, q=arguments["q"][:, :4])))
                    futures.append(stream.submit(**sequences[s].step(layer, position,
                                                                     request_id=2000)))
                else:
                    futures.append(stream.submit(**arguments))
            done_order = []
            for i, future in enumerate(futures):
                future.add_done_callback(lambda _, i=i: done_order.append(i))
            results = []
            for future in futures:
                try:
                    results.append(future.result(60))
                except mo.MlaOffloadError as error:
                    results.append(error)
        self.assertEqual(done_order, sorted(done_order))
        ids = [1000 + i for i in range(len(plan))]
        ids.insert(refused_at + 1, 2000)
        self.assertEqual([r.request_id for r in results], ids)
        self.assertIsInstance(results[refused_at], mo.MlaOffloadError)
        self.assertEqual(results[refused_at].code, INVALID_ARGUMENT)
        self.assertIn("q", results[refused_at].message)
        # Each answer is what the same message gets alone, one at a time.
        answered = [r for r in results if not isinstance(r, mo.MlaOffloadError)]
        with self.client.attend(max_in_flight=1) as stream:
            for result, (s, layer, position) in zip(answered, plan):
                alone = stream.attend(**twins[s].step(layer, position), timeout=30)
                np.testing.assert_array_equal(result.out, alone.out)
                np.testing.assert_array_equal(result.lse, alone.lse)
                self.assertEqual(result.out.shape, (1, 8, 512))
                self.assertGreater(result.timing.total_us, 0)
        for sequence in sequences + twins:
            self.client.close_session(sequence.session)

    def test_host_regions_carry_the_tensors_and_the_answer(self):
        """q, kv and compressed rows in shared memory and the answer written
        there give, bit for bit, a twin session's inline answer; a top-k in a
        region is refused; the region goes with close()."""
        plain = Sequence(self.client, self.flash, 8, 97, 200)
        shared = Sequence(self.client, self.flash, 8, 97, 200)
        with self.client.host_region(1 << 20) as region, self.client.attend() as stream:
            self.assertEqual([info.region_id for info in self.client.list_regions()], [region.id])
            for layer in (0, 2, 3):  # SWA, C4A, C128A
                inline = stream.attend(**plain.step(layer, 200))
                arguments = shared.step(layer, 200)
                offset = 0
                for name in ("q", "kv", "compressed_kv"):
                    if arguments[name] is None:
                        continue
                    view = region.array(arguments[name].shape, np.uint16, offset)
                    view[...] = arguments[name]
                    arguments[name] = region.ref(view)
                    offset += view.nbytes
                out = region.array(inline.out.shape, np.uint16, offset)
                lse = region.array(inline.lse.shape, np.float32, offset + out.nbytes)
                result = stream.attend(**arguments, out=region.ref(out), lse=region.ref(lse))
                self.assertIs(result.out, out)
                np.testing.assert_array_equal(out, inline.out)
                np.testing.assert_array_equal(lse, inline.lse)
            arguments = shared.step(2, 201)
            topk = region.array(arguments["topk"].shape, np.int32, 1 << 19)
            topk[...] = arguments["topk"]
            arguments["topk"] = region.ref(topk)
            with self.assertRaises(mo.MlaOffloadError) as raised:
                stream.attend(**arguments)
            self.assertError(raised, INVALID_ARGUMENT, "topk.region", "must travel inline")
            with self.assertRaises(ValueError):
                region.ref(np.zeros(4, np.uint16))  # not in the region
        self.assertEqual(self.client.list_regions(), [])

    def test_fp8_answers_inline_and_into_a_host_region(self):
        """fp8_output: out uint8 e4m3 codes and out_scales uint8 [T, H, 4] (the
        server's bytes, 516 a head); written into a region, bit for bit a
        twin session's inline answer; the same message as bf16 is within the
        e4m3 rounding of the dequantised codes."""
        plain = Sequence(self.client, self.flash, 8, 98, 200)
        shared = Sequence(self.client, self.flash, 8, 98, 200)
        bf16 = Sequence(self.client, self.flash, 8, 98, 200)
        for sequence in (plain, shared, bf16):
            self.addCleanup(self.client.close_session, sequence.session)
        with self.client.host_region(1 << 20) as region, self.client.attend() as stream:
            for layer in (0, 2, 3):  # SWA, C4A, C128A
                inline = stream.attend(**plain.step(layer, 200, fp8_output=True))
                self.assertEqual((inline.out.shape, inline.out.dtype), ((1, 8, 512), np.uint8))
                self.assertEqual((inline.out_scales.shape, inline.out_scales.dtype),
                                 ((1, 8, 4), np.uint8))
                out = region.array((1, 8, 512), np.uint8, 0)
                scales = region.array((1, 8, 4), np.uint8, 4096)
                lse = region.array((1, 8), np.float32, 4096 + 32)
                result = stream.attend(**shared.step(layer, 200, fp8_output=True),
                                       out=region.ref(out), out_scales=region.ref(scales),
                                       lse=region.ref(lse))
                self.assertIs(result.out, out)
                self.assertIs(result.out_scales, scales)
                np.testing.assert_array_equal(out, inline.out)
                np.testing.assert_array_equal(scales, inline.out_scales)
                np.testing.assert_array_equal(lse, inline.lse)
                # The bf16 answer rounds the same fp32 output the codes quantise.
                other = stream.attend(**bf16.step(layer, 200))
                self.assertIsNone(other.out_scales)
                np.testing.assert_array_equal(other.lse, inline.lse)
                values = mo.dequantize_fp8(inline.out, inline.out_scales).astype(np.float64)
                reference = mo.bf16_to_float32(other.out).astype(np.float64)
                block_scale = np.repeat(2.0 ** (inline.out_scales.astype(np.float64) - 127), 128,
                                        axis=-1)
                bound = (2.0 ** -4 * np.abs(reference) + 2.0 ** -10 * block_scale
                         + 2.0 ** -8 * np.abs(reference))  # e4m3 and bf16 rounding
                self.assertTrue(np.all(np.abs(values - reference) <= bound), f"layer {layer}")
            arguments = shared.step(0, 201, fp8_output=True, return_lse=False)
            with self.assertRaises(mo.MlaOffloadError) as raised:
                stream.attend(**arguments, out=region.ref(region.array((1, 8, 512), np.uint8)))
            self.assertError(raised, INVALID_ARGUMENT, "out_scales_region",
                             "fp8_output needs an out_scales_region too")

    def test_closed_stream_refuses_new_messages(self):
        stream = self.client.attend()
        stream.close()
        with self.assertRaises(mo.MlaOffloadError) as raised:
            stream.submit(0, [mo.Segment("x", 0)], np.zeros((1, 8, 512), np.uint16))
        self.assertEqual(raised.exception.code, FAILED_PRECONDITION)

    def test_tensors_of_the_wrong_type_are_refused_before_sending(self):
        with self.client.attend() as stream:
            with self.assertRaisesRegex(TypeError, "q: expected bf16.*float32_to_bf16"):
                stream.submit(0, [mo.Segment("x", 0)], np.zeros((1, 8, 512), np.float32))
        with self.assertRaisesRegex(TypeError, "sinks: expected float32"):
            self.client.create_session(FLASH, 8, sinks=np.zeros((44, 8)))

    def test_create_session_errors_name_the_field(self):
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.create_session("deepseek-v9", 8)
        self.assertError(raised, INVALID_ARGUMENT, "model", "deepseek-v9")
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.create_session(FLASH, 8, sinks=np.zeros((44, 7), np.float32))
        self.assertError(raised, INVALID_ARGUMENT, "sinks", "[44, 7]")
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.create_session(FLASH, 256)
        self.assertError(raised, INVALID_ARGUMENT, "num_heads")

    def test_echo_returns_every_payload(self):
        payloads = [b"", b"x", bytes(range(256)) * 4096]  # 1 MiB last
        self.assertEqual(self.client.echo(payloads), payloads)


class self_raises_not_found:
    """A context that expects (and swallows) an MlaOffloadError NOT_FOUND."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if not isinstance(error, mo.MlaOffloadError) or error.code != grpc.StatusCode.NOT_FOUND:
            raise AssertionError(f"expected NOT_FOUND, got {error!r}")
        return True


class SlowServerTest(ServerTestCase):
    """Deadlines and the in-flight bound, on a server that holds each Attend
    message 1.5 s for a batch (longer than the deadlines): a pacer stream
    that has sent one message (to no session) stays active for
    --active_stream_ms, so every other stream's batch waits the whole
    --batch_wait_us for its next message."""

    server_flags = ("--batch_wait_us=1500000", "--active_stream_ms=3600000")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pacer = cls.client.attend()
        rng = np.random.default_rng(7)
        with self_raises_not_found():
            cls.pacer.attend(layer=0, segments=[mo.Segment("no such session", 0)],
                             q=random_bf16(rng, (1, 8, 512)), kv=random_bf16(rng, (1, 512)),
                             timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.pacer.close()
        super().tearDownClass()

    def test_unary_call_deadline(self):
        rng = np.random.default_rng(8)
        session = self.client.create_session(FLASH, 8)
        started = time.monotonic()
        with self.assertRaises(mo.MlaOffloadError) as raised:
            self.client.append_kv(session, 0, prompt_layers(rng, self.flash, 0, 128),
                                  timeout=0.001)
        self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.monotonic() - started, 2.0)
        self.client.close_session(session)

    def test_stream_deadline_fails_unanswered_messages(self):
        sequence = Sequence(self.client, self.flash, 8, 9, 10)
        stream = self.client.attend(timeout=0.5)
        future = stream.submit(**sequence.step(0, 10))
        with self.assertRaises(mo.MlaOffloadError) as raised:
            future.result(10)
        self.assertError(raised, grpc.StatusCode.DEADLINE_EXCEEDED)
        with self.assertRaises(mo.MlaOffloadError) as raised:
            stream.close()
        self.assertEqual(raised.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)
        with self.assertRaises(mo.MlaOffloadError):
            stream.submit(**sequence.step(0, 10))

    def test_waiting_for_an_answer_can_time_out(self):
        sequence = Sequence(self.client, self.flash, 8, 10, 10)
        with self.client.attend() as stream:
            future = stream.submit(**sequence.step(0, 10))
            with self.assertRaises(concurrent.futures.TimeoutError):
                future.result(0.2)
            self.assertEqual(future.result(30).out.shape, (1, 8, 512))

    def test_submit_waits_while_max_in_flight_are_unanswered(self):
        sequence = Sequence(self.client, self.flash, 8, 11, 10)
        with self.client.attend(max_in_flight=2) as stream:
            started = time.monotonic()
            first = stream.submit(**sequence.step(0, 10))
            second = stream.submit(**sequence.step(1, 10))
            self.assertLess(time.monotonic() - started, 0.5)
            third = stream.submit(**sequence.step(0, 11))  # waits for the first answer
            self.assertGreater(time.monotonic() - started, 1.0)
            # The first answer came: its slot is freed just before its future
            # completes (so that a future's callback may submit), so wait a
            # moment rather than test done() at once.
            self.assertEqual(first.result(5).request_id, 1)
            self.assertEqual([f.result(30).request_id for f in (first, second, third)], [1, 2, 3])


class DrainTest(ServerTestCase):
    """What a client sees while the server drains after SIGTERM."""

    def test_draining_refuses_new_sessions_and_serves_open_streams(self):
        sequence = Sequence(self.client, self.flash, 8, 12, 10)
        with self.client.attend() as stream:
            stream.attend(**sequence.step(0, 10), timeout=30)
            self.server.signal(signal.SIGTERM)
            self.assertIsNotNone(self.server.wait_for_line("draining", 5), self.server.output())
            deadline = time.monotonic() + 2
            ready = mo.READINESS_SERVICE
            while self.client.health(service=ready) == "SERVING" and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(self.client.health(service=ready), "NOT_SERVING")
            self.assertEqual(self.client.health(), "SERVING")  # liveness
            with self.assertRaises(mo.MlaOffloadError) as raised:
                self.client.create_session(FLASH, 8)
            self.assertError(raised, grpc.StatusCode.UNAVAILABLE, "draining")
            result = stream.attend(**sequence.step(0, 11), timeout=30)  # the open stream goes on
            self.assertEqual(result.out.shape, (1, 8, 512))
        self.assertEqual(self.server.wait(5), 0, self.server.output())
