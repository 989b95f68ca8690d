#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang-14, ASan + UBSan) and runs
# each for a bounded time; tools/test.sh runs it with --junit. `--help` says
# how.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd -P)

usage() {
  cat <<'EOF'
Usage: tools/fuzz.sh [--seconds=N] [--work=DIR] [--junit=DIR] [FUZZER...]
       tools/fuzz.sh --list

Builds the fuzzers of tests/fuzz (tests/fuzz/README.md) with clang-14,
libFuzzer, ASan and UBSan (bazel --config=fuzz, in a Bazel output base of its
own, so the g++ build is left as it is), then runs each on a fresh corpus:
the seeds that tests/fuzz:make_seeds writes, plus the regression inputs in
tests/fuzz/testdata/FUZZER/. Prints a line per fuzzer and ends with
"fuzz: PASS" or "fuzz: FAIL".

  --seconds=N  how long each fuzzer runs (default 30); a long run is
               tools/fuzz.sh --seconds=3600
  --work=DIR   where the corpora, logs and crashing inputs go, kept
               (default: a new folder under ${TMPDIR:-/tmp}, removed when
               every fuzzer passed); a failing fuzzer leaves its input as
               DIR/FUZZER/crash-* (or leak-*, timeout-*, oom-*)
  --junit=DIR  also write DIR/FUZZER.xml, a JUnit test case per fuzzer
  --list       print the fuzzers' names and stop
  FUZZER       codec_fuzzer, engine_fuzzer (default: both)

A failing fuzzer's line names the command that replays its input.

Exit status: 0 when every fuzzer ran clean, 1 when one failed or the build
did, 2 for bad arguments.
EOF
}

all_fuzzers=(codec_fuzzer engine_fuzzer)
seconds=30
work=""
junit=""
fuzzers=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --list) printf '%s\n' "${all_fuzzers[@]}"; exit 0 ;;
    --seconds=*) seconds="${arg#--seconds=}" ;;
    --work=*) work="${arg#--work=}" ;;
    --junit=*) junit="${arg#--junit=}" ;;
    -*) echo "fuzz: unknown option $arg (see --help)" >&2; exit 2 ;;
    *)
      if [[ ! " ${all_fuzzers[*]} " =~ " $arg " ]]; then
        echo "fuzz: no fuzzer '$arg'; there are: ${all_fuzzers[*]}" >&2
        exit 2
      fi
      fuzzers+=("$arg")
      ;;
  esac
done
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: --seconds takes a whole number of seconds above 0, not '$seconds'" >&2
  exit 2
fi
[ ${#fuzzers[@]} -eq 0 ] && fuzzers=("${all_fuzzers[@]}")

# write_junit FUZZER SECONDS [FAILURE_MESSAGE LOG]: the failure's text is
# the end of LOG, where the sanitizer's report is.
write_junit() {
  [ -n "$junit" ] || return 0
  local name="$1" time="$2" message="${3:-}" log="${4:-}"
  local failure=()
  [ -n "$message" ] && failure=(--failure="$message" --log="$log" --lines=80)
  python3 tools/junit_case.py --out="$junit/$name.xml" --suite=fuzz --name="$name" \
    --seconds="$time" "${failure[@]}"
}

tools/setup.sh || exit 1
[ -n "$junit" ] && mkdir -p "$junit"

# The toolchain comes from CC when Bazel configures it, so the clang build
# needs an output base of its own; one per checkout, kept between runs.
output_base="${MLA_FUZZ_OUTPUT_BASE:-${XDG_CACHE_HOME:-$HOME/.cache}/mla-offload-fuzz/$(echo "$repo" | md5sum | cut -c1-32)}"
bazel_fuzz=(bazel "--output_base=$output_base" --max_idle_secs=900)
targets=(//tests/fuzz:make_seeds)
for fuzzer in "${fuzzers[@]}"; do targets+=("//tests/fuzz:$fuzzer"); done

echo "fuzz: building ${fuzzers[*]} with clang-14, ASan and UBSan (output base $output_base)"
build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
build_start=$SECONDS
if ! "${bazel_fuzz[@]}" build --config=fuzz "${targets[@]}" > "$build_log" 2>&1; then
  grep -E "ERROR|error:" "$build_log" | head -20
  for fuzzer in "${fuzzers[@]}"; do
    write_junit "$fuzzer" 0 "the fuzz build failed" "$build_log"
  done
  echo "fuzz: FAIL (the build failed; bazel --output_base=$output_base build --config=fuzz ${targets[*]})"
  exit 1
fi
bin=$("${bazel_fuzz[@]}" info --config=fuzz bazel-bin 2>/dev/null)
echo "fuzz: built in $((SECONDS - build_start)) s"

keep_work=1
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/mla-offload-fuzz.XXXXXX")
  keep_work=0
fi
mkdir -p "$work"
work=$(cd "$work" && pwd -P)
if ! "$bin/tests/fuzz/make_seeds" --out="$work/seeds" > /dev/null; then
  echo "fuzz: FAIL (make_seeds could not write $work/seeds)"
  exit 1
fi

# UBSan reports end the run (the fuzzers' defaults say so too); the
# suppressions are findings known and reported, each with its reason.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$repo/tests/fuzz/ubsan_known_findings.txt"

failed=()
for fuzzer in "${fuzzers[@]}"; do
  dir="$work/$fuzzer"
  mkdir -p "$dir/corpus"
  cp "$work/seeds/$fuzzer"/* "$dir/corpus/"
  if [ -d "tests/fuzz/testdata/$fuzzer" ]; then cp "tests/fuzz/testdata/$fuzzer"/* "$dir/corpus/"; fi
  seeds=$(find "$dir/corpus" -type f | wc -l)
  echo "fuzz: $fuzzer: running for $seconds s on $seeds seeds ..."
  start=$SECONDS
  (cd "$dir" && "$bin/tests/fuzz/$fuzzer" -max_total_time="$seconds" -timeout=60 \
      -rss_limit_mb=4096 -dict="$repo/tests/fuzz/wire.dict" -print_final_stats=1 \
      -artifact_prefix="$dir/" corpus > log 2>&1)
  status=$?
  took=$((SECONDS - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log")
  corpus=$(find "$dir/corpus" -type f | wc -l)
  input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$dir/log" | tail -1)
  if [ "$status" -eq 0 ] && [ -z "$input" ]; then
    echo "fuzz: $fuzzer: PASS, ${runs:-?} runs in $took s (${rate:-?}/s), corpus $seeds -> $corpus"
    write_junit "$fuzzer" "$took"
  else
    report=$(grep -m1 -E "runtime error|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|_fuzzer: " "$dir/log")
    echo "fuzz: $fuzzer: FAIL after ${runs:-?} runs in $took s: ${report:-exit status $status}"
    echo "fuzz: $fuzzer: input ${input:-none written}; log $dir/log"
    grep -E "^    #[0-9]+ |^SUMMARY" "$dir/log" | head -8 | cut -c1-200 | sed 's/^/    /'
    [ -n "$input" ] && echo "fuzz: $fuzzer: replay: $bin/tests/fuzz/$fuzzer $input"
    write_junit "$fuzzer" "$took" "${report:-exit status $status}; input ${input:-none}" "$dir/log"
    failed+=("$fuzzer")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAIL (${failed[*]}; inputs and logs in $work)"
  exit 1
fi
[ "$keep_work" -eq 1 ] || rm -rf "$work"
echo "fuzz: PASS (${fuzzers[*]}; $seconds s each)"
