#!/usr/bin/python3
"""Tests of ab_table.py (the A/B table of alternating cuda_bench runs) and of
kernels/cuda/ab_on_device.sh, run here with stand-in binaries that print
cuda_bench's lines: the rounds, the min-max cells, the change of the median,
shapes only one binary has, and a clear error (exit 2) for bad input. JUnit
report through junit_tests.py."""

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "ab_table.py")
RUNNER = os.path.join(HERE, "..", "cuda", "ab_on_device.sh")

RUN = """ceiling: device-to-device copy 4236 GB/s (read + write)
decode V4-Flash H= 64 b=128 topk= 128+ 512:      {flash} us  265.15 TFLOP/s    1125 GB/s (27% of copy)
decode V4-Pro   H=128 b=128 topk= 128+1024:     {pro} us  361.58 TFLOP/s     752 GB/s (18% of copy)
prologue H= 64 b= 128 (+32 compressed rows):      {prologue} us    2606 GB/s
"""


def table(*args):
    return subprocess.run(["/usr/bin/python3", "-B", TABLE, *args], capture_output=True,
                          text=True)


class AbTableTest(unittest.TestCase):
    def setUp(self):
        self.work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def log(self, name, flash, pro, prologue="6.5"):
        path = os.path.join(self.work, name)
        with open(path, "w") as f:
            f.write(RUN.format(flash=flash, pro=pro, prologue=prologue))
        return path

    def test_one_row_a_shape_with_the_rounds_and_the_change(self):
        result = table(f"old={self.log('a1', '40.5', '106.9')}",
                       f"new={self.log('b1', '42.3', '105.7', '5.9')}",
                       f"old={self.log('a2', '40.4', '106.6')}",
                       f"new={self.log('b2', '42.1', '106.0', '6.0')}")
        self.assertEqual(result.returncode, 0, result.stderr)
        out = result.stdout
        self.assertIn("(old: 2, new: 2)", out)
        self.assertIn("| shape | old | new | new vs old |", out)
        self.assertIn("| decode V4-Flash H= 64 b=128 topk= 128+ 512 | 40.4-40.5 | 42.1-42.3 | +4.3% |",
                      out)
        self.assertIn("| decode V4-Pro H=128 b=128 topk= 128+1024 | 106.6-106.9 | 105.7-106.0 | -0.8% |",
                      out)
        self.assertIn("| prologue H= 64 b= 128 (+32 compressed rows) | 6.5 | 5.9-6.0 | -8.5% |", out)

    def test_a_shape_one_binary_lacks_has_a_dash(self):
        only_flash = os.path.join(self.work, "c1")
        with open(only_flash, "w") as f:
            f.write(RUN.format(flash="41.0", pro="", prologue="").splitlines()[1] + "\n")
        out = table(f"old={self.log('a1', '40.5', '106.9')}", f"new={only_flash}").stdout
        self.assertIn("| decode V4-Flash H= 64 b=128 topk= 128+ 512 | 40.5 | 41.0 | +1.2% |", out)
        self.assertIn("| decode V4-Pro H=128 b=128 topk= 128+1024 | 106.9 | - | - |", out)

    def assertRefused(self, result, phrase):
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        self.assertIn(phrase, result.stderr)

    def test_refuses_bad_arguments_and_logs(self):
        good = self.log("a1", "40.5", "106.9")
        self.assertRefused(table(good), "is not LABEL=FILE")
        self.assertRefused(table(f"old={good}", f"old={good}"), "at least two labels")
        self.assertRefused(table(f"old={good}", f"new={os.path.join(self.work, 'none')}"),
                           "cannot read")
        empty = os.path.join(self.work, "empty")
        open(empty, "w").close()
        self.assertRefused(table(f"old={good}", f"new={empty}"), "no decode or prologue line")

    def test_the_device_runner_alternates_the_binaries_and_writes_the_table(self):
        device = os.path.join(self.work, "device")
        os.makedirs(device)
        shutil.copy(RUNNER, device)
        shutil.copy(TABLE, device)
        calls = os.path.join(self.work, "calls")
        for name, flash in (("bench_a", "40.5"), ("bench_b", "42.0")):
            script = os.path.join(device, name)
            with open(script, "w") as f:
                f.write("#!/bin/sh\n"
                        f"echo \"{name} $*\" >> {calls}\n"
                        f"cat <<'END'\n{RUN.format(flash=flash, pro='106.0', prologue='6.0')}END\n")
            os.chmod(script, os.stat(script).st_mode | stat.S_IEXEC)
        out_dir = os.path.join(self.work, "out")
        result = subprocess.run(
            ["bash", os.path.join(device, "ab_on_device.sh"), "--rounds", "3", "--flags",
             "--heads=64 --b=128", "bench_a", "bench_b"],
            capture_output=True, text=True, env={**os.environ, "OUT": out_dir})
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(calls) as f:
            self.assertEqual(f.read().splitlines(),
                             ["bench_a --heads=64 --b=128", "bench_b --heads=64 --b=128"] * 3)
        with open(os.path.join(out_dir, "ab.md")) as f:
            md = f.read()
        self.assertIn("(bench_a: 3, bench_b: 3)", md)
        self.assertIn("| 40.5 | 42.0 | +3.7% |", md)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "ab_bench_b_3.log")))

    def test_the_device_runner_refuses_a_missing_binary(self):
        device = os.path.join(self.work, "device")
        os.makedirs(device)
        shutil.copy(RUNNER, device)
        result = subprocess.run(["bash", os.path.join(device, "ab_on_device.sh"), "a", "b"],
                                capture_output=True, text=True,
                                env={**os.environ, "OUT": os.path.join(self.work, "out")})
        self.assertEqual(result.returncode, 2)
        self.assertIn("no binary ./a here", result.stderr)


def main():
    sys.path.insert(0, HERE)
    import junit_tests  # pylint: disable=import-outside-toplevel
    return junit_tests.run(AbTableTest)


if __name__ == "__main__":
    sys.exit(main())
