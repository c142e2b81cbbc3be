"""The client's exceptions: one class per gRPC status a caller can act on.

Every failed call raises a subclass of :class:`BursarClientError` carrying what the
server said: its message, the ``google.rpc.ErrorInfo`` reason code (``BUCKET_EMPTY``,
``OTHER_CAMPAIGN``, ...) and metadata, the ``RetryInfo`` delay where the server gave one,
and ``BadRequest`` field violations. :func:`from_rpc_error` is the one place that maps a
status to a class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = [
    "AlreadyExists",
    "BursarClientError",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "Refused",
    "Unauthenticated",
    "Unavailable",
    "from_rpc_error",
]


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One malformed request field (``google.rpc.BadRequest``)."""

    field: str
    description: str


class BursarClientError(Exception):
    """Root of every error the client raises for a failed call.

    ``message`` is the server's message (what a person should read); ``reason`` the
    stable ErrorInfo code a program can branch on (empty when the server sent none, e.g.
    a transport failure); ``retry_after`` the server's RetryInfo delay in seconds, or
    None when it gave none (retrying as-is will not help).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        code: grpc.StatusCode | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})
        self.retry_after = retry_after
        self.field_violations = field_violations
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.message} [{self.reason}]" if self.reason else self.message


class Refused(BursarClientError):
    """RESOURCE_EXHAUSTED: the broker would not grant (or renew) now.

    ``reason`` is the refusal code: ``ABOVE_BURST``, ``BUCKET_EMPTY``,
    ``GUARANTEE_RESERVED``, ``POOL_FULL``, ``HEAD_OF_LINE`` from the policy engine, or
    ``RATE_LIMITED``, ``TOO_MANY_STREAMS``, ``STREAM_OVERFLOW`` from the service's client
    limits. ``retry_after`` is always a float here: the server's estimate of when trying
    again can succeed, or ``math.inf`` when it gave none.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retry_after: float

    def __init__(self, message: str, *, retry_after: float | None = None, **kw: object) -> None:
        super().__init__(
            message, retry_after=math.inf if retry_after is None else retry_after, **kw
        )  # type: ignore[arg-type]


class NotFound(BursarClientError):
    """NOT_FOUND: no such lease or campaign."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(BursarClientError):
    """ALREADY_EXISTS: a campaign of that name exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(BursarClientError):
    """PERMISSION_DENIED: the token is valid but may not do this (``ADMIN_ONLY``,
    ``OTHER_CAMPAIGN``)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(BursarClientError):
    """UNAUTHENTICATED: the token is missing, malformed, unknown or rotated."""

    code = grpc.StatusCode.UNAUTHENTICATED


class InvalidArgument(BursarClientError):
    """INVALID_ARGUMENT: a malformed request; ``field_violations`` says which field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRange(InvalidArgument):
    """OUT_OF_RANGE: a value past a limit (e.g. ``duration_s`` longer than the pool's
    maximum lease, a size larger than the pool or the campaign's burst)."""

    code = grpc.StatusCode.OUT_OF_RANGE


class FailedPrecondition(BursarClientError):
    """FAILED_PRECONDITION: not possible in the current state (the lease has ended, or is
    being reclaimed: ``LEASE_PREEMPTING``; guarantees would exceed the pool)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(BursarClientError):
    """UNAVAILABLE: the broker cannot be reached, is shutting down (``SHUTTING_DOWN``) or
    stopped taking requests (``JOURNAL_FAILED``), and retrying with backoff for the
    client's ``retry_timeout_s`` did not help."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(BursarClientError):
    """DEADLINE_EXCEEDED: the call's deadline passed before the broker answered."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE: dict[grpc.StatusCode, type[BursarClientError]] = {
    cls.code: cls
    for cls in (
        Refused,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        Unauthenticated,
        InvalidArgument,
        OutOfRange,
        FailedPrecondition,
        Unavailable,
        DeadlineExceeded,
    )
}


def _seconds(d: object) -> float:
    return d.seconds + d.nanos / 1e9  # type: ignore[attr-defined]


def from_rpc_error(err: grpc.RpcError) -> BursarClientError:
    """The typed error for a failed call, with the server's google.rpc details."""
    code: grpc.StatusCode = err.code()  # type: ignore[attr-defined]
    message: str = err.details() or code.name  # type: ignore[attr-defined]
    reason, metadata, retry_after = "", {}, None
    violations: list[FieldViolation] = []
    try:
        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:  # the details' code or message disagree with the status: ignore them
        status = None
    for any_ in status.details if status is not None else ():
        if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif any_.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            any_.Unpack(retry)
            retry_after = _seconds(retry.retry_delay)
        elif any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            any_.Unpack(bad)
            violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    cls = _BY_CODE.get(code, BursarClientError)
    return cls(
        message,
        reason=reason,
        metadata=metadata,
        retry_after=retry_after,
        field_violations=tuple(violations),
        code=code,
    )
