"""The generated protobuf and gRPC stubs (mla_offload._generated).

They are generated from proto/mla_offload.proto, never committed: by setup.py
when the package is installed, by Bazel when its tests run, or by hand with
client/python/generate_stubs.py (README.md).
"""

try:
    from ._generated import mla_offload_pb2 as pb
    from ._generated import mla_offload_pb2_grpc as pb_grpc
except ImportError as error:
    raise ImportError(
        "mla_offload: the generated stubs are missing; run "
        "`/usr/bin/python3 client/python/generate_stubs.py client/python/mla_offload/_generated` "
        "or install the package (client/python/README.md)") from error

__all__ = ["pb", "pb_grpc"]
