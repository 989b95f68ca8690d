"""The one exception this package raises for what the server (or gRPC) refused."""

import grpc

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(value):
    """A grpc.StatusCode from its number (RequestStatus.code); UNKNOWN if none."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


class MlaOffloadError(Exception):
    """A call or an Attend message that did not succeed.

    code: grpc.StatusCode (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED,
      FAILED_PRECONDITION, UNAVAILABLE, DEADLINE_EXCEEDED, ...).
    message: the server's message, which names the field and what to change.
    method: the RPC, e.g. "CreateSession" or "Attend".
    request_id: for an Attend message, its request_id; else None.
    """

    def __init__(self, code, message, method, request_id=None):
        self.code = code
        self.message = message
        self.method = method
        self.request_id = request_id
        where = method if request_id is None else f"{method} request {request_id}"
        super().__init__(f"{where}: {code.name}: {message}")

    @classmethod
    def from_rpc_error(cls, error, method, request_id=None):
        """Wraps a grpc.RpcError (a failed call or a failed stream)."""
        code = error.code() if callable(getattr(error, "code", None)) else None
        details = error.details() if callable(getattr(error, "details", None)) else None
        return cls(code or grpc.StatusCode.UNKNOWN, details or str(error), method, request_id)
