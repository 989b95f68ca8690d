#!/usr/bin/env bash
# The main job (README.md's first command). Installs missing Debian packages,
# builds, and runs the kernel tool's self-demo on the CPU backend: random
# DeepSeek-V4 inputs, the fused prologue and the sparse decode, timings, and a
# check of every output against an independent float64 reference.
# Extra arguments go to `mla_kernel_tool demo` (see its --help).
set -euo pipefail
cd "$(dirname "$0")/.."

tools/setup.sh
[ -x bazel-bin/kernels/tool/mla_kernel_tool ] ||
  echo "demo: building mla_kernel_tool (the first build takes a few minutes)" >&2
bazel build --noshow_progress //kernels:mla_kernel_tool 2>&1 | grep -E "ERROR|error:" || true
tool=bazel-bin/kernels/tool/mla_kernel_tool
if [ ! -x "$tool" ]; then
  echo "demo: the build failed; run 'bazel build //kernels:mla_kernel_tool' to see why" >&2
  exit 1
fi

if [ $# -gt 0 ]; then
  exec "$tool" demo "$@"
fi
echo "== DeepSeek-V4-Flash, TP4 (16 heads), 16 tokens, C4A layer =="
"$tool" demo --backend=cpu --model=deepseek-v4-flash --tp=4 --batch=16
echo
echo "== DeepSeek-V4-Pro, TP8 (16 heads), 16 tokens, C4A layer =="
"$tool" demo --backend=cpu --model=deepseek-v4-pro --tp=8 --batch=16
