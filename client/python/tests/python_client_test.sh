#!/usr/bin/env bash
# Bazel's entry to the Python client's tests: pytest under Debian's python3
# (the one that sees python3-numpy, python3-grpcio, python3-protobuf and
# python3-pytest) runs every test_*.py of this folder with the package and
# its generated stubs from the runfiles; its JUnit report goes where Bazel
# wants it ($XML_OUTPUT_FILE), for tools/test_summary.py. Arguments go to
# pytest (e.g. -k placement).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${root}/client/python"
export PYTHONDONTWRITEBYTECODE=1
args=(-p no:cacheprovider -v "${root}/client/python/tests")
[ -n "${XML_OUTPUT_FILE:-}" ] && args+=("--junitxml=${XML_OUTPUT_FILE}")
exec /usr/bin/python3 -m pytest "${args[@]}" "$@"
