"""C++ code generation for .proto files with the system protoc and gRPC plugin.

cc_proto_grpc_library(name, src, grpc) runs Debian's protoc (and
grpc_cpp_plugin when grpc is True) on one .proto file of the calling package
and wraps the generated sources in a cc_library of that name. Generated headers
are included by their path in the workspace: "proto/x.pb.h" for proto/x.proto.
"""

def cc_proto_grpc_library(name, src, grpc = True, deps = [], visibility = None):
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc"]
    cmd = "protoc --proto_path=. --cpp_out=$(GENDIR) "
    if grpc:
        outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        cmd += "--grpc_out=$(GENDIR) --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) "
    native.genrule(
        name = name + "_generate",
        srcs = [src],
        outs = outs,
        cmd = cmd + "$(location " + src + ")",
        message = "protoc " + src,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["@system_grpc//:lib"],
        visibility = visibility,
    )
