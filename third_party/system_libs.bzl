"""Repository rules that expose Debian's system libraries to Bazel, offline.

Headers live in /usr/include, which Bazel already treats as a system include
directory, so each library is only a cc_library carrying link flags. The flags
come from pkg-config at fetch time, so they follow the installed versions
(Debian's gRPC needs about 90 split Abseil libraries).
"""

def _pkg_config(ctx, args):
    result = ctx.execute(["pkg-config"] + args)
    if result.return_code != 0:
        fail("pkg-config %s failed (install the -dev package; tools/setup.sh does): %s" %
             (" ".join(args), result.stderr))
    return result.stdout.strip().split(" ") if result.stdout.strip() else []

def _pkg_config_library_impl(ctx):
    linkopts = _pkg_config(ctx, ["--libs"] + ctx.attr.modules) + ctx.attr.extra_linkopts
    copts = [f for f in _pkg_config(ctx, ["--cflags"] + ctx.attr.modules) if not f.startswith("-I")]
    ctx.file("WORKSPACE", "workspace(name = %r)\n" % ctx.name)
    ctx.file("BUILD", """
cc_library(
    name = "lib",
    copts = {copts},
    linkopts = {linkopts},
    visibility = ["//visibility:public"],
)
""".format(copts = repr(copts), linkopts = repr(linkopts)))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {
        "modules": attr.string_list(mandatory = True),
        "extra_linkopts": attr.string_list(),
    },
    local = True,
    doc = "A cc_library named :lib linking the given pkg-config modules.",
)
