#!/usr/bin/python3
"""Runs the Python client's tests (test_*.py beside this file) with unittest.

Writes a JUnit-style XML report, one <testcase> per test method, to
$XML_OUTPUT_FILE when Bazel sets it (tools/test_summary.py counts the
cases), and exits non-zero when any test failed or erred.

Usage: run_tests.py [-k PATTERN ...]   (unittest's test name patterns)
"""

import argparse
import os
import pathlib
import sys
import time
import traceback
import unittest
from xml.etree import ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent


class JUnitResult(unittest.TextTestResult):
    """A TextTestResult that also records each test's outcome and time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cases = []  # (test, seconds, outcome, detail)
        self._started = None

    def startTest(self, test):
        self._started = time.monotonic()
        self._subtest_failures = []
        super().startTest(test)

    def stopTest(self, test):
        # A test whose subtests failed gets no addFailure of its own.
        if self._subtest_failures and not (self.cases and self.cases[-1][0] is test):
            self._record(test, "failure", "\n".join(self._subtest_failures))
        super().stopTest(test)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._subtest_failures.append(f"{subtest.id()}\n{self._exc_info_to_string(err, test)}")

    def _record(self, test, outcome, detail=""):
        elapsed = time.monotonic() - self._started if self._started else 0.0
        self.cases.append((test, elapsed, outcome, detail))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failure", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        # setUpClass/setUpModule errors arrive as _ErrorHolder, not a test.
        self._record(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failure", "unexpected success")


def case_names(test):
    test_id = test.id()
    if isinstance(test, unittest.TestCase):
        classname, _, name = test_id.rpartition(".")
        return classname, name
    return test_id, "setup"  # an _ErrorHolder of a class or module fixture


def write_junit(cases, path, total_seconds):
    failures = sum(1 for case in cases if case[2] == "failure")
    errors = sum(1 for case in cases if case[2] == "error")
    skipped = sum(1 for case in cases if case[2] == "skipped")
    suites = ET.Element("testsuites", tests=str(len(cases)), failures=str(failures),
                        errors=str(errors), time=f"{total_seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name="client/python", tests=str(len(cases)),
                          failures=str(failures), errors=str(errors), skipped=str(skipped),
                          time=f"{total_seconds:.3f}")
    for test, seconds, outcome, detail in cases:
        classname, name = case_names(test)
        case = ET.SubElement(suite, "testcase", classname=classname, name=name,
                             time=f"{seconds:.3f}")
        if outcome in ("failure", "error"):
            first_line = detail.strip().splitlines()[-1] if detail.strip() else outcome
            ET.SubElement(case, outcome, message=first_line[:500]).text = detail
        elif outcome == "skipped":
            case.set("status", "notrun")
            case.set("result", "skipped")
            ET.SubElement(case, "skipped", message=detail)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="patterns", action="append", default=None)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    loader = unittest.TestLoader()
    if args.patterns:
        loader.testNamePatterns = [p if "*" in p else f"*{p}*" for p in args.patterns]
    suite = loader.discover(str(HERE), pattern="test_*.py", top_level_dir=str(HERE))
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=JUnitResult)
    started = time.monotonic()
    try:
        result = runner.run(suite)
    except Exception:  # a crash of the runner itself must still read as failed
        traceback.print_exc()
        return 1
    xml_path = os.environ.get("XML_OUTPUT_FILE")
    if xml_path:
        write_junit(result.cases, xml_path, time.monotonic() - started)
    return 0 if result.wasSuccessful() and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
