"""cuda_library: compiles .cu files with nvcc (through a genrule) for Hopper.

Each .cu becomes an object file and a .ptxas.txt file holding nvcc's
-Xptxas -v resource report (registers, shared memory, spills per kernel); the
report is also printed to stderr, so it shows in the build log. The objects
are wrapped in a cc_library together with the CUDA runtime. Only call this
when @local_cuda//:defs.bzl says HAS_CUDA.
"""

load("@local_cuda//:defs.bzl", "CUDA_ROOT")

NVCC_FLAGS = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-O3",
    "-std=c++17",
    "-Xcompiler",
    "-fPIC",
    "-Xptxas",
    "-v",
    "-lineinfo",
]

def cuda_library(name, srcs, hdrs = [], device_hdrs = [], deps = [], copts = [], **kwargs):
    """device_hdrs: headers only the .cu files include (device code)."""
    objects = []
    for src in srcs:
        stem = src[:-len(".cu")]
        obj = "%s_%s.o" % (name, stem.replace("/", "_"))
        report = "%s_%s.ptxas.txt" % (name, stem.replace("/", "_"))
        native.genrule(
            name = "%s_%s_nvcc" % (name, stem.replace("/", "_")),
            srcs = [src] + hdrs + device_hdrs + ["@local_cuda//:headers"],
            outs = [obj, report],
            # nvcc is run from the toolkit itself (it finds cicc, ptxas and
            # its headers relative to its real location, not through a link).
            cmd = " ".join([
                CUDA_ROOT + "/bin/nvcc",
            ] + NVCC_FLAGS + copts + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location %s)" % src,
                "-o $(location %s)" % obj,
                "2> $(location %s)" % report,
                "|| { cat $(location %s) >&2; exit 1; };" % report,
                "cat $(location %s) >&2" % report,
            ]),
            message = "nvcc %s" % src,
        )
        objects.append(obj)
    native.filegroup(
        name = name + "_ptxas",
        srcs = [":%s_%s.ptxas.txt" % (name, s[:-len(".cu")].replace("/", "_")) for s in srcs],
    )
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_runtime"],
        linkstatic = True,
        # The kernels' host stubs are called from shared objects in tests.
        alwayslink = True,
        **kwargs
    )
