"""OpenAI-shaped errors: what each failure becomes on the wire, recognised by its type.

Bodies are OpenAI's, so its SDK and ``ChatOpenAI`` raise their usual errors (docs/serve.md).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from esi_guard.exceptions import APIError, BackendError, ContextLengthError, InputError, reason

__all__ = [
    "ServeError",
    "from_exception",
    "from_validation",
    "overloaded",
    "replica_unavailable",
    "shutting_down",
]


class ServeError(Exception):
    """An HTTP error with OpenAI's body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind
        self.headers = headers or {}

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole (a Ray Serve replica hands its errors to the front)."""
        return (_rebuilt, (self.status, self.message, self.code, self.param, self.kind,
                           self.headers))  # fmt: skip

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}  # fmt: skip


def _rebuilt(
    status: int, message: str, code: str | None, param: str | None, kind: str,
    headers: dict[str, str],
) -> ServeError:  # fmt: skip
    return ServeError(status, message, code=code, param=param, kind=kind, headers=headers)


_UNION_TAGS = frozenset({"str", "int", "float", "bool"})
"""The names pydantic puts in a location for a union's branch: not fields."""


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as OpenAI names a field: ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part not in _UNION_TAGS and "[" not in part and "(" not in part:
            out += f".{part}" if out else part
    return out


def from_validation(exc: ValidationError) -> ServeError:
    """The first problem of a request body that does not fit the schema."""
    errors = exc.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    first = unknown[0] if unknown else errors[0]
    param = _param(tuple(first["loc"]))
    if first["type"] == "extra_forbidden":
        msg = f"Unrecognized request argument supplied: {param}"
        return ServeError(400, msg, code="unknown_parameter", param=param)
    if first["type"] == "missing":
        msg = f"Missing required parameter: {param}"
        return ServeError(400, msg, code="missing_required_parameter", param=param)
    text = str(first["msg"]).removeprefix("Value error, ")
    return ServeError(400, f"Invalid value for {param}: {text}", code="invalid_value", param=param)


def from_exception(exc: BaseException) -> ServeError:
    """What a guarded call's failure (in place of its answer) becomes."""
    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, InputError):
        return ServeError(400, str(exc), code="invalid_prompt", param="messages")
    if isinstance(exc, ContextLengthError):
        return ServeError(400, reason(exc), code="context_length_exceeded", param="messages")
    if isinstance(exc, APIError):
        msg = f"the upstream model server failed: {reason(exc)}"
        return ServeError(502, msg, code="upstream_error", kind="upstream_error")
    if isinstance(exc, BackendError):
        return ServeError(500, reason(exc), code=exc.code, kind="server_error")
    return ServeError(500, f"internal error: {type(exc).__name__}", code="internal_error",
                      kind="server_error")  # fmt: skip


def overloaded(retry_after: int, why: str) -> ServeError:
    """A 503 with ``Retry-After``."""
    return ServeError(503, why, code="server_overloaded", kind="server_error",
                      headers={"Retry-After": str(retry_after)})  # fmt: skip


def replica_unavailable(retry_after: int, why: str) -> ServeError:
    """The 503 of a request whose Ray Serve replica died before answering: a retry is safe."""
    msg = f"the replica serving this request is gone ({why}): retry, another replica answers"
    return ServeError(503, msg, code="replica_unavailable", kind="server_error",
                      headers={"Retry-After": str(retry_after)})  # fmt: skip


def shutting_down(retry_after: int) -> ServeError:
    """The 503 a new chat request gets while the server drains: another replica can answer."""
    msg = "the server is shutting down: send the request to another replica"
    return ServeError(503, msg, code="server_shutting_down", kind="server_error",
                      headers={"Retry-After": str(retry_after)})  # fmt: skip
