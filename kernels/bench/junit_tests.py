"""Runs unittest cases as a Bazel test: one line per test on stdout and a
JUnit XML report, one <testcase> per test method, to $XML_OUTPUT_FILE when
Bazel sets it (tools/test_summary.py counts the cases). Shared by the
Python tests of this folder, with what they share besides: running a script
of the folder and a fresh folder of files for each test."""

import os
import subprocess
import tempfile
import unittest
import xml.etree.ElementTree as ET


def run_python(script, *args, env=None):
    """Runs a Python script under Debian's python3 (-B: no .pyc beside it);
    its CompletedProcess with stdout and stderr as text."""
    return subprocess.run(["/usr/bin/python3", "-B", script, *args], capture_output=True,
                          text=True, env=env)


class ScratchTest(unittest.TestCase):
    """A TestCase with a fresh folder, self.work, under Bazel's TEST_TMPDIR."""

    def setUp(self):
        self.work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

    def write(self, name, content):
        """Writes text or bytes to file `name` of self.work; its path."""
        path = os.path.join(self.work, name)
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(path, mode) as f:
            f.write(content)
        return path


def run(*case_classes):
    """Runs every test of the TestCase classes; 0 when all passed, else 1."""
    report = ET.Element("testsuites")
    failed = 0
    ran = 0
    for case_class in case_classes:
        name = case_class.__name__
        xml_suite = ET.SubElement(report, "testsuite", name=name)
        for test in unittest.defaultTestLoader.loadTestsFromTestCase(case_class):
            result = unittest.TestResult()
            test.run(result)
            ran += 1
            case = ET.SubElement(xml_suite, "testcase", classname=name,
                                 name=test._testMethodName)
            problems = result.failures + result.errors
            for _, trace in problems:
                ET.SubElement(case, "failure", message="failed").text = trace
            if result.skipped and not problems:
                case.set("result", "skipped")  # tools/test_summary.py does not count it as passed
            failed += bool(problems)
            state = "FAILED" if problems else "SKIPPED" if result.skipped else "    OK"
            print(f"[{state}] {name}.{test._testMethodName}")
            for _, trace in problems:
                print(trace)
    if os.environ.get("XML_OUTPUT_FILE"):
        ET.ElementTree(report).write(os.environ["XML_OUTPUT_FILE"], encoding="unicode")
    return 1 if failed or ran == 0 else 0
