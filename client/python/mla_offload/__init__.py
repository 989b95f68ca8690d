"""Python client of mla-offload, the DeepSeek-V4 sparse MLA attention-offload server.

    import mla_offload as mo
    with mo.connect("127.0.0.1:50051") as client:
        session = client.create_session("deepseek-v4-flash", num_heads=16)
        client.append_kv(session, 0, [mo.LayerRows(layer, swa_kv[layer]) ...])
        with client.attend() as stream:
            future = stream.submit(layer=0, segments=[mo.Segment(session, 512)], q=q, kv=kv)
            out = mo.bf16_to_float32(future.result().out)

Tensors are numpy arrays; bf16 tensors are uint16 arrays of bit patterns
(float32_to_bf16 / bf16_to_float32 convert); the optional FP8 output is
uint8 e4m3 codes and scales (dequantize_fp8 converts). On the server's host, tensors
and answers may lie in shared memory (client.host_region(), regions.py).
Failures raise MlaOffloadError with the gRPC code and the server's message.
See README.md beside the package.
"""

from .attend import AttendResult, AttendStream, Segment
from .bf16 import bf16_to_float32, float32_to_bf16, round_to_bf16
from .client import (READINESS_SERVICE, AppendResult, Client, LayerRows, Session, TlsConfig,
                     connect, load_token)
from .errors import MlaOffloadError
from .fp8 import dequantize_fp8
from .placement import Cluster, rendezvous_place, rendezvous_weight, statefulset_targets
from .regions import HostRegion, RegionArray
from ._stubs import pb

__all__ = [
    "READINESS_SERVICE", "AppendResult", "AttendResult", "AttendStream", "Client", "Cluster",
    "HostRegion", "LayerRows", "MlaOffloadError", "RegionArray", "Segment", "Session",
    "TlsConfig", "bf16_to_float32", "connect", "dequantize_fp8", "float32_to_bf16", "load_token",
    "pb",
    "rendezvous_place",
    "rendezvous_weight", "round_to_bf16", "statefulset_targets",
]
