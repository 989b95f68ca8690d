#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the demo need, and
# the project's Python venv (.venv: the manifest checks' pinned PyPI
# packages, deploy/requirements.txt), and does nothing when all is present
# (a second run takes a second or two). Safe to run again at any time;
# README.md's two commands call it first.
#
#   tools/setup.sh               everything
#   tools/setup.sh --build-only  only what `bazel build` needs (the image's
#                                build stage, deploy/image/Containerfile)
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=false
case "${1:-}" in
  "") ;;
  --build-only) build_only=true ;;
  *) echo "setup: unknown argument '$1' (no argument, or --build-only)" >&2; exit 2 ;;
esac

build_packages=(
  # Build: Bazel offline with Debian's rules, a C++ compiler, pkg-config.
  bazel-bootstrap bazel-platforms bazel-rules-java g++ pkgconf
  # Libraries (headers from /usr/include, flags from pkg-config).
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libmicrohttpd-dev
  # Test summary, scripts, the Python stubs' genrule.
  python3
)
test_packages=(
  # Fuzzers (tools/fuzz.sh): clang with libFuzzer and the sanitizer
  # runtimes, and lld to link them.
  clang-14 libclang-rt-14-dev lld-14
  # Python client (client/python/): numpy, gRPC and protobuf runtimes; its
  # stubs come from protoc and grpc_python_plugin (protobuf-compiler-grpc).
  # pytest runs its tests and those of kernels/bench.
  python3-numpy python3-grpcio python3-protobuf python3-pytest
  # Load-test latency pictures.
  gnuplot-nox
  # The TLS tests make their certificates (tests/support/make_test_certs.sh);
  # the metrics endpoint's TLS test scrapes with curl.
  openssl curl
  # deploy/ (deploy/check.sh): the container image test (podman with runc,
  # a Debian base image made offline by mmdebstrap), the manifest checks'
  # venv, and YAML for the pod replay test.
  podman runc mmdebstrap python3-venv python3-yaml
)
packages=("${build_packages[@]}")
$build_only || packages+=("${test_packages[@]}")

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "setup: run this as root (or install sudo) to install: ${missing[*]}" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  echo "setup: done" >&2
fi
$build_only && exit 0

# The venv sees Debian's packages (PyYAML, grpcio, numpy) and adds the
# pinned ones; a stamp of the requirements says it is up to date.
requirements=deploy/requirements.txt
stamp=.venv/requirements.sha256
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: making .venv (PyPI: $(grep -c '==' "$requirements") pinned packages of $requirements)" >&2
  rm -rf .venv
  /usr/bin/python3 -m venv --system-site-packages .venv
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -r "$requirements"
  echo "$want" >"$stamp"
fi
