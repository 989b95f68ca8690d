"""Client: one channel to one mla_offload_server and its calls.

Every call has a deadline (the client's `timeout`, or the call's own) and
raises MlaOffloadError with the gRPC code and the server's message when it
fails. A request that fails leaves every session as it was (the server's
contract), so a caller may fix it and send it again.

Thread safety: a Client may be shared by threads; so may an AttendStream
(see attend.py).
"""

import dataclasses
import math
import numbers
import os
import pathlib
import secrets
from typing import Optional

import grpc
import numpy as np

from ._stubs import pb, pb_grpc
from .attend import DEFAULT_STEP_TIMEOUT, AttendStream, session_id_of
from .errors import MlaOffloadError
from .regions import HostRegion
from .tensors import fill_tensor

DEFAULT_MAX_MESSAGE_BYTES = 256 << 20  # the server's --max_message_mb default


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """TLS for the channel (PEM bytes). root_certificates: the CA to trust
    (None: the system's). private_key + certificate_chain: the client's own
    certificate, for servers that require mutual TLS. server_name: the name
    to check the server's certificate against, when it differs from the
    target's host."""
    root_certificates: Optional[bytes] = None
    private_key: Optional[bytes] = None
    certificate_chain: Optional[bytes] = None
    server_name: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Session:
    """A session the server created: pass it (or its id) to later calls."""
    session_id: str
    model: str
    num_heads: int
    padded_heads: int  # the kernel head count H runs at


@dataclasses.dataclass(frozen=True)
class LayerRows:
    """KV rows of one layer for append_kv: swa_kv uint16 bf16 [P, 512] (RoPE
    not yet applied); compressed_kv uint16 bf16 [M, 512] (C4A/C128A layers),
    rows first_compressed_row .. + M - 1."""
    layer: int
    swa_kv: np.ndarray
    compressed_kv: Optional[np.ndarray] = None
    first_compressed_row: int = 0


@dataclasses.dataclass(frozen=True)
class AppendResult:
    next_position: int
    kv_blocks_used: int  # by this session


HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


# The health name that turns NOT_SERVING when the server drains (readiness);
# "" stays SERVING until the process exits (liveness).
READINESS_SERVICE = "mla_offload.v1.MlaOffload"


def _health_request(service):
    """HealthCheckRequest {string service = 1;} written by hand (see below)."""
    name = service.encode()
    if len(name) > 127:
        raise ValueError(f"health service name longer than 127 bytes: {service!r}")
    return b"\x0a" + bytes([len(name)]) + name if name else b""


def _health_status(message):
    """HealthCheckResponse {ServingStatus status = 1;} read by hand, so that the
    package needs no grpc_health stubs: empty = 0, else tag 0x08 and a varint."""
    if not message:
        return HEALTH_STATUS[0]
    if message[0] != 0x08 or len(message) < 2 or message[1] & 0x80:
        raise ValueError(f"unexpected HealthCheckResponse bytes {message!r}")
    return HEALTH_STATUS.get(message[1], str(message[1]))


MAX_IDLE_TTL_SECONDS = 2**31 - 1  # CreateSessionRequest.idle_ttl_seconds is an int32


def _whole_ttl_seconds(idle_ttl_seconds):
    """idle_ttl_seconds as the wire's whole seconds, as the C++ client sends it."""
    if isinstance(idle_ttl_seconds, bool) or not isinstance(idle_ttl_seconds, numbers.Real):
        raise TypeError(f"idle_ttl_seconds: expected a number of seconds, got "
                        f"{type(idle_ttl_seconds).__name__}")
    if not idle_ttl_seconds >= 0:  # NaN too
        raise MlaOffloadError(grpc.StatusCode.INVALID_ARGUMENT,
                              f"idle_ttl_seconds is {idle_ttl_seconds}: give 0 (the server's "
                              "default) or a positive number of seconds", "CreateSession")
    if idle_ttl_seconds >= MAX_IDLE_TTL_SECONDS:  # inf too
        return MAX_IDLE_TTL_SECONDS
    return math.ceil(idle_ttl_seconds)


def _is_loopback(target):
    """Whether `target` names this host alone: a Unix socket or TCP loopback."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    host = target.removeprefix("dns:///").removeprefix("ipv4:").removeprefix("ipv6:")
    host = host.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def load_token(path=None, env="MLA_OFFLOAD_TOKEN"):
    """The bearer token in file `path` (its one line), else in the
    environment variable `env`; None when neither gives one."""
    if path is not None:
        token = pathlib.Path(path).read_text().strip()
        if not token:
            raise ValueError(f"{path} is empty")
        return token
    token = os.environ.get(env, "").strip() if env else ""
    return token or None


class Client:
    """A channel to one server. Use as a context manager, or call close().

    target: "HOST:PORT". tls: a TlsConfig for a TLS channel (None: plaintext),
    or channel_credentials: any grpc.ChannelCredentials (e.g. composed with
    call credentials) instead. metadata: (key, value) pairs sent with every
    call. token: a bearer token (the server's --auth_tokens_file names its
    tenant), sent as "authorization: Bearer TOKEN" with every call; never
    put in an error or a log here, and refused (ValueError) over plaintext
    to a target that is not on this host. load_token() reads one from a file
    or $MLA_OFFLOAD_TOKEN. timeout: the default
    deadline of unary calls, in seconds. max_message_bytes: the largest
    message sent or received. channel_options: more gRPC channel arguments.
    """

    def __init__(self, target, *, tls=None, channel_credentials=None, metadata=(), timeout=30.0,
                 max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, channel_options=(), token=None):
        if tls is not None and channel_credentials is not None:
            raise ValueError("pass tls or channel_credentials, not both")
        if token is not None:
            if not token or any(c <= " " or c > "~" for c in token):
                raise ValueError("token: printable ASCII without spaces (a newline at the end "
                                 "of the token file?)")
            if tls is None and channel_credentials is None and not _is_loopback(target):
                raise ValueError(f"a token over plaintext to {target}, which is not on this "
                                 "host, would cross the network in the clear; pass tls")
            metadata = tuple(metadata) + (("authorization", f"Bearer {token}"),)
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # Tensor messages are large: wide HTTP/2 windows keep a stream
            # from stalling on flow control, as on the server.
            ("grpc.http2.lookahead_bytes", 64 << 20),
        ]
        if tls is not None:
            channel_credentials = grpc.ssl_channel_credentials(
                tls.root_certificates, tls.private_key, tls.certificate_chain)
            if tls.server_name:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
        options.extend(channel_options)
        if channel_credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, channel_credentials, options=options)
        self._stub = pb_grpc.MlaOffloadStub(self._channel)
        self._health = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda message: message,
            response_deserializer=lambda message: message)
        # The client's identity for its regions (regions.py): the server keeps
        # them apart from other clients' by it.
        self.client_id = secrets.token_hex(16)
        self._metadata = tuple(metadata) + (("mla-client-id", self.client_id),)
        self.target = target
        self.timeout = timeout

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _call(self, method, request, timeout):
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata)
        except grpc.RpcError as error:
            raise MlaOffloadError.from_rpc_error(error, method) from None

    def server_info(self, timeout=None):
        """pb.ServerInfo: models, backend, devices, head counts, capacity, limits."""
        return self._call("GetServerInfo", pb.GetServerInfoRequest(), timeout)

    def model(self, name, timeout=None):
        """pb.ModelInfo of a model profile the server serves; KeyError if none."""
        for model in self.server_info(timeout).models:
            if model.name == name:
                return model
        raise KeyError(f"{self.target} does not serve model {name!r}")

    def health(self, timeout=None, service=""):
        """grpc.health.v1 status of `service`: "" (the default) is the server
        process, SERVING until it exits; READINESS_SERVICE is the service's
        own name, "NOT_SERVING" from the start of a drain on."""
        request = _health_request(service)
        try:
            reply = self._health(request, timeout=self.timeout if timeout is None else timeout,
                                 metadata=self._metadata)
        except grpc.RpcError as error:
            raise MlaOffloadError.from_rpc_error(error, "Health.Check") from None
        return _health_status(reply)

    def create_session(self, model, num_heads, sinks=None, idle_ttl_seconds=0, timeout=None):
        """A new Session of `model` whose ranks send `num_heads` query heads.

        sinks: float32 [num_attention_layers, h_total] (or [layers, num_heads]
        when every rank has the same heads); None: no sink.
        idle_ttl_seconds: closed after this long unused; 0: the server's default.
        Rounded up to whole seconds; longer than 2**31 - 1 s (or inf) asks for
        2**31 - 1, the longest the server can be asked for. Negative (or NaN):
        MlaOffloadError INVALID_ARGUMENT, nothing sent.
        """
        request = pb.CreateSessionRequest(model=model, num_heads=num_heads,
                                          idle_ttl_seconds=_whole_ttl_seconds(idle_ttl_seconds))
        if sinks is not None:
            fill_tensor(request.sinks, sinks, pb.DTYPE_F32, "sinks")
        reply = self._call("CreateSession", request, timeout)
        return Session(reply.session_id, model, reply.num_heads, reply.padded_heads)

    def append_kv(self, session, first_position, layers, num_positions=None, timeout=None):
        """Appends positions first_position .. + P - 1 of every attention layer.

        layers: one LayerRows per attention layer of the model. num_positions:
        P; default: the rows of the first layer's swa_kv.
        """
        layers = list(layers)
        if num_positions is None:
            num_positions = int(np.shape(layers[0].swa_kv)[0]) if layers else 0
        request = pb.AppendKVRequest(session_id=session_id_of(session),
                                     first_position=first_position, num_positions=num_positions)
        for rows in layers:
            entry = request.layers.add(layer=rows.layer,
                                       first_compressed_row=rows.first_compressed_row)
            fill_tensor(entry.swa_kv, rows.swa_kv, pb.DTYPE_BF16, f"layers[{rows.layer}].swa_kv")
            if rows.compressed_kv is not None:
                fill_tensor(entry.compressed_kv, rows.compressed_kv, pb.DTYPE_BF16,
                            f"layers[{rows.layer}].compressed_kv")
        reply = self._call("AppendKV", request, timeout)
        return AppendResult(reply.next_position, reply.kv_blocks_used)

    def close_session(self, session, timeout=None):
        """Frees the session; returns the KV blocks freed. Unknown: NOT_FOUND."""
        request = pb.CloseSessionRequest(session_id=session_id_of(session))
        return self._call("CloseSession", request, timeout).kv_blocks_freed

    def list_sessions(self, timeout=None):
        """pb.SessionInfo of the sessions the server holds: with tokens, those of
        this token's tenant (an operator's: every tenant's, with its name)."""
        return list(self._call("ListSessions", pb.ListSessionsRequest(), timeout).sessions)

    def echo(self, payloads, timeout=None):
        """Sends each payload (bytes) through the Echo stream; returns what came back."""
        requests = (pb.EchoMessage(payload=payload) for payload in payloads)
        try:
            replies = self._stub.Echo(requests, timeout=self.timeout if timeout is None else timeout,
                                      metadata=self._metadata)
            return [reply.payload for reply in replies]
        except grpc.RpcError as error:
            raise MlaOffloadError.from_rpc_error(error, "Echo") from None

    def register_region(self, name, nbytes, timeout=None):
        """Registers `nbytes` of the POSIX shared-memory object `name` ("/...")
        with the server (on its host only); the region's id. host_region()
        does it all."""
        request = pb.RegisterRegionRequest(kind=pb.REGION_KIND_SYSTEM_SHM, name=name,
                                           byte_size=nbytes)
        return self._call("RegisterRegion", request, timeout).region_id

    def unregister_region(self, region_id, timeout=None):
        """Unregisters a region of this client; unknown: NOT_FOUND."""
        self._call("UnregisterRegion", pb.UnregisterRegionRequest(region_id=region_id), timeout)

    def list_regions(self, timeout=None):
        """pb.RegionInfo of every region this client holds."""
        return list(self._call("ListRegions", pb.ListRegionsRequest(), timeout).regions)

    def host_region(self, nbytes, timeout=None):
        """A new HostRegion of `nbytes` (regions.py) registered with the server."""
        return HostRegion(self, nbytes, timeout)

    def attend(self, timeout=None, max_in_flight=8, step_timeout=DEFAULT_STEP_TIMEOUT):
        """Opens an AttendStream. timeout: the deadline of the whole stream in
        seconds (None: none; a long-lived stream usually has none).
        step_timeout: seconds within which each message must be answered
        (default 30); a later answer cancels the stream with DEADLINE_EXCEEDED."""
        return AttendStream(self._stub, timeout=timeout, metadata=self._metadata,
                            max_in_flight=max_in_flight, step_timeout=step_timeout)


def connect(target, **kwargs):
    """Client(target, **kwargs)."""
    return Client(target, **kwargs)
