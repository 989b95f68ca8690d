#!/usr/bin/env bash
# Runs every test that needs no GPU (README.md's test command; CI runs it).
# Installs missing Debian packages first, builds everything (the CUDA code
# too, where nvcc is present), runs the tests, and ends with one line
# "N passed, N failed" counted from the GoogleTest cases.
set -uo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh || exit 1

targets=$(bazel query --noshow_progress 'tests(//...) except attr(tags, "gpu", tests(//...))' 2>/dev/null)
if [ -z "$targets" ]; then
  echo "test: no test targets found" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test --config=cpu_only //... 2>&1 | tee "$log" | grep -vE '^\([0-9:]+\) \[[0-9,]+ / [0-9,]+\]'
bazel_status=${PIPESTATUS[0]}

# shellcheck disable=SC2086
python3 tools/test_summary.py "$(bazel info bazel-testlogs 2>/dev/null)" "$log" $targets
summary_status=$?
if [ "$bazel_status" -ne 0 ] || [ "$summary_status" -ne 0 ]; then exit 1; fi
