"""Detects the CUDA toolkit at fetch time and exposes it as @local_cuda.

The repository holds:
  //:cuda_runtime  a cc_library with the toolkit's include/ and the static
                   runtime (lib64/libcudart_static.a, -ldl -lrt -lpthread);
                   empty when there is no toolkit.
  //:nvcc          the nvcc driver (a symlink), for cuda_library's genrules.
  //:defs.bzl      HAS_CUDA = True/False and NVCC_VERSION.

nvcc is looked up as $CUDA_PATH/bin/nvcc, then /usr/local/cuda/bin/nvcc.
Setting MLA_NO_CUDA=1 (e.g. --repo_env=MLA_NO_CUDA=1) builds as if there
were none, to check the build without the toolkit. The
toolkit must be able to target sm_90a (CUDA 12 or later): Debian's
nvidia-cuda-toolkit 11.8 cannot, so an older nvcc counts as no toolkit and the
build carries on without the CUDA backend.
"""

def _cuda_paths(ctx):
    candidates = []
    env_path = ctx.os.environ.get("CUDA_PATH", "")
    if env_path:
        candidates.append(env_path)
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if ctx.path(root + "/bin/nvcc").exists:
            return root
    return None

def _major_version(ctx, nvcc):
    result = ctx.execute([nvcc, "--version"])
    if result.return_code != 0:
        return (0, "")
    for line in result.stdout.splitlines():
        if "release" in line:
            # "Cuda compilation tools, release 13.0, V13.0.88"
            release = line.split("release")[1].strip().split(",")[0]
            return (int(release.split(".")[0]), release)
    return (0, "")

def _local_cuda_impl(ctx):
    root = None if ctx.os.environ.get("MLA_NO_CUDA", "") == "1" else _cuda_paths(ctx)
    has_cuda = False
    version = ""
    if root != None:
        major, version = _major_version(ctx, root + "/bin/nvcc")
        has_cuda = major >= 12 and ctx.path(root + "/lib64/libcudart_static.a").exists
    ctx.file("WORKSPACE", "workspace(name = %r)\n" % ctx.name)
    ctx.file("defs.bzl", "HAS_CUDA = %s\nNVCC_VERSION = %r\nCUDA_ROOT = %r\n" %
                         (has_cuda, version, root if has_cuda else ""))
    if has_cuda:
        ctx.symlink(root + "/include", "include")
        # The .lo name makes Bazel link it as a whole archive (alwayslink).
        ctx.symlink(root + "/lib64/libcudart_static.a", "lib/libcudart_static.lo")
        ctx.symlink(root + "/bin/nvcc", "bin/nvcc")
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

cc_library(
    name = "cuda_runtime",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    srcs = ["lib/libcudart_static.lo"],
    linkopts = ["-ldl", "-lrt", "-lpthread"],
    # Whole archive: tests link the project's libraries as shared objects,
    # whose CUDA calls must then resolve against the executable.
    alwayslink = True,
)

# The headers alone (cuBLAS types for a dlopen, no library linked).
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
)

filegroup(
    name = "nvcc",
    srcs = ["bin/nvcc"],
)

filegroup(
    name = "headers",
    srcs = glob(["include/**/*.h", "include/**/*.hpp"]),
)
""")
    else:
        ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

exports_files(["defs.bzl"])

# No usable CUDA toolkit was found when this repository was fetched.
cc_library(name = "cuda_runtime")

cc_library(name = "cuda_headers")

filegroup(name = "nvcc")

filegroup(name = "headers")
""")

local_cuda_repository = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH", "MLA_NO_CUDA"],
    local = True,
    doc = "@local_cuda: the CUDA toolkit found at fetch time, or an empty stand-in.",
)
