"""mla_offload.dequantize_fp8 (no server): every e4m3fn code's value against
the float64 model's (dsv4_reference.py), the scales, and its refusals."""

import unittest

import numpy as np

import dsv4_reference
import mla_offload as mo


class DequantizeFp8Test(unittest.TestCase):

    def test_every_code_is_the_models_value(self):
        codes = np.arange(256, dtype=np.uint8).reshape(1, 512 // 2)
        codes = np.concatenate([codes, codes], axis=1)  # [1, 512]
        values = mo.dequantize_fp8(codes, np.full((1, 4), 127, np.uint8))
        self.assertEqual(values.dtype, np.float32)
        expected = dsv4_reference.e4m3_value(codes)
        np.testing.assert_array_equal(np.isnan(values), np.isnan(expected))
        finite = ~np.isnan(expected)
        np.testing.assert_array_equal(values[finite], expected[finite])
        # A few by hand: 1, 448, the smallest subnormal 2^-9, -0, NaN.
        for code, value in ((0x38, 1.0), (0x7E, 448.0), (0x01, 2.0 ** -9), (0xFE, -448.0)):
            self.assertEqual(values[0, code], value, hex(code))
        self.assertTrue(np.signbit(values[0, 0x80]) and values[0, 0x80] == 0)
        self.assertTrue(np.isnan(values[0, 0x7F]) and np.isnan(values[0, 0xFF]))

    def test_each_block_of_128_takes_its_own_scale(self):
        codes = np.full((2, 3, 512), 0x38, np.uint8)  # 1.0 everywhere
        scales = np.array([[[127, 128, 105, 0]] * 3, [[255, 126, 120, 140]] * 3], np.uint8)
        values = mo.dequantize_fp8(codes, scales)
        for t in range(2):
            for k in range(4):
                expected = 2.0 ** (int(scales[t, 0, k]) - 127)
                if expected > np.finfo(np.float32).max:
                    expected = np.inf
                np.testing.assert_array_equal(values[t, :, 128 * k:128 * k + 128], expected)
        self.assertEqual(values[1, 0, 0], np.inf)  # 2^128 does not fit float32

    def test_refuses_other_types_and_shapes(self):
        with self.assertRaises(TypeError):
            mo.dequantize_fp8(np.zeros((1, 512), np.uint16), np.zeros((1, 4), np.uint8))
        with self.assertRaises(ValueError):
            mo.dequantize_fp8(np.zeros((1, 256), np.uint8), np.zeros((1, 2), np.uint8))
        with self.assertRaises(ValueError):
            mo.dequantize_fp8(np.zeros((2, 512), np.uint8), np.zeros((1, 4), np.uint8))


if __name__ == "__main__":
    unittest.main()
