#!/usr/bin/env bash
# Bazel's entry to the Python client's tests: Debian's python3 (the one that
# sees python3-numpy, python3-grpcio and python3-protobuf) runs run_tests.py
# with the package and its generated stubs from the runfiles.
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="${root}/client/python"
export PYTHONDONTWRITEBYTECODE=1
exec /usr/bin/python3 "${root}/client/python/tests/run_tests.py" "$@"
