#!/usr/bin/env bash
# Builds the CUDA test and benchmark (and the server, its end-to-end test and
# the transport benchmark, which take --backend=cuda) here and gathers them, with the shared
# libraries that a GPU host without the build's libraries lacks (Abseil and
# the project's own Bazel-built .so files), into .device/ (ignored by git),
# for kernels/cuda/run_on_device.sh to run on the lent GPU machine.
#   prepare_device.sh                  everything, into a fresh .device/
#   prepare_device.sh --variant NAME   only cuda_bench and cuda_backend_test of
#                                      the tree as it is now, added to .device/
#                                      as cuda_bench_NAME and cuda_backend_test_NAME
#                                      (for ab_on_device.sh: an A/B of two builds)
set -euo pipefail
cd "$(dirname "$0")/../.."
# The commit the binaries are built from; "-dirty" when the tree has
# changes not yet committed (results.json records it).
commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo -dirty)"
if [[ ${1:-} == --variant ]]; then
  name=${2:-}
  if [[ $# -gt 2 ]]; then
    echo "prepare_device: --variant takes one name (got: ${*:2})" >&2
    exit 2
  fi
  if [[ ! $name =~ ^[A-Za-z0-9_]+$ ]]; then
    echo "prepare_device: --variant takes a name of letters, digits and _ (got '$name')" >&2
    exit 2
  fi
  if [[ ! -d .device/lib ]]; then
    echo "prepare_device: run it without --variant first (the variant shares .device/lib)" >&2
    exit 2
  fi
  bazel build //kernels/cuda:cuda_backend_test //kernels/bench:cuda_bench
  cp -L --remove-destination bazel-bin/kernels/bench/cuda_bench ".device/cuda_bench_$name"
  cp -L --remove-destination bazel-bin/kernels/cuda/cuda_backend_test ".device/cuda_backend_test_$name"
  echo "$commit" > ".device/commit_$name.txt"
  cp kernels/cuda/ab_on_device.sh kernels/bench/ab_table.py .device/
  du -sh .device
  exit 0
fi
if [[ $# -gt 0 ]]; then
  echo "prepare_device: unknown argument $1 (none, or --variant NAME)" >&2
  exit 2
fi
bazel build //kernels/cuda:cuda_backend_test //kernels/bench:cuda_bench //kernels/tool:mla_kernel_tool \
  //server:mla_offload_server //tests/integration:server_e2e_test //server/bench:transport_bench \
  //server/bench:host_copy_bench //client/loadtest:mla_offload_loadtest \
  //tests/integration:region_holder //server/bench:cuda_ipc_holder
rm -rf .device && mkdir -p .device/lib
for binary in bazel-bin/kernels/cuda/cuda_backend_test bazel-bin/kernels/bench/cuda_bench \
    bazel-bin/kernels/tool/mla_kernel_tool bazel-bin/server/mla_offload_server \
    bazel-bin/tests/integration/server_e2e_test bazel-bin/server/bench/transport_bench \
    bazel-bin/server/bench/host_copy_bench bazel-bin/client/loadtest/mla_offload_loadtest \
    bazel-bin/tests/integration/region_holder bazel-bin/server/bench/cuda_ipc_holder; do
  cp -L "$binary" .device/
  ldd "$binary" | awk '/=> \// {print $3}' |
    grep -v -E '/lib(c|m|gcc_s|stdc\+\+|pthread|dl|rt)\.so|ld-linux' |
    while read -r lib; do cp -L -n "$lib" .device/lib/; done
done
cp kernels/cuda/run_on_device.sh kernels/cuda/ab_on_device.sh kernels/bench/ab_table.py .device/
echo "$commit" > .device/commit.txt
du -sh .device
