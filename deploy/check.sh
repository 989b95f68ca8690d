#!/usr/bin/env bash
# The deployment's checks (deploy/README.md); tools/test.sh runs them with
# --junit after the tests, so CI does. `--help` says how.
set -uo pipefail
cd "$(dirname "$0")/.."

# The Kubernetes version whose schemas the manifests must satisfy: that of
# the kubectl on these machines (whose kustomize renders them).
kubernetes_version=1.32.0
overlays=(cpu gpu-h200)
all_checks=(render validate manifests pod_replay image)

usage() {
  cat <<EOF
Usage: deploy/check.sh [--junit=DIR] [CHECK...]
       deploy/check.sh --list

Runs the deployment's checks, each bounded in time, and prints a line per
check, then "deploy: PASS" or "deploy: FAIL". Needs the Bazel build
(bazel build //...), kubectl, and what tools/setup.sh installs (podman,
runc, mmdebstrap, .venv); where one is missing, the check that needs it
says so and fails.

  render      kubectl kustomize renders every overlay (${overlays[*]}) and
              deploy/tests/components (the cpu overlay with the optional
              components)
  validate    the rendered files against Kubernetes ${kubernetes_version}'s
              schemas, offline and strict (kubernetes-validate, .venv)
  manifests   the deployment's rules on the rendered files
              (deploy/tests/manifests_test.py)
  pod_replay  the cpu overlay's pod run here as the kubelet would: its
              command, args, env and ports, its probes, preStop and SIGTERM
              with an Attend stream in flight (deploy/tests/pod_replay_test.py)
  image       the runtime image built with podman and run
              (deploy/tests/image_test.sh)

  --junit=DIR  also write DIR/deploy_CHECK.xml, a JUnit test case per check
  --list       print the checks' names and stop

Exit status: 0 when every check passed, 1 when one failed, 2 for bad
arguments.
EOF
}

junit=""
run_one=""
checks=()
for arg in "$@"; do
  case "$arg" in
    --run=*) run_one="${arg#--run=}" ;;  # one check, in the work folder of the run that called
    -h|--help) usage; exit 0 ;;
    --list) printf '%s\n' "${all_checks[@]}"; exit 0 ;;
    --junit=*) junit="${arg#--junit=}" ;;
    -*) echo "deploy: unknown option $arg (see --help)" >&2; exit 2 ;;
    *)
      if [[ ! " ${all_checks[*]} " =~ " $arg " ]]; then
        echo "deploy: no check '$arg'; there are: ${all_checks[*]}" >&2
        exit 2
      fi
      checks+=("$arg")
      ;;
  esac
done
[ ${#checks[@]} -eq 0 ] && checks=("${all_checks[@]}")
[ -n "$junit" ] && mkdir -p "$junit"

if [ -n "$run_one" ]; then
  work="$DEPLOY_CHECK_WORK/$run_one"
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
rendered="${DEPLOY_CHECK_WORK:-$work}/rendered"
mkdir -p "$rendered"
targets=("${overlays[@]}" components)
source_dir() { [ "$1" = components ] && echo deploy/tests/components || echo "deploy/k8s/overlays/$1"; }

need_kubectl() {
  command -v kubectl >/dev/null && return 0
  echo "kubectl is not installed: the manifests cannot be rendered (kubectl 1.32 or later, with its kustomize)"
  return 1
}

check_render() {
  need_kubectl || return 1
  local status=0 target
  for target in "${targets[@]}"; do
    if ! kubectl kustomize "$(source_dir "$target")" >"$rendered/$target.yaml" 2>"$work/err"; then
      echo "kubectl kustomize $(source_dir "$target") failed:"; cat "$work/err"; status=1
    elif ! grep -q "^kind: StatefulSet" "$rendered/$target.yaml"; then
      echo "$(source_dir "$target") renders no StatefulSet"; status=1
    else
      echo "$(source_dir "$target"): $(grep -c '^kind:' "$rendered/$target.yaml") objects"
    fi
  done
  return $status
}

# validate and the checks after it read what render wrote; run alone, they
# render first.
rendered_or_render() {
  [ -s "$rendered/components.yaml" ] || check_render >/dev/null || { check_render; return 1; }
}

check_validate() {
  rendered_or_render || return 1
  if [ ! -x .venv/bin/kubernetes-validate ]; then
    echo "kubernetes-validate is not in .venv: run tools/setup.sh (it installs deploy/requirements.txt)"
    return 1
  fi
  local status=0 target
  for target in "${targets[@]}"; do
    # ServiceMonitor is the Prometheus Operator's kind, not Kubernetes': its
    # schema is not there, which kubernetes-validate warns of; every other
    # kind must be known and valid.
    .venv/bin/kubernetes-validate --kubernetes-version "$kubernetes_version" --strict \
      "$rendered/$target.yaml" >"$work/out" 2>&1 || status=1
    grep -vE "^WARN .*Couldn't find schema for kind ServiceMonitor with api version monitoring.coreos.com/" \
      "$work/out" | sed "s|$rendered/||"
    if grep -q "^WARN" "$work/out" && grep "^WARN" "$work/out" | grep -qv "kind ServiceMonitor"; then
      echo "$target: a kind without a schema"; status=1
    fi
    local passed
    passed=$(grep -c "^INFO .* passed for resource" "$work/out")
    [ "$passed" -gt 0 ] || { echo "$target: nothing validated"; status=1; }
  done
  return $status
}

check_manifests() {
  rendered_or_render || return 1
  local args=() target
  for target in "${targets[@]}"; do args+=("$target=$rendered/$target.yaml"); done
  /usr/bin/python3 deploy/tests/manifests_test.py --containerfile=deploy/image/Containerfile "${args[@]}"
}

check_pod_replay() {
  rendered_or_render || return 1
  local package="$work/python_client"
  if [ ! -f bazel-bin/client/python/mla_offload/_generated/mla_offload_pb2.py ]; then
    echo "the Python client's stubs are not built (bazel build //client/python:stubs)"
    return 1
  fi
  mkdir -p "$package"
  cp -r client/python/mla_offload "$package/"
  cp -r bazel-bin/client/python/mla_offload/_generated "$package/mla_offload/"
  PYTHONDONTWRITEBYTECODE=1 /usr/bin/python3 deploy/tests/pod_replay_test.py "$rendered/cpu.yaml" \
    --server=bazel-bin/server/mla_offload_server --python_client="$package"
}

check_image() {
  deploy/tests/image_test.sh
}

[ -n "$run_one" ] && { "check_$run_one"; exit; }

# write_junit CHECK SECONDS STATUS LOG
write_junit() {
  [ -n "$junit" ] || return 0
  local name="$1" time="$2" status="$3" log="$4"
  local failure=()
  [ "$status" -ne 0 ] && failure=(--failure="deploy/check.sh $name failed (exit $status)" --log="$log")
  python3 tools/junit_case.py --out="$junit/deploy_$name.xml" --suite=deploy --name="$name" \
    --seconds="$time" "${failure[@]}"
}

# Each check's bound: far above its usual time (the image's first base
# takes about 30 s, pod_replay about 10 s), well inside CI's.
declare -A limits=([render]=60 [validate]=120 [manifests]=60 [pod_replay]=120 [image]=600)
failed=0
for check in "${checks[@]}"; do
  log="$work/$check.log"
  started=$(date +%s%N)
  DEPLOY_CHECK_WORK="$work" timeout --kill-after=10 "${limits[$check]}" "$0" --run="$check" >"$log" 2>&1
  status=$?
  tenths=$((($(date +%s%N) - started) / 100000000))
  elapsed="$((tenths / 10)).$((tenths % 10))"
  [ "$status" -eq 124 ] && echo "timed out after ${limits[$check]} s" >>"$log"
  sed "s/^/  /" "$log"
  if [ "$status" -eq 0 ]; then
    echo "deploy: $check PASS (${elapsed} s)"
  else
    echo "deploy: $check FAIL (${elapsed} s)"
    failed=1
  fi
  write_junit "$check" "$elapsed" "$status" "$log"
done
if [ "$failed" -eq 0 ]; then echo "deploy: PASS"; else echo "deploy: FAIL"; fi
exit "$failed"
