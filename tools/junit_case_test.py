#!/usr/bin/python3
"""Tests of junit_case.py: a passed and a failed case, with characters XML
must escape and the tail of a long log, counted by test_summary.py as
tools/test.sh counts the fuzzers' and deploy checks' cases. Run by pytest
(kernels/bench/bench_test_support.py)."""

import os
import pathlib
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "kernels", "bench"))
import bench_test_support  # pylint: disable=wrong-import-position
import test_summary  # pylint: disable=wrong-import-position

SCRIPT = os.path.join(HERE, "junit_case.py")


class JunitCaseTest(bench_test_support.ScratchTest):

    def test_a_passed_case_counts_as_passed(self):
        out = os.path.join(self.work, "ok.xml")
        done = bench_test_support.run_python(SCRIPT, "--out=" + out, "--suite=deploy",
                                             "--name=render", "--seconds=0.5")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(test_summary.count_cases(pathlib.Path(out)), (1, 0))
        case = ET.parse(out).getroot().find("testsuite/testcase")
        self.assertEqual(case.get("name"), "render")
        self.assertEqual(case.get("time"), "0.5")
        self.assertIsNone(case.find("failure"))

    def test_a_failed_case_carries_its_message_and_the_logs_end(self):
        log = self.write("log", "".join(f"line {i} <&\">\n" for i in range(100)))
        out = os.path.join(self.work, "failed.xml")
        message = 'input crash-1 "x" <y> & z'
        done = bench_test_support.run_python(SCRIPT, "--out=" + out, "--suite=fuzz",
                                             "--name=attend_codec_fuzzer", "--seconds=30",
                                             "--failure=" + message, "--log=" + log,
                                             "--lines=3")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(test_summary.count_cases(pathlib.Path(out)), (0, 1))
        failure = ET.parse(out).getroot().find("testsuite/testcase/failure")
        self.assertEqual(failure.get("message"), message)
        self.assertEqual(failure.text, "line 97 <&\">\nline 98 <&\">\nline 99 <&\">")

    def test_a_missing_argument_is_refused(self):
        out = os.path.join(self.work, "none.xml")
        done = bench_test_support.run_python(SCRIPT, "--out=" + out, "--suite=fuzz")
        self.assertEqual(done.returncode, 2)
        self.assertIn("--name", done.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    sys.exit(bench_test_support.run(__file__))
