#!/usr/bin/python3
"""cuda_bench's flags, checked without a GPU: --help explains them, and every
bad flag is refused (exit 2, a message naming it, the usage) before the
benchmark touches the GPU. JUnit report by pytest (bench_test_support.py)."""

import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
# The binary is in the test's runfiles (pytest imports this file from the
# source tree, where there is none).
BENCH = os.path.join(
    os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], "kernels", "bench")
    if os.environ.get("TEST_SRCDIR") else HERE, "cuda_bench")


# Every multiple of 8 from 8 to 128, as the usage lists them.
EIGHTS = ",".join(str(h) for h in range(8, 129, 8))


def bench(*args):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=60)


class CudaBenchFlagsTest(unittest.TestCase):
    def test_help_lists_every_flag(self):
        result = bench("--help")
        self.assertEqual(result.returncode, 0, result.stderr)
        for flag in ("--out=FILE", "--iters=N", "--commit=REV", "--b=LIST", "--heads=LIST",
                     "--prologue=0|1", "--decode=0|1", "RESULTS.md"):
            self.assertIn(flag, result.stdout)

    def test_refuses_bad_flags_before_the_gpu(self):
        for args, message in ((["--head=64"], "unknown flag '--head=64'"),
                              (["--heads=20"], f"--heads takes values of {EIGHTS}, not '20'"),
                              (["--heads=136"], f"--heads takes values of {EIGHTS}, not '136'"),
                              (["--heads=64,"], f"--heads takes values of {EIGHTS}, not ''"),
                              (["--b=96"], "--b takes values of 1,2,4,8,16,64,128,512, not '96'"),
                              (["--iters=0"], "--iters takes a count of 1 to 100000, not '0'"),
                              (["--iters=ten"], "--iters takes a count of 1 to 100000, not 'ten'"),
                              (["--prologue=2"], "--prologue takes 0 or 1, not '2'"),
                              (["--decode=no"], "--decode takes 0 or 1, not 'no'"),
                              (["--out="], "--out takes a file name"),
                              (["--b=128", "--nope"], "unknown flag '--nope'")):
            result = bench(*args)
            self.assertEqual(result.returncode, 2, (args, result.stdout, result.stderr))
            self.assertIn(f"cuda_bench: {message}", result.stderr)
            self.assertIn("--heads=LIST", result.stderr)  # the usage follows
            self.assertEqual(result.stdout, "")


def main():
    sys.path.insert(0, HERE)
    import bench_test_support  # pylint: disable=import-outside-toplevel
    return bench_test_support.run(__file__)


if __name__ == "__main__":
    sys.exit(main())
