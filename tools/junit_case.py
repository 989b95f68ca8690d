#!/usr/bin/env python3
"""Writes one JUnit test case, for checks that run outside Bazel.

Usage: junit_case.py --out=FILE --suite=NAME --name=NAME --seconds=S
                     [--failure=MESSAGE [--log=FILE] [--lines=N]]

With --failure the case failed: MESSAGE is the failure's message and the
last N lines of LOG (60 unless told) its text. tools/fuzz.sh and
deploy/check.sh write their cases with it, and tools/test_summary.py counts
them.
"""

import argparse
import pathlib
import sys
import xml.etree.ElementTree as ET


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--suite", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--seconds", required=True, type=float)
    parser.add_argument("--failure")
    parser.add_argument("--log", type=pathlib.Path)
    parser.add_argument("--lines", type=int, default=60)
    args = parser.parse_args(argv)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(suites, "testsuite", name=args.suite, tests="1",
                          failures="1" if args.failure is not None else "0")
    case = ET.SubElement(suite, "testcase", classname=args.suite, name=args.name,
                         time=f"{args.seconds:g}")
    if args.failure is not None:
        failure = ET.SubElement(case, "failure", message=args.failure)
        if args.log is not None and args.log.exists():
            lines = args.log.read_text(errors="replace").splitlines()
            failure.text = "\n".join(lines[-args.lines:])
    ET.ElementTree(suites).write(args.out, encoding="UTF-8", xml_declaration=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
