"""End to end through the Python client: the server's Attend answers (bf16,
and the FP8 output) against the numpy float64 model of the spec
(dsv4_reference.py), within section 7's tolerances."""

import unittest

import numpy as np

import mla_offload as mo
import dsv4_reference as ref
from server_test_case import FLASH, ServerTestCase, random_bf16

PROMPT = 299  # the step at 299 brings C4A row 74; C128A layers hold rows 0 and 1
HEADS = 4     # a V4-Flash TP16 rank: runs padded to 8 heads
HEAD_OFFSET = 12


def scaled_rows(rng, count):
    """Random bf16 rows whose 64-wide tiles differ in size (factors 1/8 to
    1.4), so that the FP8 tiles get different UE8M0 scales."""
    scales = 2.0 ** rng.uniform(-3, 0.5, size=(count, 8))
    values = rng.standard_normal((count, 512)) * np.repeat(scales, 64, axis=1)
    return mo.float32_to_bf16(np.where(np.abs(values) < 1e-3, 1e-3, values).astype(np.float32))


def topk_rows(rng, rows, width):
    """An indexer top-k of a token: the newest row, row 0 and random others,
    one listed twice, -1 pads (one moved into the middle)."""
    chosen = [rows - 1, 0] + list(rng.choice(np.arange(1, rows - 1), width - 8, replace=False))
    chosen.append(chosen[3])
    rng.shuffle(chosen)
    topk = np.full(width, -1, np.int32)
    topk[:len(chosen)] = chosen
    topk[[len(chosen) // 2, len(chosen)]] = topk[[len(chosen), len(chosen) // 2]]
    return topk


class NumericsTest(ServerTestCase):

    def test_attend_matches_the_float64_model_of_the_spec(self):
        rng = np.random.default_rng(2026)
        model = self.flash
        ratios = list(model.compress_ratios)
        layers = len(ratios)
        sinks = rng.uniform(2.0, 7.0, size=(layers, model.num_query_heads)).astype(np.float32)
        sinks[3, HEAD_OFFSET + 1] = -np.inf  # a head without sink
        session = self.client.create_session(FLASH, HEADS, sinks=sinks)
        self.assertEqual(session.padded_heads, 8)

        # Every row the session will hold: SWA rows of positions 0..300 and
        # compressed rows, per layer.
        swa = [scaled_rows(rng, PROMPT + 2) for _ in range(layers)]
        compressed = [scaled_rows(rng, (PROMPT + 2) // r) if r else None for r in ratios]
        self.client.append_kv(session, 0, [
            mo.LayerRows(layer, swa[layer][:PROMPT],
                         compressed[layer][:PROMPT // r] if r else None)
            for layer, r in enumerate(ratios)])

        # One step of two tokens (positions 299 and 300) on an SWA-only, a
        # C4A and a C128A layer, sent before any answer is read; on the C4A
        # layer a second tensor-parallel rank (the next 4 heads) repeats the
        # step without rows, as ranks after the first do.
        positions = np.array([PROMPT, PROMPT + 1])
        steps = []
        topk = {2: np.stack([topk_rows(rng, (p + 1) // 4, 20) for p in positions])}
        with self.client.attend() as stream:
            for layer, head_offset, derotate in ((0, HEAD_OFFSET, False),
                                                 (2, HEAD_OFFSET, True),
                                                 (3, HEAD_OFFSET, True),
                                                 (2, HEAD_OFFSET + HEADS, False)):
                r = ratios[layer]
                first_rank = head_offset == HEAD_OFFSET
                first_row = PROMPT // r if r and first_rank else 0
                new_rows = (PROMPT + 2) // r - first_row if r and first_rank else 0
                # Head 0 looks for the row 5 positions back (one key dominates,
                # the output is about that row); the other heads attend broadly.
                q = rng.standard_normal((2, HEADS, 512))
                q[:, 0] = mo.bf16_to_float32(swa[layer][positions - 5]) + 0.1 * q[:, 0]
                q = mo.float32_to_bf16(q.astype(np.float32))
                future = stream.submit(
                    layer, [mo.Segment(session, PROMPT, 2, first_row, new_rows)], q,
                    kv=swa[layer][PROMPT:PROMPT + 2] if first_rank else None,
                    compressed_kv=compressed[layer][first_row:first_row + new_rows]
                    if new_rows else None,
                    topk=topk.get(layer), head_offset=head_offset, return_lse=True,
                    derotate_output=derotate)
                # The same step again as a rank that brings no rows, asking
                # for the FP8 output.
                fp8_future = stream.submit(
                    layer, [mo.Segment(session, PROMPT, 2)], q, topk=topk.get(layer),
                    head_offset=head_offset, return_lse=True, derotate_output=derotate,
                    fp8_output=True)
                steps.append((layer, head_offset, q, derotate, future, fp8_future))

        for layer, head_offset, q, derotate, future, fp8_future in steps:
            with self.subTest(layer=layer, ratio=ratios[layer], head_offset=head_offset):
                result = future.result(60)
                self.assertEqual(result.out.shape, (2, HEADS, 512))
                self.assertEqual(result.lse.shape, (2, HEADS))
                r = ratios[layer]
                keys = []
                for t, p in enumerate(positions):
                    rows = [ref.cache_row(swa[layer][w], w, r)
                            for w in range(max(0, p - 127), p + 1)]
                    if r == 4:
                        rows += [ref.cache_row(compressed[layer][j], 4 * j, r)
                                 for j in topk[layer][t] if j != -1]
                    elif r == 128:
                        rows += [ref.cache_row(compressed[layer][j], 128 * j, r)
                                 for j in range((p + 1) // 128)]
                    keys.append(np.stack(rows))
                # q_out is computed here, not the server's own: the check
                # carries section 7's composition clause.
                q_float64 = ref.prologue_q_float64(q, positions, r)
                q_out = ref.round_to_bf16(q_float64)
                deltas = ref.composition_deltas(ref.tie_slack(q_float64), keys)
                layer_sinks = sinks[layer, head_offset:head_offset + HEADS]
                expected_out, expected_lse = ref.decode(q_out, keys, layer_sinks, positions, r,
                                                        derotate)
                out = mo.bf16_to_float32(result.out)
                problems = ref.decode_violations(out, result.lse, expected_out, expected_lse,
                                                 keys, deltas)
                self.assertEqual(problems, [], "\n".join(problems))
                # The check has teeth: without the sink the answer is far outside it.
                no_sink, _ = ref.decode(q_out, keys, np.full(HEADS, -np.inf), positions, r,
                                        derotate)
                self.assertNotEqual(
                    ref.decode_violations(out, None, no_sink, expected_lse, keys, deltas), [])

                fp8 = fp8_future.result(60)
                self.assertEqual((fp8.out.shape, fp8.out.dtype), ((2, HEADS, 512), np.uint8))
                self.assertEqual((fp8.out_scales.shape, fp8.out_scales.dtype),
                                 ((2, HEADS, 4), np.uint8))
                problems = ref.fp8_violations(fp8.out, fp8.out_scales, expected_out, keys, deltas)
                self.assertEqual(problems, [], "\n".join(problems))
                problems = ref.decode_violations(mo.dequantize_fp8(fp8.out, fp8.out_scales),
                                                 fp8.lse, expected_out, expected_lse, keys, deltas)
                self.assertEqual([p for p in problems if "lse" in p], [], "the FP8 answer's lse")
                # The FP8 rule has teeth: a scale one off, or no sink, fails it.
                wrong = fp8.out_scales.copy()
                wrong[1, 2, 0] += 1
                self.assertNotEqual(ref.fp8_violations(fp8.out, wrong, expected_out, keys, deltas),
                                    [])
                self.assertNotEqual(ref.fp8_violations(fp8.out, fp8.out_scales, no_sink, keys,
                                                       deltas), [])
        self.client.close_session(session)


class ReferenceTest(unittest.TestCase):
    """The float64 model itself, on facts the spec states."""

    def test_yarn_formula_gives_the_pinned_frequencies(self):
        pinned = ref.frequencies(4).astype(np.float64)
        formula = ref.yarn_frequencies_float64()
        np.testing.assert_allclose(formula, pinned, rtol=1e-6, atol=0)

    def test_e4m3_rounding(self):
        values = np.array([448.0, -448.0, 1.0, 1.0625, 1.1875, 0.001953125, 0.0029296875, 240.0,
                           232.0, 0.0])
        expected = np.array([448.0, -448.0, 1.0, 1.0, 1.25, 0.001953125, 0.00390625, 240.0,
                             224.0, 0.0])
        np.testing.assert_array_equal(ref.e4m3_round(values), expected)

    def test_cache_row_scales_each_tile_by_a_power_of_two(self):
        rng = np.random.default_rng(3)
        row = mo.float32_to_bf16(rng.standard_normal(512).astype(np.float32) * 3.0)
        key = ref.cache_row(row, 0, 0)  # position 0: RoPE is the identity
        original = mo.bf16_to_float32(row).astype(np.float64)
        np.testing.assert_array_equal(key[448:], original[448:])
        for tile in range(7):
            part = slice(64 * tile, 64 * tile + 64)
            # e4m3 keeps 3 mantissa bits: within 1/16 relative, or the
            # subnormal step of the tile's scale.
            scale = 2.0 ** np.ceil(np.log2(np.max(np.abs(original[part])) / 448))
            error = np.abs(key[part] - original[part])
            self.assertTrue(np.all(error <= np.abs(original[part]) / 16 + scale * 2.0 ** -10),
                            f"tile {tile}")

    def test_round_to_bf16_rounds_once(self):
        # 1 + 2^-8 is the midpoint of bf16 1 and 1 + 2^-7; a hair above it
        # rounds up, exactly on it to even (down).
        self.assertEqual(ref.round_to_bf16(1.0 + 2.0 ** -8 + 2.0 ** -40), 1.0 + 2.0 ** -7)
        self.assertEqual(ref.round_to_bf16(1.0 + 2.0 ** -8), 1.0)
        self.assertEqual(ref.round_to_bf16(-(1.0 + 2.0 ** -8 + 2.0 ** -40)), -(1.0 + 2.0 ** -7))


class CompositionTest(unittest.TestCase):
    """Section 7's lse rule and composition clause in decode_violations: one
    token over 40 random keys, two heads. Head 0 looks for key 7 (lse about
    70) and its element 100 lies exactly on the bf16 midpoint between 12 and
    12.0625, where key 7 holds 2: one ulp there moves lse by about 5e-3. Head
    1 attends broadly and its sink matters."""

    TIE = 12.03125

    def setUp(self):
        rng = np.random.default_rng(2026)
        rows = ref.round_to_bf16(rng.standard_normal((40, 512)))
        rows[7, 100] = 2.0
        self.keys = [rows]
        q = np.zeros((1, 2, 512))
        q[0, 0] = 3.0 * rows[7] + 0.3 * rng.standard_normal(512)
        q[0, 0, 100] = self.TIE
        q[0, 1] = ref.round_to_bf16(rng.standard_normal(512))
        self.q_float64 = q
        self.mine = ref.round_to_bf16(q)  # the tie goes to even: 12
        self.theirs = self.mine.copy()
        self.theirs[0, 0, 100] = 12.0625  # a server's float32 prologue landed above it
        self.sinks = np.array([2.0, 3.5])
        self.expected_out, self.expected_lse = ref.decode(self.mine, self.keys, self.sinks)
        self.deltas = ref.composition_deltas(ref.tie_slack(q), self.keys)

    def server(self, keys, sinks):
        """A correct server's answer from its own q_out, rounded as sent."""
        out, lse = ref.decode(self.theirs, keys, sinks)
        return ref.round_to_bf16(out).astype(np.float32), lse.astype(np.float32)

    def violations(self, answer, deltas):
        out, lse = answer
        return ref.decode_violations(out, lse, self.expected_out, self.expected_lse, self.keys,
                                     deltas)

    def test_tie_slack_counts_values_within_2_to_the_minus_20_of_a_midpoint(self):
        w = 2.0 ** -20
        values = np.array([self.TIE, self.TIE * (1 + w / 2), -self.TIE * (1 - w / 2),
                           self.TIE * (1 + 2 * w), 12.0, 2.0 - 2.0 ** -8, 0.0, np.nan, np.inf])
        np.testing.assert_array_equal(ref.tie_slack(values),
                                      [0.0625, 0.0625, 0.0625, 0, 0, 2.0 ** -6, 0, 0, 0])

    def test_a_tie_rounded_the_other_way_needs_the_composition_clause(self):
        answer = self.server(self.keys, self.sinks)
        self.assertGreater(abs(answer[1][0, 0] - self.expected_lse[0, 0]), 3e-3)
        self.assertNotEqual(self.violations(answer, None), [])
        self.assertGreater(self.deltas[0, 0], 3e-3)
        self.assertEqual(self.deltas[0, 1], 0.0)
        problems = self.violations(answer, self.deltas)
        self.assertEqual(problems, [], "\n".join(problems))

    def test_a_wrong_key_still_fails(self):
        for swapped in (7, 20):  # head 0's own key; one of head 1's broad softmax
            rows = self.keys[0].copy()
            rows[swapped] = rows[swapped + 1]
            self.assertNotEqual(self.violations(self.server([rows], self.sinks), self.deltas), [],
                                f"key {swapped}")

    def test_a_missing_sink_still_fails(self):
        problems = self.violations(self.server(self.keys, np.full(2, -np.inf)), self.deltas)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("out outside tolerance", problems[0])

    def test_lse_in_the_thousands_passes_by_the_relative_term(self):
        rng = np.random.default_rng(7)
        keys = [ref.round_to_bf16(8.0 * rng.standard_normal((4, 512)))]
        q = ref.round_to_bf16(2.0 * keys[0][2])[None, None, :]
        out, lse = ref.decode(q, keys, np.array([-np.inf]))
        self.assertGreater(lse[0, 0], 2000.0)
        sent = ref.round_to_bf16(out).astype(np.float32)
        for error, passes in ((4e-3, True), (-8e-3, False)):
            problems = ref.decode_violations(sent, (lse + error).astype(np.float32), out, lse,
                                             keys)
            self.assertEqual(problems == [], passes, f"{error}: {problems}")
