#!/usr/bin/env bash
# Runs on the lent GPU machine (from the repository root, after
# kernels/cuda/prepare_device.sh filled .device/ here): the CUDA backend's
# tests, compute-sanitizer memcheck and racecheck on a smaller case set, then
# the benchmark. Logs go to $OUT as logs_STEPS.tar.gz, results*.json beside.
#   run_on_device.sh [test|padded|mma|simt|sanitize|tool|bench|e2e|transport|service|all]...   (default: all)
# test also checks that no kernel uses local memory (cuobjdump, when the
# machine has it). test, sanitize, tool, bench and e2e use the decode kernels MLA_CUDA_DECODE
# selects (unset: the default, warpgroup MMA); padded, mma and simt run the
# decode cases with those kernels (MLA_CUDA_DECODE=padded, =mma, =simt).
# For the sanitizers or the benchmark with other kernels, set
# MLA_CUDA_DECODE for the whole call.
# BENCH_ARGS adds flags to the benchmark (e.g. --b=1,2,4 --prologue=0).
# e2e: the server's end-to-end tests with --backend=cuda; transport: the
# transport benchmark with the CUDA backend (TRANSPORT_ARGS adds flags);
# service: the service path of server/bench/README.md (the load test on
# V4-Pro TP8 against a CUDA server: 64 and 128 tokens a layer step, one
# stream, 1 and 2 in flight, and 8 streams x 16 sessions x 4 in flight; the
# 2-in-flight shapes also with each stream over 2 connections, and 64 and
# 128 tokens also with the tensors in shared memory (--data_plane=shm)
# (SERVICE_SHAPES="SESSIONS:STREAMS:IN_FLIGHT:CONNECTIONS[:PLANE] ..." picks
# others; one stream with one step in flight runs --verify unless
# SERVICE_VERIFY=0, which times it without the checks' client work);
# then host_copy_bench's pinned copy floor of those steps), for every server
# binary named mla_offload_server* here (a second build, e.g.
# mla_offload_server_base, is measured in the same run), reports and step
# CSVs in service.tar.gz. Not part of all.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
# cuBLAS for the benchmark's matmul ceiling (dlopen), wherever the image has it.
cublas=$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null ||
         find / -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$cublas" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$cublas")"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
steps=${*:-all}
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

# compute-sanitizer --tool $1 on the test cases $2, logged to $OUT/$3.log
# (the environment, MLA_CUDA_DECODE included, passes through).
sanitize() {
  echo "== compute-sanitizer --tool $1 ${MLA_CUDA_DECODE:+(MLA_CUDA_DECODE=$MLA_CUDA_DECODE)}"
  timeout 170 "$sanitizer" --tool "$1" --error-exitcode 9 ./cuda_backend_test --gtest_filter="$2" \
    > "$OUT/$3.log" 2>&1
  local rc=$?
  echo "exit $rc"
  grep -E '^\[==========\]|^\[  PASSED|^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race' "$OUT/$3.log" | sort | uniq -c | head -20
  [ $rc -eq 0 ] || status=1
}

# Cases small enough for the sanitizers (they slow kernels 10-100x); h8_n133
# runs the narrow kernel's two producer groups with the ring (NarrowUsesRing).
SMALL='*h8_n24*:*h8_n133*:*h16_n12*:*h32_n5*:*h64_n3*:*h128_n2*:*_n1_*:*outoffset*:*LayerStep*:*Reject*:*Prologue*h4_n64*:*Prologue*h16_n17*:*Prologue*h128_n1'

if [[ $steps == *all* || $steps == *test* ]]; then
  # No kernel may use local memory. ptxas's -v report (ptxas_report_test)
  # does not count spills in code after setmaxnreg: a producer warpgroup
  # given too few registers spilled its loads there, unreported, and the
  # kernel lost 31% (RESULTS.md). The SASS shows them.
  cuobjdump=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null)
  if [ -n "$cuobjdump" ]; then
    echo "== local memory in the kernels' SASS (cuobjdump)"
    # awk exits 1 when a kernel has local loads or stores, 2 when the dump
    # has no function at all (cuobjdump failed: the check cannot pass then).
    if ! "$cuobjdump" -sass ./cuda_backend_test > "$OUT/sass.txt" 2>&1; then
      echo "FAILED: cuobjdump -sass ./cuda_backend_test (see sass.txt.gz)"
      status=1
    elif awk '/Function :/ {name = $3; functions++}
              /[[:space:]](STL|LDL)(\.[A-Z0-9_]+)*[[:space:]]/ {count[name]++}
              END {if (!functions) exit 2; for (f in count) {print count[f], f; bad = 1}; exit bad}' \
           "$OUT/sass.txt" > "$OUT/local_memory.txt"; then
      echo "none"
    else
      echo "FAILED: no kernel functions in the dump, or kernels with local loads or stores (count, function):"
      head -20 "$OUT/local_memory.txt"
      status=1
    fi
    gzip -f "$OUT/sass.txt"
  else
    echo "== local memory check skipped: no cuobjdump on this machine"
  fi
  echo "== cuda_backend_test"
  timeout 240 ./cuda_backend_test 2>&1 | tee "$OUT/test.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|FAILED|Failure|error' | head -80
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
# The decode cases with the other decode kernels (bounded: a kernel that
# deadlocks must not take the call's whole time).
for kernels in padded mma simt; do
  if [[ $steps == *all* || $steps == *$kernels* ]]; then
    echo "== cuda_backend_test, decode cases, MLA_CUDA_DECODE=$kernels"
    MLA_CUDA_DECODE=$kernels timeout 120 ./cuda_backend_test --gtest_filter='*Decode*:*LayerStep*' 2>&1 |
      tee "$OUT/test_$kernels.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|FAILED|Failure' | head -40
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  fi
done
if [[ $steps == *all* || $steps == *sanitize* ]]; then
  for tool in memcheck racecheck; do sanitize "$tool" "$SMALL" "sanitizer_$tool"; done
fi
if [[ $steps == *all* || $steps == *tool* ]]; then
  echo "== mla_kernel_tool demo --backend=cuda (checked against the float64 reference)"
  for model in deepseek-v4-flash deepseek-v4-pro; do
    ./mla_kernel_tool demo --backend=cuda --model=$model --tp=4 --batch=8 2>&1 | tee -a "$OUT/tool.log" | tail -8
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if [[ $steps == *all* || $steps == *bench* ]]; then
  echo "== cuda_bench"
  # shellcheck disable=SC2086
  timeout 240 ./cuda_bench --out="$OUT/results.json" --iters=30 --commit="$(cat commit.txt 2>/dev/null || echo unknown)" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $steps == *all* || $steps == *e2e* ]]; then
  echo "== server_e2e_test, server --backend=cuda"
  MLA_OFFLOAD_BACKEND=cuda MLA_OFFLOAD_SERVER="$PWD/mla_offload_server" \
    MLA_OFFLOAD_REGION_HOLDER="$PWD/region_holder" timeout 240 ./server_e2e_test 2>&1 |
    tee "$OUT/e2e.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|FAILED|Failure' | head -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $steps == *all* || $steps == *transport* ]]; then
  echo "== transport_bench --backend=cuda ${TRANSPORT_ARGS:-}"
  ./transport_bench --backend=cuda --json_out="$OUT/transport.json" ${TRANSPORT_ARGS:-} 2>&1 |
    tee "$OUT/transport.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if [[ $steps == *service* ]]; then
  mkdir -p "$OUT/service"
  for server in mla_offload_server*; do
    name=${server#mla_offload_server}
    name=${name#_}
    name=${name:-this}
    echo "== service path: $server (V4-Pro TP8, CUDA)"
    ./"$server" --backend=cuda --listen=127.0.0.1:50051 --metrics_port=-1 --kv_cache_gb=30 \
      > "$OUT/service/server_$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/50051) 2> /dev/null && break; sleep 0.2; done
    # sessions x 1 token = tokens a layer step; streams; in flight; connections
    # a stream; the data plane (inline unless given)
    for shape in ${SERVICE_SHAPES:-64:1:1:1 128:1:1:1 64:1:2:1 64:1:2:2 16:8:4:1 16:8:4:2 64:1:1:1:shm 128:1:1:1:shm 64:1:1:1:cuda_ipc 128:1:1:1:cuda_ipc 16:8:4:1:cuda_ipc}; do
      IFS=: read -r sessions streams inflight connections plane <<< "$shape"
      plane=${plane:-inline}
      run="${name}_s${sessions}_n${streams}_c${inflight}$([ "$connections" = 1 ] || echo "_x$connections")$([ "$plane" = inline ] || echo "_$plane")"
      timeout 120 ./mla_offload_loadtest --target=127.0.0.1:50051 --model=deepseek-v4-pro --tp=8 \
        --streams="$streams" --sessions="$sessions" --prompt=1024 --concurrency="$inflight" \
        --connections_per_stream="$connections" --data_plane="$plane" \
        --warmup_s=2 --duration_s=6 --baseline --progress=false \
        $([ "$streams" = 1 ] && [ "$inflight" = 1 ] && [ "${SERVICE_VERIFY:-1}" = 1 ] && echo --verify) \
        --json_out="$OUT/service/$run.json" --csv_out="$OUT/service/$run.csv" \
        > "$OUT/service/$run.txt" 2>&1
      rc=$?
      echo "-- $run (exit $rc)"
      grep -E 'layer steps/s|p50|server|stage|verify|Echo|echo' "$OUT/service/$run.txt" | head -24
      [ $rc -eq 0 ] || status=1
    done
    kill -TERM $pid; wait $pid
  done
  echo "== host_copy_bench (pinned copies of a V4-Pro TP8 step: C4A at 64 and 128 tokens)"
  ./host_copy_bench --backend=cuda --sizes=1417216:1052672,2834432:2105344 2>&1 |
    tee "$OUT/service/host_copy.txt"
  (cd "$OUT" && tar czf service.tar.gz service && rm -rf service)
fi
# At most 8 files come back from a device run: the logs travel as one archive.
(cd "$OUT" && ls ./*.log > /dev/null 2>&1 && tar czf "logs_${steps// /_}.tar.gz" ./*.log && rm -f ./*.log)
exit $status
