"""A unittest base class with one real server per test class, and test data."""

import unittest

import numpy as np

import mla_offload as mo
from server_process import ServerProcess

FLASH = "deepseek-v4-flash"
PRO = "deepseek-v4-pro"


def random_bf16(rng, shape, scale=1.0):
    """Normal bf16 values (as uint16 bits), none zero."""
    values = rng.standard_normal(shape) * scale
    values = np.where(np.abs(values) < 1e-3 * scale, 1e-3 * scale, values)
    return mo.float32_to_bf16(values.astype(np.float32))


def prompt_layers(rng, model, first_position, count):
    """LayerRows of every attention layer for positions first_position ..
    + count - 1: random SWA rows and the compressed rows that complete."""
    layers = []
    for layer, ratio in enumerate(model.compress_ratios):
        compressed = None
        first_row = 0
        if ratio:
            first_row = first_position // ratio
            rows = (first_position + count) // ratio - first_row
            compressed = random_bf16(rng, (rows, 512)) if rows else None
        layers.append(mo.LayerRows(layer, random_bf16(rng, (count, 512)), compressed, first_row))
    return layers


class ServerTestCase(unittest.TestCase):
    """Starts the server before the class's tests and stops it after."""

    server_flags = ()

    @classmethod
    def setUpClass(cls):
        cls.server = ServerProcess(cls.server_flags)
        cls.client = mo.connect(cls.server.target, timeout=30.0)
        cls.flash = cls.client.model(FLASH)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        status = cls.server.stop()
        if status != 0:
            raise AssertionError(f"the server exited with {status}:\n{cls.server.output()}")

    def assertError(self, raised, code, *fragments):
        """`raised` (an assertRaises context) holds an MlaOffloadError of `code`
        whose message contains every fragment."""
        error = raised.exception
        self.assertIsInstance(error, mo.MlaOffloadError)
        self.assertEqual(error.code, code, error.message)
        for fragment in fragments:
            self.assertIn(fragment, error.message)

    def listed(self, session):
        """The server's SessionInfo of `session`, or None."""
        for info in self.client.list_sessions():
            if info.session_id == session.session_id:
                return info
        return None
