#!/usr/bin/env bash
# The main job (README.md's first command): installs missing Debian packages,
# builds, starts mla_offload_server on the CPU backend on a free loopback
# port, drives it with mla_demo_client (sessions, prompts, a few decode steps
# over every layer), shows a few of its Prometheus metrics, and stops it with
# SIGTERM (a graceful drain). Extra arguments go to mla_demo_client (see
# `bazel-bin/client/mla_demo_client --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
server=bazel-bin/server/mla_offload_server
client=bazel-bin/client/mla_demo_client
[ -x "$server" ] && [ -x "$client" ] ||
  echo "demo: building the server and the demo client (the first build takes a few minutes)" >&2
if ! bazel build --noshow_progress //server:mla_offload_server //client:mla_demo_client \
    >/tmp/mla-demo-build.log 2>&1; then
  grep -E "ERROR|error:" /tmp/mla-demo-build.log >&2 || tail -20 /tmp/mla-demo-build.log >&2
  echo "demo: the build failed (full log: /tmp/mla-demo-build.log)" >&2
  exit 1
fi

log=$(mktemp)
"$server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --backend=cpu --kv_cache_gb=2 \
  --max_position=65536 --drain_seconds=5 >"$log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  grep -q "serving on" "$log" && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
head -1 "$log"
address=$(grep -o "serving on [0-9.]*:[0-9]*" "$log" | awk '{print $3}')
metrics_port=$(grep -o "metrics on port [0-9]*" "$log" | awk '{print $4}')

echo
"$client" --target="$address" "$@"

echo
echo "metrics (http://127.0.0.1:$metrics_port/metrics, a few lines):"
python3 - "$metrics_port" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith(("mla_requests_total", "mla_kv_blocks", "mla_sessions", "mla_attend_tokens_total",
                        "mla_attend_stage_seconds_count")):
        print("  " + line)
PY

echo
kill -TERM "$server_pid"
wait "$server_pid"
tail -n +2 "$log"
