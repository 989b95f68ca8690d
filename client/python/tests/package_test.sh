#!/usr/bin/env bash
# The package builds and installs the standard way, in fresh venvs with
# packages from PyPI only (nothing of Debian's python3 packages):
#   python -m build  -> an sdist (carrying the proto) and a wheel (with stubs
#                       made by grpcio-tools);
#   pip install WHEEL, and pip install ./client/python: the installed package
#                       imports, computes the C++ client's placement weight and
#                       asks the real server (the test's runfiles) for its info.
# Needs PyPI (build, setuptools, grpcio-tools, grpcio, protobuf, numpy).
set -euo pipefail
root="${TEST_SRCDIR}/${TEST_WORKSPACE}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
tree="$tmp/tree"
mkdir -p "$tree/client" "$tree/proto"
cp -rL "$root/client/python" "$tree/client/"
cp -L "$root/proto/mla_offload.proto" "$tree/proto/"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
fail() { echo "package_test: $*" >&2; exit 1; }

echo "== python -m build (fresh venv)"
python3 -m venv "$tmp/build"
"$tmp/build/bin/pip" install -q build || fail "pip could not install 'build' from PyPI"
"$tmp/build/bin/python" -m build --outdir "$tmp/dist" "$tree/client/python" > "$tmp/build.log" 2>&1 ||
  { tail -30 "$tmp/build.log"; fail "python -m build failed"; }
sdist=$(ls "$tmp"/dist/mla_offload-0.1.0.tar.gz) || fail "no sdist"
wheel=$(ls "$tmp"/dist/mla_offload-0.1.0-*.whl) || fail "no wheel"
# (Listed into files first: grep -q would end a pipe early, and pipefail
# would take the writer's SIGPIPE for a failure.)
tar tzf "$sdist" > "$tmp/sdist.txt"
grep -q "proto/mla_offload.proto" "$tmp/sdist.txt" || fail "the sdist lacks proto/mla_offload.proto"
python3 -m zipfile -l "$wheel" > "$tmp/wheel.txt"
grep -q "mla_offload/_generated/mla_offload_pb2_grpc.py" "$tmp/wheel.txt" ||
  fail "the wheel lacks the generated stubs"

server="$root/server/mla_offload_server"
"$server" --listen=127.0.0.1:0 --metrics_port=-1 --backend=cpu --cpu_threads=1 \
  --kv_cache_gb=0.05 > "$tmp/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2> /dev/null; wait $pid 2> /dev/null' EXIT
for _ in $(seq 100); do grep -q "serving on" "$tmp/server.log" && break; sleep 0.1; done
target=$(grep -o "serving on 127.0.0.1:[0-9]*" "$tmp/server.log" | awk '{print $3}')
[ -n "$target" ] || fail "the server did not start: $(cat "$tmp/server.log")"

check() {  # the venv's python uses the installed package
  (cd "$tmp" && "$1/bin/python" - "$target" <<'PY'
import sys
import mla_offload as mo
assert "site-packages" in mo.__file__, mo.__file__
assert mo.rendezvous_weight("seq-1", "10.0.0.1:50051") == 0x113CCF9DE930EE00
with mo.connect(sys.argv[1], timeout=30.0) as client:
    version = client.server_info().version
    assert version.startswith("mla-offload "), version
    session = client.create_session("deepseek-v4-flash", num_heads=8)
    assert client.close_session(session) > 0
print("ok:", mo.__file__, version)
PY
  )
}

echo "== pip install the wheel (fresh venv)"
python3 -m venv "$tmp/wheel"
"$tmp/wheel/bin/pip" install -q "$wheel" || fail "pip install of the wheel failed"
check "$tmp/wheel" || fail "the installed wheel does not work"

echo "== pip install ./client/python (fresh venv)"
python3 -m venv "$tmp/tree_install"
(cd "$tree" && "$tmp/tree_install/bin/pip" install -q ./client/python) ||
  fail "pip install ./client/python failed"
check "$tmp/tree_install" || fail "the package installed from the tree does not work"
echo "package_test: PASS"
