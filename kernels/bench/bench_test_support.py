"""What the Python tests of this folder share: running one as a Bazel test
under pytest (its JUnit report where Bazel wants it), running a script of
the folder, and a fresh folder of files for each test."""

import os
import subprocess
import sys
import tempfile
import unittest


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


def run(test_file):
    """Runs the tests of `test_file` (its TestCase classes) under pytest:
    a line per test, and pytest's JUnit report to $XML_OUTPUT_FILE when
    Bazel sets it (tools/test_summary.py counts the cases). 0 when all
    passed."""
    import pytest  # pylint: disable=import-outside-toplevel

    # Bazel runs the file under the test's name, without ".py", which pytest
    # does not collect: the source file it stands for. No .pyc beside it.
    sys.dont_write_bytecode = True
    args = [os.path.realpath(test_file), "-p", "no:cacheprovider", "-v"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args.append("--junitxml=" + os.environ["XML_OUTPUT_FILE"])
    return int(pytest.main(args))
