"""A numpy float64 model of docs/spec/dsv4-attention.md sections 2-5 and 7, for tests.

Written from the spec alone (not from the server's code): RoPE tables from
the pinned float32 frequencies (section 2), the prologue's q RMSNorm + RoPE
and the KV row's RoPE + bf16 round trip + UE8M0 FP8 quantisation (sections
3 and 4, producing the dequantised key), the sparse MLA decode with
attention sink (section 5) and the decode tolerances (section 7, with its
composition clause for a q_out computed here rather than by the server), the
FP8 output's among them. Not part of the package.
"""

import numpy as np

HEAD_DIM = 512
NOPE_DIM = 448
RMS_NORM_EPS = 1e-6
SOFTMAX_SCALE = HEAD_DIM ** -0.5
E4M3_MAX = 448.0

# Section 2: DeepSeek's float32 frequencies f_i (i = 0..31) as bit patterns.
_YARN_FREQUENCY_BITS = [  # theta 160000 with YaRN: C4A and C128A layers
    0x3f800000, 0x3f300a3a, 0x3ef21c1f, 0x3ea67d01, 0x3e64f92e, 0x3e1d7475, 0x3dd88cb4, 0x3d94e963,
    0x3d4ccccd, 0x3d0cd4fb, 0x3cc1b019, 0x3c8530ce, 0x3c372dbf, 0x3bfbed88, 0x3bad3d5e, 0x3b6e4237,
    0x3b147ae1, 0x3ab714e0, 0x3a5ebdb6, 0x3a0530ce, 0x399bb3af, 0x39305978, 0x38be904d, 0x383e9b5f,
    0x37a3d70c, 0x36b443d0, 0x3677eba6, 0x362a7be8, 0x35ea77ff, 0x35a13bdc, 0x355dbf30, 0x35187c4d,
]
_PLAIN_FREQUENCY_BITS = [  # theta 10000, no YaRN: SWA-only layers
    0x3f800000, 0x3f3ff911, 0x3f0ff59a, 0x3ed7e89b, 0x3ea1e89b, 0x3e72d423, 0x3e361887, 0x3e088d77,
    0x3dcccccd, 0x3d99940d, 0x3d6655c2, 0x3d2cba15, 0x3d0186e3, 0x3cc2434f, 0x3c91ad39, 0x3c5a7bf2,
    0x3c23d70a, 0x3bf5b9b0, 0x3bb8449c, 0x3b8a2e77, 0x3b4f3e38, 0x3b1b690d, 0x3ae91528, 0x3aaec98e,
    0x3a83126f, 0x3a44948c, 0x3a136a16, 0x39dd1725, 0x39a5cb60, 0x3978a815, 0x393a7753, 0x390bd472,
]


def frequencies(compress_ratio):
    """The pinned float32 f_i of a layer: plain for SWA-only layers (ratio 0), YaRN else."""
    bits = _PLAIN_FREQUENCY_BITS if compress_ratio == 0 else _YARN_FREQUENCY_BITS
    return np.array(bits, dtype=np.uint32).view(np.float32)


def yarn_frequencies_float64(theta=160000.0):
    """Section 2's YaRN formula in float64 (the source of the pinned values)."""
    i = np.arange(32, dtype=np.float64)
    base = theta ** (-2.0 * i / 64.0)
    d = lambda r: 64.0 * np.log(65536.0 / (2.0 * np.pi * r)) / (2.0 * np.log(theta))
    low = min(max(np.floor(d(32.0)), 0.0), 63.0)
    high = min(max(np.ceil(d(1.0)), 0.0), 63.0)
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    return base / 16.0 * ramp + base * (1.0 - ramp)


def rope_cos_sin(positions, compress_ratio):
    """cos, sin [len(positions), 32] float32: angle float32(float32(p) * f_i),
    cos and sin in float64 rounded to float32 (section 2)."""
    p = np.asarray(positions, dtype=np.float32).reshape(-1, 1)
    angle = (p * frequencies(compress_ratio)[None, :]).astype(np.float32)
    angle = angle.astype(np.float64)
    return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rotate(x, cos, sin, inverse=False):
    """GPT-J pairs (448+2i, 449+2i) of the last axis rotated by the angle
    (or its negative), in float64. x [..., 512]; cos, sin broadcast to [..., 32]."""
    x = np.array(x, dtype=np.float64)
    c = np.asarray(cos, dtype=np.float64)
    s = np.asarray(sin, dtype=np.float64)
    if inverse:
        s = -s
    a = x[..., NOPE_DIM::2].copy()
    b = x[..., NOPE_DIM + 1::2].copy()
    x[..., NOPE_DIM::2] = a * c - b * s
    x[..., NOPE_DIM + 1::2] = a * s + b * c
    return x


def bf16_to_float64(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_to_bf16(values):
    """float64 -> the nearest bf16 (ties to even) as float64, rounded once
    (not through float32, which could round twice)."""
    values = np.asarray(values, dtype=np.float64)
    single = values.astype(np.float32)
    bits = np.atleast_1d(single).view(np.uint32)
    low = bits & np.uint32(0xFFFF)
    up = (low > 0x8000) | ((low == 0x8000) & ((bits & np.uint32(0x10000)) != 0))
    # float32 rounding can land exactly on a bf16 midpoint: decide by the
    # float64 value which side it was on.
    exact = np.atleast_1d(single.astype(np.float64) == values)
    away = np.atleast_1d(np.abs(values) > np.abs(single.astype(np.float64)))
    up = np.where((low == 0x8000) & ~exact, away, up)
    result = (bits & np.uint32(0xFFFF0000)) + np.where(up, np.uint32(0x10000), np.uint32(0))
    return result.astype(np.uint32).view(np.float32).astype(np.float64).reshape(values.shape)


def prologue_q_float64(q_bits, positions, compress_ratio):
    """Section 4, Q, before the final rounding: q [T, H, 512] bf16 bits ->
    the normalised and rotated q [T, H, 512] in float64."""
    x = bf16_to_float64(q_bits)
    x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMS_NORM_EPS)
    cos, sin = rope_cos_sin(positions, compress_ratio)
    return rotate(x, cos[:, None, :], sin[:, None, :])


def prologue_q(q_bits, positions, compress_ratio):
    """Section 4, Q: q [T, H, 512] bf16 bits -> q_out [T, H, 512] (bf16 values, float64)."""
    return round_to_bf16(prologue_q_float64(q_bits, positions, compress_ratio))


def e4m3_round(values):
    """float64 values in [-448, 448] -> the nearest e4m3fn value, ties to even."""
    magnitude = np.abs(values)
    _, exponent = np.frexp(magnitude)  # magnitude = m * 2^exponent, m in [0.5, 1)
    step = np.where(magnitude < 2.0 ** -6, 2.0 ** -9, np.ldexp(1.0, exponent - 1 - 3))
    return np.copysign(np.round(magnitude / step) * step, values)


def cache_row(kv_bits, position, compress_ratio):
    """Section 4, KV + section 3: one row [512] bf16 bits inserted at `position`
    -> the dequantised key as the cache holds it (float64 [512])."""
    cos, sin = rope_cos_sin([position], compress_ratio)
    y = round_to_bf16(rotate(bf16_to_float64(kv_bits), cos[0], sin[0]))
    key = y.copy()
    for tile in range(NOPE_DIM // 64):
        values = y[64 * tile:64 * tile + 64]
        amax = np.float32(max(np.max(np.abs(values)), 1e-4))
        ratio = np.float32(amax / np.float32(E4M3_MAX))
        mantissa, exponent = np.frexp(np.float64(ratio))
        e = exponent - 1 if mantissa == 0.5 else exponent  # smallest e with 2^e >= ratio
        scaled = np.clip(values * 2.0 ** -e, -E4M3_MAX, E4M3_MAX)
        scale = 2.0 ** (min(max(e + 127, 0), 255) - 127)
        key[64 * tile:64 * tile + 64] = e4m3_round(scaled) * scale
    return key


def decode(q_out, keys, sinks, positions=None, compress_ratio=0, derotate=False):
    """Section 5 for T tokens. q_out [T, H, 512]; keys: per token a [J, 512]
    array (V = K; J may be 0); sinks [H] float (-inf: none).
    Returns out [T, H, 512] float64 (before the server's bf16 rounding) and
    lse [T, H] (+inf where J is empty)."""
    tokens, heads, _ = q_out.shape
    out = np.zeros((tokens, heads, HEAD_DIM))
    lse = np.full((tokens, heads), np.inf)
    sinks = np.asarray(sinks, dtype=np.float64)
    for t in range(tokens):
        if len(keys[t]) == 0:
            continue
        z = SOFTMAX_SCALE * (q_out[t] @ keys[t].T)  # [H, J]
        peak = np.max(z, axis=1, keepdims=True)
        lse[t] = peak[:, 0] + np.log(np.sum(np.exp(z - peak), axis=1))
        o = np.exp(z - lse[t][:, None]) @ keys[t]
        out[t] = o / (1.0 + np.exp(sinks - lse[t]))[:, None]
    if derotate:
        cos, sin = rope_cos_sin(positions, compress_ratio)
        out = rotate(out, cos[:, None, :], sin[:, None, :], inverse=True)
    return out, lse


def tie_slack(q_float64):
    """Section 7, composition, when only this side's q_out is known: for each
    element whose float64 value lies within 2^-20 of its magnitude of a bf16
    rounding midpoint, the ulp of the larger of the two bf16 values beside it
    (a server's float32 prologue may round to either); 0 elsewhere."""
    magnitude = np.abs(np.asarray(q_float64, dtype=np.float64))
    # No tie for NaN, infinities and values from 2^127 up (a neighbour may be infinite).
    magnitude = np.where(magnitude < 2.0 ** 127, magnitude, 0.0)
    nearest = round_to_bf16(magnitude)
    bits = (nearest.astype(np.float32).view(np.uint32) >> 16).astype(np.int64)
    beside = np.where(magnitude > nearest, bits + 1, np.maximum(bits - 1, 0))
    midpoint = (nearest + bf16_to_float64(beside)) / 2.0
    larger = np.maximum(bits, beside)
    ulp = bf16_to_float64(larger + 1) - bf16_to_float64(larger)
    tied = (np.abs(magnitude - midpoint) <= 2.0 ** -20 * magnitude) & (magnitude > 0)
    return np.where(tied, ulp, 0.0)


def composition_deltas(slack, keys):
    """delta_t [T, H] of section 7's composition clause: softmax scale times
    the largest, over token t's keys j, sum over e of slack[t, h, e] * |K_j,e|
    (0 where a token has no keys). slack [T, H, 512]; keys as for decode."""
    deltas = np.zeros(slack.shape[:2])
    for t in range(slack.shape[0]):
        if len(keys[t]):
            deltas[t] = SOFTMAX_SCALE * np.max(slack[t] @ np.abs(keys[t]).T, axis=1)
    return deltas


def decode_violations(out, lse, ref_out, ref_lse, keys, deltas=None):
    """Section 7: a list of what is outside tolerance (empty: all within).
    out [T, H, 512] float32 (the server's bf16 output); lse [T, H] or None.
    `deltas` [T, H] (composition_deltas) widens lse by delta and out by
    2 * delta * A_t, for a reference whose q_out is not the server's own
    (None: the plain clause)."""
    if deltas is None:
        deltas = np.zeros(ref_lse.shape)
    problems = []
    for t in range(ref_out.shape[0]):
        a_t = float(np.max(np.abs(keys[t]))) if len(keys[t]) else 0.0
        bound = (2e-3 * max(1.0, a_t) + 1e-2 * np.abs(ref_out[t])
                 + 2.0 * deltas[t][:, None] * a_t)
        error = np.abs(out[t].astype(np.float64) - ref_out[t])
        bad = ~(error <= bound)  # NaN never passes
        if bad.any():
            h, d = np.argwhere(bad)[0]
            problems.append(f"token {t}: out outside tolerance in {int(bad.sum())} elements, "
                            f"e.g. head {h} dim {d}: {out[t, h, d]} vs {ref_out[t, h, d]:.6g}")
        if lse is not None:
            empty = np.isinf(ref_lse[t])
            if not np.array_equal(np.isposinf(lse[t]), empty):
                problems.append(f"token {t}: lse +inf at {np.isposinf(lse[t])}, expected {empty}")
            finite = ~empty
            lse_error = np.abs(lse[t][finite].astype(np.float64) - ref_lse[t][finite])
            lse_bound = 1e-3 + 2e-6 * np.abs(ref_lse[t][finite]) + deltas[t][finite]
            if not np.all(lse_error <= lse_bound):
                problems.append(f"token {t}: lse off by up to {np.nanmax(lse_error):.3g} "
                                f"(or NaN): {lse[t]} vs {ref_lse[t]}")
    return problems


def e4m3_value(codes):
    """Section 3's e4m3fn: the float64 value of each code (0x7f, 0xff: NaN)."""
    codes = np.asarray(codes, dtype=np.int64)
    exponent = (codes >> 3) & 0xF
    mantissa = codes & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9,
                         (8 + mantissa) * 2.0 ** (exponent - 10.0))
    magnitude = np.where((codes & 0x7F) == 0x7F, np.nan, magnitude)
    return np.where(codes & 0x80, -magnitude, magnitude)


def scale_exponent(amax):
    """The smallest e with 2^e >= max(amax, 1e-4) / 448, exactly."""
    mantissa, exponent = np.frexp(max(float(amax), 1e-4) / E4M3_MAX)
    return int(exponent - 1 if mantissa == 0.5 else exponent)


def fp8_violations(e4m3, scales, ref_out, keys, deltas=None):
    """Section 7's FP8 rule: a list of what is outside it (empty: all within).
    e4m3 uint8 [T, H, 512] and scales uint8 [T, H, 4] (the server's FP8
    output), ref_out [T, H, 512] (decode), keys and deltas as for
    decode_violations. Each element: |deq - ref| <= 1.0625 * B + 2^-4 |ref| +
    2^-10 s, with B the decode out allowance and s its block's scale; each
    scale byte between the exponents of the block's reference amax minus and
    plus its largest B; an empty key set exactly 0x00 codes and scale 105."""
    tokens, heads, _ = ref_out.shape
    if deltas is None:
        deltas = np.zeros((tokens, heads))
    problems = []
    for t in range(tokens):
        if len(keys[t]) == 0:
            if np.any(e4m3[t] != 0) or np.any(scales[t] != scale_exponent(0) + 127):
                problems.append(f"token {t}: no keys, but codes or scales are not 0x00 and 105")
            continue
        a_t = float(np.max(np.abs(keys[t])))
        allowance = (2e-3 * max(1.0, a_t) + 1e-2 * np.abs(ref_out[t])
                     + 2.0 * deltas[t][:, None] * a_t)  # [H, 512]
        for h in range(heads):
            for k in range(4):
                block = slice(128 * k, 128 * k + 128)
                amax = float(np.max(np.abs(ref_out[t, h, block])))
                widest = float(np.max(allowance[h, block]))
                e = int(scales[t, h, k]) - 127
                lowest, highest = scale_exponent(max(amax - widest, 0.0)), scale_exponent(amax + widest)
                if not lowest <= e <= highest:
                    problems.append(f"token {t} head {h} block {k}: scale 2^{e} where "
                                    f"2^{lowest}..2^{highest} fit amax {amax:.6g}")
                s = 2.0 ** e
                deq = e4m3_value(e4m3[t, h, block]) * s
                ref = ref_out[t, h, block]
                bound = 1.0625 * allowance[h, block] + 2.0 ** -4 * np.abs(ref) + 2.0 ** -10 * s
                bad = ~(np.abs(deq - ref) <= bound)  # NaN never passes
                if bad.any():
                    d = int(np.argwhere(bad)[0][0]) + 128 * k
                    problems.append(f"token {t} head {h}: {int(bad.sum())} elements of block {k} "
                                    f"outside the FP8 rule, e.g. dim {d}: "
                                    f"{e4m3_value(e4m3[t, h, d]) * s} vs {ref_out[t, h, d]:.6g}")
    return problems
