#!/usr/bin/env bash
# Builds the runtime image of deploy/image/Containerfile on this machine and
# runs it, as an operator would: podman (with runc), a Debian 12 base made
# offline by mmdebstrap (cached in podman's store, keyed on its inputs), and
# the host's Bazel build output as the build context (--target prebuilt;
# the full in-image build is the slower path docs/operations.md describes).
#
# The container runs as the image's non-root user with a read-only root
# filesystem and no capabilities (what the Kubernetes manifests ask). From
# the host the test probes grpc.health.v1 for "" and the readiness name,
# checks the OCI labels against what the server reports, runs the demo
# client, then sends SIGTERM while a second demo client's Attend stream is
# in flight: the stream's steps must all be answered, readiness must turn
# NOT_SERVING while liveness stays SERVING, and the container must exit 0
# once the stream has ended, within --drain_seconds.
#
# Needs root, podman, runc and mmdebstrap (tools/setup.sh installs them) and
# a built //server:mla_offload_server, //client:mla, //client:mla_demo_client.
# Where something is missing it says what and fails. Every wait is bounded.
set -uo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "image_test: FAIL: $*" >&2; exit 1; }
step() { echo "image_test: $*"; }

server_bin=bazel-bin/server/mla_offload_server
mla=bazel-bin/client/mla
demo=bazel-bin/client/mla_demo_client
for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null ||
    fail "$tool is not installed (tools/setup.sh installs it): the image cannot be built or run here"
done
[ "$(id -u)" -eq 0 ] || fail "podman here runs as root; run this as root"
for binary in "$server_bin" "$mla" "$demo"; do
  [ -x "$binary" ] || fail "$binary is not built (bazel build //server:mla_offload_server //client:all)"
done

work=$(mktemp -d)
tag="localhost/mla-offload:image-test-$$"
name="mla-offload-image-test-$$"
cleanup() {
  podman rm -f -t 0 "$name" >/dev/null 2>&1
  podman rmi -f "$tag" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

# The two settings podman needs on these machines (shared/notes): no
# default rlimits (refused here) and runc (crun fails on hybrid cgroups).
# Set through CONTAINERS_CONF, so nothing in /etc changes.
cat >"$work/containers.conf" <<'EOF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$work/containers.conf"

# The base: Debian 12 minbase with the runtime libraries, so that the
# runtime stage installs nothing. Its tag is the hash of what makes it.
packages=$(grep -v '^#' deploy/image/runtime-packages.txt | paste -sd, -)
mmdebstrap_args=(--quiet --variant=minbase --include="$packages"
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' bookworm)
key=$(printf '%s\n' "${mmdebstrap_args[@]}" | sha256sum | cut -c1-16)
base="localhost/mla-offload-test-base:$key"
if podman image exists "$base"; then
  step "base $base (cached)"
else
  step "making base $base with mmdebstrap (Debian 12 minbase + deploy/image/runtime-packages.txt)"
  timeout 300 mmdebstrap "${mmdebstrap_args[@]}" "$work/base.tar" ||
    fail "mmdebstrap could not make the Debian 12 base (it needs Debian's package registry)"
  timeout 120 podman import -q "$work/base.tar" "$base" >/dev/null || fail "podman import of the base failed"
  rm -f "$work/base.tar"
fi

# Bases of other inputs are stale: only this one is kept.
for stale in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter reference="${base%%:*}"); do
  [ "$stale" = "$base" ] || podman rmi "$stale" >/dev/null 2>&1
done

# The build context: what the Containerfile's prebuilt target copies.
mkdir -p "$work/context/deploy/image"
cp "$server_bin" "$work/context/mla_offload_server"
cp deploy/image/runtime-packages.txt "$work/context/deploy/image/"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
step "podman build --target prebuilt (DEBIAN_IMAGE=$base)"
timeout 300 podman build -q --network host --layers=false -f deploy/image/Containerfile \
  --target prebuilt --build-arg DEBIAN_IMAGE="$base" \
  --build-arg REVISION="$revision" -t "$tag" "$work/context" >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "podman build failed"; }

label() { podman image inspect "$tag" --format "{{index .Config.Labels \"org.opencontainers.image.$1\"}}"; }
[ "$(label revision)" = "$revision" ] || fail "label revision is '$(label revision)', not $revision"
[ -n "$(label source)" ] || fail "no org.opencontainers.image.source label"
user=$(podman image inspect "$tag" --format '{{.Config.User}}')
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] ||
  fail "the image runs as '$user', not a non-root user"

# The Kubernetes manifests' preStop runs /bin/sleep in the image.
timeout 30 podman run --rm --network host --entrypoint /bin/sleep "$tag" 0 ||
  fail "the image has no /bin/sleep (the manifests' preStop)"

read -r port metrics_port < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
target="127.0.0.1:$port"
drain_seconds=30
step "podman run $tag on $target (read-only root, no capabilities)"
podman run -d --name "$name" --network host --read-only --cap-drop=ALL \
  --security-opt=no-new-privileges "$tag" --listen="$target" --metrics_listen="127.0.0.1:$metrics_port" \
  --kv_cache_gb=1 --drain_seconds="$drain_seconds" >/dev/null || fail "podman run failed"
for _ in $(seq 150); do
  podman logs "$name" 2>&1 | grep -q "serving on" && break
  [ "$(podman inspect "$name" --format '{{.State.Running}}')" = true ] ||
    { podman logs "$name" >&2; fail "the container exited before serving"; }
  sleep 0.2
done
podman logs "$name" 2>&1 | grep -q "serving on" || { podman logs "$name" >&2; fail "not serving after 30 s"; }

health() { timeout 10 "$mla" --target="$target" health --service="$1"; }
health "" >/dev/null || fail "health of \"\" is not SERVING: $(health "" 2>&1)"
health mla_offload.v1.MlaOffload >/dev/null ||
  fail "health of mla_offload.v1.MlaOffload is not SERVING: $(health mla_offload.v1.MlaOffload 2>&1)"
version=$(label version)
timeout 10 "$mla" --target="$target" info | grep -q "mla-offload $version " ||
  fail "the server does not report version $version (label org.opencontainers.image.version)"
step "SERVING (both names), version $version; demo client"
timeout 60 "$demo" --target="$target" --sessions=2 --prompt=128 --steps=2 >"$work/demo.log" 2>&1 ||
  { cat "$work/demo.log" >&2; fail "the demo client failed against the container"; }
python3 - "$metrics_port" <<'PY' || fail "/metrics does not count the demo's Attend messages"
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
assert any(line.startswith('mla_requests_total{method="Attend"') for line in body.splitlines()), body[:2000]
PY

# The drain: SIGTERM while a demo client's Attend stream runs (60 decode
# steps of 44 layers, a few seconds); the stream goes on through the drain.
drain_steps=60
"$demo" --target="$target" --sessions=1 --prompt=64 --steps="$drain_steps" >"$work/drain.log" 2>&1 &
demo_pid=$!
for _ in $(seq 100); do grep -q "^step 0 " "$work/drain.log" && break; sleep 0.1; done
grep -q "^step 0 " "$work/drain.log" ||
  { kill "$demo_pid"; cat "$work/drain.log" >&2; fail "the demo's stream did not start"; }
signalled=$(date +%s.%N)
podman kill --signal TERM "$name" >/dev/null || fail "podman kill --signal TERM failed"
readiness=SERVING
for _ in $(seq 50); do
  readiness=$(health mla_offload.v1.MlaOffload 2>/dev/null | awk '{print $NF}')
  [ "$readiness" = SERVING ] || break
  sleep 0.1
done
liveness=$(health "" 2>/dev/null | awk '{print $NF}')
timeout $((drain_seconds + 10)) podman wait "$name" >"$work/exit" 2>&1 || fail "podman wait failed"
exited=$(date +%s.%N)
wait "$demo_pid"
demo_status=$?
exit_code=$(tail -1 "$work/exit")
podman logs "$name" >"$work/server.log" 2>&1
answered=$(grep -c "^step " "$work/drain.log")
step "drain: readiness $readiness, liveness $liveness; $answered of $drain_steps steps answered; \
exit $exit_code $(python3 -c "print(f'{$exited - $signalled:.1f}')") s after SIGTERM"
[ "$readiness" = NOT_SERVING ] || fail "readiness says '$readiness' while draining, not NOT_SERVING"
[ "$liveness" = SERVING ] || fail "liveness says '$liveness' while draining, not SERVING"
[ "$demo_status" -eq 0 ] && [ "$answered" -eq "$drain_steps" ] ||
  { cat "$work/drain.log" >&2; fail "the stream open at SIGTERM was not served to its end (demo exit $demo_status)"; }
[ "$exit_code" = 0 ] || { cat "$work/server.log" >&2; fail "the container exited $exit_code after SIGTERM, not 0"; }
grep -q "draining" "$work/server.log" && grep -q "stopped" "$work/server.log" ||
  { cat "$work/server.log" >&2; fail "the server's log shows no drain and stop"; }
python3 -c "import sys; sys.exit(0 if $exited - $signalled < $drain_seconds else 1)" ||
  fail "the container took longer than --drain_seconds=$drain_seconds to exit"
step "PASS"
