#!/usr/bin/env bash
# Builds the CUDA test and benchmark (and the server, its end-to-end test and
# the transport benchmark, which take --backend=cuda) here and gathers them, with the shared
# libraries that a GPU host without the build's libraries lacks (Abseil and
# the project's own Bazel-built .so files), into .device/ (ignored by git),
# for kernels/cuda/run_on_device.sh to run on the lent GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
bazel build //kernels/cuda:cuda_backend_test //kernels/bench:cuda_bench //kernels/tool:mla_kernel_tool \
  //server:mla_offload_server //tests/integration:server_e2e_test //server/bench:transport_bench
rm -rf .device && mkdir -p .device/lib
for binary in bazel-bin/kernels/cuda/cuda_backend_test bazel-bin/kernels/bench/cuda_bench \
    bazel-bin/kernels/tool/mla_kernel_tool bazel-bin/server/mla_offload_server \
    bazel-bin/tests/integration/server_e2e_test bazel-bin/server/bench/transport_bench; do
  cp -L "$binary" .device/
  ldd "$binary" | awk '/=> \// {print $3}' |
    grep -v -E '/lib(c|m|gcc_s|stdc\+\+|pthread|dl|rt)\.so|ld-linux' |
    while read -r lib; do cp -L -n "$lib" .device/lib/; done
done
cp kernels/cuda/run_on_device.sh .device/
# The commit the binaries were built from; "-dirty" when the tree had
# changes not yet committed (results.json records it).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo -dirty)" > .device/commit.txt
du -sh .device
