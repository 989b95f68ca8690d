#!/usr/bin/env bash
# Runs on the lent GPU machine (from .device/, which kernels/cuda/prepare_device.sh
# filled here): an A/B of cuda_bench binaries. The binaries run alternately
# (A B, then B A, ...: a drift over the call cancels), --rounds times
# (default 2), on the same data (cuda_bench's fixed seeds) and with the same
# flags (default: every decode shape, no prologue, 20 graph replays). Each
# run writes $OUT/ab_BINARY_ROUND.json (cuda_bench --out) and .log (its
# stdout); the table of kernels/bench/ab_table.py (times min-max over the
# rounds, change of the median against the first binary) goes to $OUT/ab.md
# and stdout. A call may run for at most 600 s: keep rounds x binaries x
# one run's time below that; ab_table.py rebuilds the table from the JSON
# files of several calls.
#   ab_on_device.sh [--rounds N] [--flags "--heads=64,128 --b=128"] cuda_bench cuda_bench_new ...
# Stage a variant here with `kernels/cuda/prepare_device.sh --variant NAME`
# (its cuda_bench becomes .device/cuda_bench_NAME).
set -uo pipefail
self=$(readlink -f "$0")
usage() {
  sed -n '2,16p' "$self" | sed 's/^# \{0,1\}//'
}
cd "$(dirname "$self")" || exit 2
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
rounds=2
flags="--prologue=0 --iters=20"
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --rounds|--flags)
      if [[ $# -lt 2 ]]; then echo "ab_on_device: $1 needs a value" >&2; exit 2; fi
      if [[ $1 == --rounds ]]; then rounds=$2; else flags=$2; fi
      shift 2 ;;
    *) echo "ab_on_device: unknown option $1 (--rounds N, --flags \"...\", --help)" >&2; exit 2 ;;
  esac
done
if [[ ! $rounds =~ ^[1-9][0-9]*$ ]]; then
  echo "ab_on_device: --rounds takes a count of 1 or more, not '$rounds'" >&2
  exit 2
fi
if [[ $# -lt 2 ]]; then
  echo "ab_on_device: give two or more cuda_bench binaries of this folder, e.g. cuda_bench cuda_bench_new" >&2
  exit 2
fi
declare -A seen=()
for binary in "$@"; do
  if [[ ! $binary =~ ^[A-Za-z0-9_.-]+$ ]]; then
    echo "ab_on_device: '$binary' is not the name of a binary in this folder (no paths)" >&2
    exit 2
  fi
  if [[ -n ${seen[$binary]:-} ]]; then
    echo "ab_on_device: $binary is named twice; for the spread of one binary, copy it under a second name" >&2
    exit 2
  fi
  seen[$binary]=1
done
for binary in "$@"; do
  [[ -x ./$binary ]] || { echo "ab_on_device: no binary ./$binary here (stage it with prepare_device.sh --variant)" >&2; exit 2; }
done
pairs=()
for round in $(seq 1 "$rounds"); do
  order=("$@")
  if (( round % 2 == 0 )); then
    order=()
    for (( i = $#; i >= 1; i-- )); do order+=("${!i}"); done
  fi
  for binary in "${order[@]}"; do
    base="$OUT/ab_${binary}_${round}"
    echo "== round $round/$rounds: $binary $flags" >&2
    # shellcheck disable=SC2086  # the flags are words
    timeout 300 "./$binary" $flags --out="$base.json" > "$base.log" 2>&1
    status=$?
    if [[ $status -eq 124 ]]; then
      echo "ab_on_device: $binary ran past 300 s (round $round), see $base.log" >&2
      exit 1
    elif [[ $status -ne 0 ]]; then
      echo "ab_on_device: $binary failed with exit $status (round $round), see $base.log" >&2
      exit 1
    fi
    pairs+=("$binary=$base.json")
  done
done
python3 ab_table.py "${pairs[@]}" | tee "$OUT/ab.md"
