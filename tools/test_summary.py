#!/usr/bin/env python3
"""Counts GoogleTest cases from Bazel's test.xml files and prints one line.

Usage: test_summary.py BAZEL_TESTLOGS_DIR BAZEL_OUTPUT_LOG [--xml=FILE]... LABEL...

For every test target label, reads its test.xml (every shard's, if sharded)
and counts test cases that passed and failed. A target whose XML is missing,
or holds no failure although Bazel's output marks it failed (a crash at exit,
a timeout, a build failure), counts as one failed case, so nothing that broke
can read as green. Each --xml=FILE is a JUnit file written outside Bazel (the
fuzzers' run, tools/fuzz.sh --junit), counted the same way: missing or
unreadable, it is one failed case. The last line printed is
"N passed, N failed"; the exit status is 1 when anything failed.
"""

import pathlib
import re
import sys
import xml.etree.ElementTree as ET


def target_dir(testlogs, label):
    package, _, name = label.lstrip("/").partition(":")
    return testlogs / package / name


def count_cases(xml_path):
    passed = failed = 0
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif (case.get("status", "run") == "run" and case.get("result", "completed") != "skipped"
              and case.find("skipped") is None):  # pytest's skipped cases
            passed += 1
    return passed, failed


def labels_bazel_failed(output_log):
    """Labels that Bazel's test summary lists as anything but PASSED."""
    pattern = re.compile(r"^(//\S+)\s+(FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|FLAKY|INCOMPLETE)\b")
    failed = set()
    for line in pathlib.Path(output_log).read_text(errors="replace").splitlines():
        match = pattern.match(line.strip())
        if match:
            failed.add(match.group(1))
    return failed


def count_files(xmls):
    """Passed and failed cases of these files; unreadable ones fail once."""
    passed = failed = 0
    for xml in xmls:
        try:
            p, f = count_cases(xml)
        except (ET.ParseError, OSError):
            p, f = 0, 1
        passed += p
        failed += f
    return passed, failed


def main(argv):
    testlogs = pathlib.Path(argv[1])
    bazel_failed = labels_bazel_failed(argv[2])
    extra = [pathlib.Path(arg[len("--xml="):]) for arg in argv[3:] if arg.startswith("--xml=")]
    labels = [arg for arg in argv[3:] if not arg.startswith("--xml=")]
    total_passed = total_failed = 0
    broken = []
    for label in labels:
        directory = target_dir(testlogs, label)
        # This run's results: test.xml, or one per shard. Leftover
        # run_N_of_M folders of an earlier --runs_per_test are not this run.
        top = directory / "test.xml"
        xmls = [top] if top.exists() else sorted(directory.glob("shard_*_of_*/test.xml"))
        passed, failed = count_files(xmls)
        if failed == 0 and (not xmls or label in bazel_failed):
            failed = 1
        if failed:
            broken.append(label)
        total_passed += passed
        total_failed += failed
    for xml in extra:
        passed, failed = count_files([xml])
        if passed + failed == 0:
            failed = 1
        if failed:
            broken.append(str(xml))
        total_passed += passed
        total_failed += failed
    for label in broken:
        print(f"failed: {label}")
    print(f"{total_passed} passed, {total_failed} failed")
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
