#!/usr/bin/env bash
# Runs every test that needs no GPU (README.md's test command; CI runs it).
# Installs missing Debian packages first, builds everything (the CUDA code
# too, where nvcc is present), runs the tests, then the fuzzers for 30 s each
# (tools/fuzz.sh; each fuzzer counts as one case), then the deployment's
# checks (deploy/check.sh: manifests, pod replay, container image; each
# counts as one case), and ends with one line "N passed, N failed" counted
# from the test cases.
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
fuzz_results=$(mktemp -d)
deploy_results=$(mktemp -d)
trap 'rm -rf "$log" "$fuzz_results" "$deploy_results"' EXIT
bazel test --config=cpu_only //... 2>&1 | tee "$log" | grep -vE '^\([0-9:]+\) \[[0-9,]+ / [0-9,]+\]'
bazel_status=${PIPESTATUS[0]}

tools/fuzz.sh --junit="$fuzz_results"
fuzz_status=$?
extra_xmls=()
for fuzzer in $(tools/fuzz.sh --list); do extra_xmls+=("--xml=$fuzz_results/$fuzzer.xml"); done

deploy/check.sh --junit="$deploy_results"
deploy_status=$?
for check in $(deploy/check.sh --list); do extra_xmls+=("--xml=$deploy_results/deploy_$check.xml"); done

# shellcheck disable=SC2086
python3 tools/test_summary.py "$(bazel info bazel-testlogs 2>/dev/null)" "$log" \
  "${extra_xmls[@]}" $targets
summary_status=$?
if [ "$bazel_status" -ne 0 ] || [ "$fuzz_status" -ne 0 ] || [ "$deploy_status" -ne 0 ] ||
   [ "$summary_status" -ne 0 ]; then
  exit 1
fi
