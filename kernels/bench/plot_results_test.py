#!/usr/bin/python3
"""Tests of plot_results.py: the chart of the checked-in results.json, and a
clear error (exit 2, nothing written) for each kind of bad input. Run by pytest
(bench_test_support.py), whose JUnit report tools/test_summary.py counts."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_test_support  # pylint: disable=wrong-import-position

SCRIPT = os.path.join(HERE, "plot_results.py")
RESULTS = os.path.join(HERE, "results.json")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(*args, env=None):
    return bench_test_support.run_python(SCRIPT, *args, env=env)


class PlotResultsTest(bench_test_support.ScratchTest):
    def write_results(self, content):
        return self.write("results.json",
                          content if isinstance(content, str) else json.dumps(content))

    def test_draws_every_shape_of_the_checked_in_results(self):
        out = os.path.join(self.work, "chart.png")
        result = run("--results", RESULTS, "--b", "128", "--out", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(RESULTS) as f:
            shapes = sum(1 for r in json.load(f) if r["op"] == "decode" and r["b"] == 128)
        self.assertGreater(shapes, 0)
        self.assertIn(f"({shapes} shapes at b = 128)", result.stdout)
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), PNG_SIGNATURE)

    def test_targets_are_the_open_issues(self):
        sys.path.insert(0, HERE)
        import plot_results  # pylint: disable=import-outside-toplevel
        shape = {"op": "decode", "copy_gbps_ceiling": 4000.0, "gather_gbps_ceiling": 3000.0}
        rows = [dict(shape, model="V4-Flash", H=16, b=128, time_us=30.0, gbps=1600.0),
                dict(shape, model="V4-Pro", H=128, b=128, time_us=100.0, gbps=800.0),
                dict(shape, model="V4-Pro", H=64, b=128, time_us=60.0, gbps=1400.0)]
        # After the label: measured, the gather floor, the target, FlashMLA.
        cells = [line.split(" ")[1:] for line in plot_results.table(rows, 128)]
        self.assertEqual(cells[0][:3], ["30.00", "16.00", "18.82"])  # the floor / 0.85
        self.assertEqual(cells[1][:3], ["100.00", "26.67", "90.00"])
        self.assertEqual(cells[2][2], "NaN")  # no target at V4-Pro H = 64
        pro_512 = dict(rows[1], b=512)
        self.assertEqual(plot_results.table([pro_512], 512)[0].split(" ")[3], "360.00")

    def test_writes_beside_the_results_by_default(self):
        with open(RESULTS) as f:
            path = self.write_results(f.read())
        result = run("--results", path, "--b", "64")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.work, "results_b64.png")))

    def assertRefused(self, result, *phrases):
        self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
        for phrase in phrases:
            self.assertIn(phrase, result.stderr)
        self.assertEqual([f for f in os.listdir(self.work) if f.endswith(".png")], [])

    def test_refuses_a_batch_size_the_results_lack(self):
        self.assertRefused(run("--results", RESULTS, "--b", "7",
                               "--out", os.path.join(self.work, "x.png")),
                           "no decode shape at b = 7", "it has b = 1, 2, 4, 8, 16, 64, 128, 512")

    def test_refuses_a_file_that_is_not_json(self):
        path = self.write_results("{ not json")
        self.assertRefused(run("--results", path), "is not JSON",
                           "give the results.json that cuda_bench --out wrote")

    def test_refuses_json_that_is_not_a_list_of_shapes(self):
        path = self.write_results({"model": "V4-Flash"})
        self.assertRefused(run("--results", path), "holds no list of shapes")

    def test_refuses_a_shape_without_its_figures(self):
        path = self.write_results([{"model": "V4-Flash", "op": "decode", "H": 8, "b": 128,
                                    "time_us": 30.0}])
        self.assertRefused(run("--results", path), "V4-Flash H=8 b=128 lacks",
                           "gbps, copy_gbps_ceiling, gather_gbps_ceiling")

    def test_refuses_a_missing_file(self):
        self.assertRefused(run("--results", os.path.join(self.work, "none.json")),
                           "cannot read", "No such file")

    def test_says_how_to_install_gnuplot_when_it_is_missing(self):
        env = dict(os.environ, PATH=self.work)
        self.assertRefused(run("--results", RESULTS, "--out",
                               os.path.join(self.work, "x.png"), env=env),
                           "gnuplot is not installed", "apt-get install gnuplot-nox")


def main():
    return bench_test_support.run(__file__)


if __name__ == "__main__":
    sys.exit(main())
