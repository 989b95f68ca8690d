#!/usr/bin/python3
"""Tests of ab_table.py (the A/B table of alternating cuda_bench runs) and of
kernels/cuda/ab_on_device.sh, run here with stand-in binaries that print
cuda_bench's lines and write its results.json: the rounds and their order,
the min-max cells, the change of the median, shapes only one binary has, and
a clear error (exit 2) for bad input. JUnit report by pytest (bench_test_support.py)."""

import json
import os
import shutil
import stat
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_test_support  # pylint: disable=wrong-import-position

TABLE = os.path.join(HERE, "ab_table.py")
RUNNER = os.path.join(HERE, "..", "cuda", "ab_on_device.sh")

RUN = """ceiling: device-to-device copy 4236 GB/s (read + write)
decode V4-Flash H= 64 b=128 topk= 128+ 512:      {flash} us  265.15 TFLOP/s    1125 GB/s (27% of copy)
decode V4-Pro   H=128 b=128 topk= 128+1024:     {pro} us  361.58 TFLOP/s     752 GB/s (18% of copy)
prologue H= 64 b= 128 (+32 compressed rows):      {prologue} us    2606 GB/s
"""


def table(*args):
    return bench_test_support.run_python(TABLE, *args)


class AbTableTest(bench_test_support.ScratchTest):
    def log(self, name, flash, pro, prologue="6.5"):
        return self.write(name, RUN.format(flash=flash, pro=pro, prologue=prologue))

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

    def test_the_change_is_of_the_medians(self):
        runs = []
        for i, (old, new) in enumerate((("40.0", "41.0"), ("40.2", "41.2"), ("60.0", "41.1"))):
            runs += [f"old={self.log(f'a{i}', old, '100.0')}", f"new={self.log(f'b{i}', new, '100.0')}"]
        out = table(*runs).stdout
        # Medians 40.2 and 41.1 (the mean of old would be 46.7): +2.2%.
        self.assertIn("| 40.0-60.0 | 41.0-41.2 | +2.2% |", out)

    def test_reads_the_results_json_of_cuda_bench(self):
        def results(name, flash):
            path = os.path.join(self.work, name)
            with open(path, "w") as f:
                json.dump([{"model": "V4-Flash", "op": "decode", "H": 64, "b": 128,
                            "topk_main": 128, "topk_extra": 512, "time_us": flash},
                           {"model": "V4", "op": "prologue", "H": 64, "b": 128,
                            "topk_main": 0, "topk_extra": 0, "time_us": 5.66}], f)
            return path
        out = table(f"old={results('a.json', 40.41)}", f"new={results('b.json', 40.72)}").stdout
        self.assertIn("| decode V4-Flash H=64 b=128 topk=128+512 | 40.4 | 40.7 | +0.8% |", out)
        self.assertIn("| prologue H=64 b=128 | 5.7 | 5.7 | +0.0% |", out)

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
        bad_json = os.path.join(self.work, "bad.json")
        with open(bad_json, "w") as f:
            f.write('[{"op": "decode"}]')
        self.assertRefused(table(f"old={good}", f"new={bad_json}"), "a shape without")
        binary = os.path.join(self.work, "binary")
        with open(binary, "wb") as f:
            f.write(b"\xff\xfe\x00")
        self.assertRefused(table(f"old={good}", f"new={binary}"), "is not text")
        usage = table()
        self.assertEqual((usage.returncode, usage.stdout), (2, ""))
        self.assertIn("LABEL=FILE", usage.stderr)

    def device(self, binaries):
        """A .device-like folder with the runner, the table and stand-in
        binaries: name -> decode time (None: a binary that fails)."""
        device = os.path.join(self.work, "device")
        os.makedirs(device)
        shutil.copy(RUNNER, device)
        shutil.copy(TABLE, device)
        self.calls = os.path.join(self.work, "calls")
        for name, flash in binaries.items():
            script = os.path.join(device, name)
            with open(script, "w") as f:
                f.write("#!/bin/bash\n"
                        f"printf '%s|' {name} \"$@\" >> {self.calls}; echo >> {self.calls}\n")
                if flash is None:
                    f.write("echo 'no usable CUDA device'; exit 3\n")
                else:
                    f.write('for a in "$@"; do case $a in --out=*) out=${a#--out=} ;; esac; done\n'
                            f'echo \'[{{"model": "V4-Flash", "op": "decode", "H": 64, "b": 128, '
                            f'"topk_main": 128, "topk_extra": 512, "time_us": {flash}}}]\' > "$out"\n'
                            f"cat <<'END'\n{RUN.format(flash=flash, pro='106.0', prologue='6.0')}END\n")
            os.chmod(script, os.stat(script).st_mode | stat.S_IEXEC)
        return device

    def runner(self, device, *args):
        return subprocess.run(["bash", os.path.join(device, "ab_on_device.sh"), *args],
                              capture_output=True, text=True,
                              env={**os.environ, "OUT": os.path.join(self.work, "out")})

    def test_the_device_runner_alternates_the_binaries_and_writes_the_table(self):
        device = self.device({"bench_a": "40.5", "bench_b": "42.0"})
        result = self.runner(device, "--rounds", "3", "--flags", "--heads=64 --b=128",
                             "bench_a", "bench_b")
        self.assertEqual(result.returncode, 0, result.stderr)
        out_dir = os.path.join(self.work, "out")
        with open(self.calls) as f:
            calls = f.read().splitlines()
        # A B, B A, A B; the flags as two words, then where the JSON goes.
        self.assertEqual([c.split("|")[0] for c in calls],
                         ["bench_a", "bench_b", "bench_b", "bench_a", "bench_a", "bench_b"])
        self.assertEqual(calls[0], f"bench_a|--heads=64|--b=128|--out={out_dir}/ab_bench_a_1.json|")
        with open(os.path.join(out_dir, "ab.md")) as f:
            md = f.read()
        self.assertIn("(bench_a: 3, bench_b: 3)", md)
        self.assertIn("| decode V4-Flash H=64 b=128 topk=128+512 | 40.5 | 42.0 | +3.7% |", md)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "ab_bench_b_3.log")))

    def test_the_device_runner_runs_two_rounds_by_default(self):
        device = self.device({"bench_a": "40.5", "bench_b": "42.0"})
        self.assertEqual(self.runner(device, "bench_a", "bench_b").returncode, 0)
        with open(self.calls) as f:
            self.assertEqual(len(f.read().splitlines()), 4)

    def test_the_device_runner_stops_at_a_failed_run(self):
        device = self.device({"bench_a": "40.5", "bench_b": None})
        result = self.runner(device, "bench_a", "bench_b")
        self.assertEqual(result.returncode, 1)
        self.assertIn("bench_b failed with exit 3 (round 1)", result.stderr)
        self.assertIn("ab_bench_b_1.log", result.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.work, "out", "ab.md")))

    def test_the_device_runner_refuses_bad_arguments(self):
        device = self.device({"bench_a": "40.5", "bench_b": "42.0"})
        for args, phrase in (((), "give two or more"),
                             (("bench_a",), "give two or more"),
                             (("bench_a", "missing"), "no binary ./missing here"),
                             (("bench_a", "./bench_b"), "not the name of a binary"),
                             (("bench_a", "bench_a"), "named twice"),
                             (("--rounds",), "--rounds needs a value"),
                             (("--rounds", "0", "bench_a", "bench_b"), "a count of 1 or more"),
                             (("--rounds", "x", "bench_a", "bench_b"), "a count of 1 or more"),
                             (("--nope", "bench_a", "bench_b"), "unknown option --nope")):
            result = self.runner(device, *args)
            self.assertEqual(result.returncode, 2, args)
            self.assertIn(phrase, result.stderr, args)
        self.assertFalse(os.path.exists(self.calls))
        help_text = self.runner(device, "--help")
        self.assertEqual(help_text.returncode, 0)
        self.assertIn("--rounds N", help_text.stdout)


def main():
    return bench_test_support.run(__file__)


if __name__ == "__main__":
    sys.exit(main())
