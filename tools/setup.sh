#!/usr/bin/env bash
# Installs every Debian package the build, the tests and the demo need, and
# nothing when they are all present (a second run takes a second or two).
# Safe to run again at any time; README.md's two commands call it first.
set -euo pipefail

packages=(
  # Build: Bazel offline with Debian's rules, a C++ compiler, pkg-config.
  bazel-bootstrap bazel-platforms bazel-rules-java g++ pkgconf
  # Libraries (headers from /usr/include, flags from pkg-config).
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcivetweb-dev
  # Fuzzers (tools/fuzz.sh): clang with libFuzzer and the sanitizer
  # runtimes, and lld to link them.
  clang-14 libclang-rt-14-dev lld-14
  # Test summary and scripts.
  python3
  # Python client (client/python/): numpy, gRPC and protobuf runtimes; its
  # stubs come from protoc and grpc_python_plugin (protobuf-compiler-grpc).
  python3-numpy python3-grpcio python3-protobuf
  # Load-test latency pictures.
  gnuplot-nox
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

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
