"""The bf16 helpers and the numpy <-> Tensor conversion (no server)."""

import unittest

import numpy as np

import dsv4_reference
import mla_offload as mo
from mla_offload.tensors import fill_tensor, to_array


def f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


class Bf16Test(unittest.TestCase):

    def test_rounds_to_nearest_even(self):
        values = f32([
            0x3F800000,  # 1.0: exact
            0x3F808000,  # 1 + 2^-8: the midpoint, even is down
            0x3F818000,  # 1 + 3*2^-8: the midpoint, even is up
            0x3F808001,  # just above the midpoint: up
            0x3F807FFF,  # just below: down
            0xBF808001,  # negative, just above the midpoint in magnitude
            0x7F7FFFFF,  # the largest float32 rounds to +inf
            0x00000001,  # the smallest subnormal rounds to +0
        ])
        np.testing.assert_array_equal(
            mo.float32_to_bf16(values),
            np.array([0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF81, 0x7F80, 0x0000], np.uint16))

    def test_special_values(self):
        bits = mo.float32_to_bf16(np.array([np.inf, -np.inf, -0.0, np.nan], np.float32))
        self.assertEqual(list(bits[:3]), [0x7F80, 0xFF80, 0x8000])
        self.assertTrue(np.isnan(mo.bf16_to_float32(bits[3:])).all())
        # A NaN whose payload sits in the low half only must not become inf.
        self.assertTrue(np.isnan(mo.bf16_to_float32(mo.float32_to_bf16(f32([0x7F800001])))).all())

    def test_round_trip_is_exact_for_bf16_values(self):
        every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        finite = every[np.isfinite(mo.bf16_to_float32(every))]
        np.testing.assert_array_equal(mo.float32_to_bf16(mo.bf16_to_float32(finite)), finite)

    def test_agrees_with_the_float64_reference_rounding(self):
        rng = np.random.default_rng(0)
        values = (rng.standard_normal(100000) * 10.0 ** rng.uniform(-6, 6, 100000)).astype(np.float32)
        values[:1000] = mo.bf16_to_float32(rng.integers(0, 0x7F00, 1000).astype(np.uint16)) * (
            1 + 2.0 ** -8)  # ties
        expected = dsv4_reference.round_to_bf16(values.astype(np.float64))
        np.testing.assert_array_equal(mo.round_to_bf16(values).astype(np.float64), expected)
        self.assertEqual(mo.round_to_bf16(values).dtype, np.float32)

    def test_shapes_are_kept(self):
        values = np.ones((2, 3, 4), np.float32)
        self.assertEqual(mo.float32_to_bf16(values).shape, (2, 3, 4))
        self.assertEqual(mo.bf16_to_float32(mo.float32_to_bf16(values)).shape, (2, 3, 4))
        with self.assertRaises(TypeError):
            mo.bf16_to_float32(values)


class TensorTest(unittest.TestCase):

    def test_round_trip_of_each_dtype(self):
        cases = [
            (mo.pb.DTYPE_BF16, np.arange(24, dtype=np.uint16).reshape(2, 3, 4)),
            (mo.pb.DTYPE_F32, np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)),
            (mo.pb.DTYPE_I32, np.array([[-1, 0, 7]], np.int64)),
        ]
        for dtype, array in cases:
            tensor = mo.pb.Tensor()
            fill_tensor(tensor, array, dtype, "t")
            self.assertEqual(tensor.dtype, dtype)
            self.assertEqual(list(tensor.shape), list(array.shape))
            self.assertEqual(len(tensor.data), array.size * 4 // (2 if dtype == mo.pb.DTYPE_BF16 else 1))
            np.testing.assert_array_equal(to_array(tensor, "t"), array)

    def test_bytes_are_little_endian_c_order(self):
        tensor = mo.pb.Tensor()
        fill_tensor(tensor, np.array([[1, 2], [3, 0x1234]], np.uint16).T, mo.pb.DTYPE_BF16, "t")
        self.assertEqual(tensor.data, bytes([1, 0, 3, 0, 2, 0, 0x34, 0x12]))

    def test_refusals(self):
        with self.assertRaisesRegex(TypeError, "q: expected bf16"):
            fill_tensor(mo.pb.Tensor(), np.zeros(4, np.float16), mo.pb.DTYPE_BF16, "q")
        with self.assertRaisesRegex(ValueError, "topk: values do not fit"):
            fill_tensor(mo.pb.Tensor(), np.array([1 << 40]), mo.pb.DTYPE_I32, "topk")
        short = mo.pb.Tensor(dtype=mo.pb.DTYPE_F32, shape=[2, 2], data=b"\0" * 12)
        with self.assertRaisesRegex(ValueError, r"out: shape \[2, 2\] needs 16 bytes, got 12"):
            to_array(short, "out")
