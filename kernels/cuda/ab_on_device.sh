#!/usr/bin/env bash
# Runs on the lent GPU machine (from .device/, which kernels/cuda/prepare_device.sh
# filled here): an A/B of cuda_bench binaries, METHOD.md's way. The
# binaries run alternately, --rounds times (default 2), on the same data and
# with the same flags (default: every decode shape, no prologue, 20 graph
# replays); each run's stdout goes to $OUT/ab_BINARY_ROUND.log and the table
# of kernels/bench/ab_table.py (times min-max over the rounds, change of the
# median against the first binary) to $OUT/ab.md and stdout.
#   ab_on_device.sh [--rounds N] [--flags "--heads=64,128 --b=128"] cuda_bench cuda_bench_new ...
# Stage a variant here with `kernels/cuda/prepare_device.sh --variant NAME`
# (its cuda_bench becomes .device/cuda_bench_NAME).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
rounds=2
flags="--prologue=0 --iters=20"
while [[ $# -gt 0 && $1 == --* ]]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --flags) flags=$2; shift 2 ;;
    *) echo "ab_on_device: unknown option $1 (--rounds N, --flags \"...\")" >&2; exit 2 ;;
  esac
done
if [[ $# -lt 2 ]]; then
  echo "ab_on_device: give two or more cuda_bench binaries of this folder, e.g. cuda_bench cuda_bench_new" >&2
  exit 2
fi
for binary in "$@"; do
  [[ -x ./$binary ]] || { echo "ab_on_device: no binary ./$binary here (stage it with prepare_device.sh --variant)" >&2; exit 2; }
done
pairs=()
for round in $(seq 1 "$rounds"); do
  for binary in "$@"; do
    log="$OUT/ab_${binary}_${round}.log"
    echo "== round $round/$rounds: $binary $flags" >&2
    # shellcheck disable=SC2086  # the flags are words
    timeout 300 "./$binary" $flags > "$log" 2>&1 || { echo "ab_on_device: $binary failed, see $log" >&2; exit 1; }
    pairs+=("$binary=$log")
  done
done
python3 ab_table.py "${pairs[@]}" | tee "$OUT/ab.md"
