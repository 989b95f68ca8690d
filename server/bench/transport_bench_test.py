#!/usr/bin/python3
"""Tests of transport_bench: a short run of the Echo and Attend rows with
both data planes writes a JSON row for each (data_plane named, server timing
on the Attend rows, messages answered), and a data plane it does not have is
refused with exit 2. Run by pytest (kernels/bench/bench_test_support.py)."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "kernels", "bench"))
import bench_test_support  # pylint: disable=wrong-import-position

BENCH = os.path.join(os.environ.get("TEST_SRCDIR", ""), os.environ.get("TEST_WORKSPACE", ""),
                     "server", "bench", "transport_bench")


def run(*args):
    return subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=120)


class TransportBenchTest(bench_test_support.ScratchTest):

    def test_attend_rows_run_with_each_data_plane(self):
        out = os.path.join(self.work, "rows.json")
        done = run("--rows=echo,attend", "--streams=1", "--in_flight=1,2", "--echo_in_flight=1",
                   "--seconds=0.3", "--warmup_seconds=0.05", "--tokens=8", "--heads=8",
                   "--data_plane=inline,shm", "--json_out=" + out)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("Attend (shm)", done.stdout)
        with open(out) as f:
            rows = json.load(f)["rows"]
        attend = [(r["data_plane"], r["in_flight"]) for r in rows if r["name"].startswith("Attend")]
        self.assertEqual(sorted(attend), [("inline", 1), ("inline", 2), ("shm", 1), ("shm", 2)])
        for row in rows:
            self.assertGreater(row["messages"], 0, row["name"])
            if row["name"].startswith("Attend"):
                self.assertGreater(row["server_timing_us"]["total"], 0, row["name"])
                self.assertEqual(row["request_payload_bytes"], 8 * 9 * 1024, row["name"])
        # The server's timing is printed for the shm rows too.
        self.assertRegex(done.stdout, r"Attend \(shm\)\s+1\s+1\s+0\.0\s+\d+")

    def test_a_data_plane_it_lacks_is_refused(self):
        for plane, words in (("cuda_ipc", "--data_plane=cuda_ipc needs --backend=cuda"),
                             ("rdma", "is not inline, shm or cuda_ipc"),
                             (",", "give inline, shm, cuda_ipc or a list")):
            done = run("--data_plane=" + plane)
            self.assertEqual(done.returncode, 2, plane)
            self.assertIn(words, done.stderr, plane)


if __name__ == "__main__":
    sys.exit(bench_test_support.run(__file__))
