"""The one exception → gRPC status table of the service.

Every failure a call can end in is an exception; :func:`status_for` finds its row in
:data:`TABLE` and builds the ``google.rpc.Status`` the client receives: the gRPC code, a
message a person can act on, and the standard details:

* ``ErrorInfo`` (always): ``reason`` is a stable UPPER_SNAKE code a program can branch
  on (``BUCKET_EMPTY``, ``RATE_LIMITED``, ...), ``domain`` is ``bursar.v1``, and
  ``metadata`` carries the campaign, request or field involved;
* ``RetryInfo`` where waiting and retrying can succeed (refusals for lack of capacity or
  tokens, rate limits, a server shutting down);
* ``BadRequest`` for a malformed or out-of-range field;
* ``QuotaFailure`` where a campaign's own envelope (burst ceiling, bucket) or a client
  rate limit is what refused the call.

An exception without a row is a bug and propagates (gRPC reports it as UNKNOWN).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from bursar.broker.errors import ErrorCode, JournalError, RequestError
from bursar.broker.reasons import Reason

__all__ = [
    "DOMAIN",
    "TABLE",
    "PermissionDenied",
    "RateLimited",
    "Refused",
    "Row",
    "ServiceError",
    "ShuttingDown",
    "StreamOverflow",
    "TooManyStreams",
    "Unauthenticated",
    "row_for",
    "rpc_status_for",
    "status_for",
]

DOMAIN = "bursar.v1"


class ServiceError(Exception):
    """Root of the errors the service layer raises (the engine raises RequestError)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthenticated(ServiceError):
    """No usable credentials: the token is missing, malformed, or unknown."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class PermissionDenied(ServiceError):
    """Valid credentials that may not do this (another campaign's lease, an admin call)."""

    def __init__(self, reason: str, message: str, caller: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.caller = caller


class Refused(ServiceError):
    """The engine refused (or, for a blocking Acquire, did not grant in time) a request.

    ``reason`` is the engine's reason code; ``retry_after_s`` its estimate of when trying
    again can succeed.
    """

    def __init__(
        self,
        reason: Reason,
        retry_after_s: float,
        *,
        campaign: str,
        request_id: str,
        waited_s: float | None = None,
    ) -> None:
        what = "not granted within the timeout" if waited_s is not None else "refused"
        super().__init__(f"request {request_id} {what}: {reason.explanation}")
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.campaign = campaign
        self.request_id = request_id
        self.waited_s = waited_s


class RateLimited(ServiceError):
    """The client sent requests faster than its rate limit allows."""

    def __init__(self, retry_after_s: float, client: str, rate: float, burst: float) -> None:
        super().__init__(
            f"too many requests from {client}: the limit is {rate:g}/s with bursts of "
            f"{burst:g}; retry after {retry_after_s:.3f} s"
        )
        self.retry_after_s = retry_after_s
        self.client = client
        self.rate = rate
        self.burst = burst


class TooManyStreams(ServiceError):
    """The client already holds its maximum number of open streams."""

    def __init__(self, client: str, limit: int) -> None:
        super().__init__(
            f"{client} already has {limit} open streams (Watch, WatchSupply); close one "
            "first, or watch several leases on one stream"
        )
        self.client = client
        self.limit = limit


class StreamOverflow(ServiceError):
    """A stream's reader fell so far behind that events would have been dropped."""

    def __init__(self, backlog: int) -> None:
        super().__init__(
            f"the stream fell {backlog} events behind and was closed so that none is "
            "silently lost; reopen it (it starts with a snapshot of the current state)"
        )
        self.backlog = backlog


class ShuttingDown(ServiceError):
    """The server is stopping; the call was not completed (nothing was left pending)."""

    def __init__(self, what: str = "the call") -> None:
        super().__init__(
            f"the server is shutting down; {what} was withdrawn. Retry against the restarted server"
        )


# ---------------------------------------------------------------------------------------
# The table


@dataclass(frozen=True, slots=True)
class Row:
    """One kind of failure and the status it becomes."""

    key: str
    """``<exception>`` or ``<exception>:<code or reason>``: what the row matches."""
    code: grpc.StatusCode
    reason: Callable[[BaseException], str]
    metadata: Callable[[BaseException], Mapping[str, str]]
    retry_after_s: Callable[[BaseException], float] | None = None
    """How long to wait before retrying (RetryInfo); None: retrying will not help."""
    extra: Callable[[BaseException], list[Message]] = field(default=lambda _e: [])
    """Further details: BadRequest, QuotaFailure."""


QUOTE_MAX = 400
"""The most characters an error's message, or any one of its details, quotes. A reply's
status travels in the trailers, whose size a client caps (gRPC's default is 8 KiB): an
error repeating a large bad value in full would arrive as RESOURCE_EXHAUSTED instead."""


def bounded(text: str, limit: int = QUOTE_MAX) -> str:
    """``text``, cut to ``limit`` characters with a note of how long it was."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text):,} characters)"
    return text[: max(0, limit - len(note))] + note


def _request_meta(e: BaseException) -> dict[str, str]:
    assert isinstance(e, RequestError)
    return {"field": e.field}


def _bad_request(e: BaseException) -> list[Message]:
    assert isinstance(e, RequestError)
    return [
        error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=bounded(e.field), description=bounded(e.message)
                )
            ]
        )
    ]


def _request_row(code: ErrorCode, status: grpc.StatusCode, bad_request: bool) -> Row:
    return Row(
        key=f"RequestError:{code.value}",
        code=status,
        reason=lambda _e: code.value,
        metadata=_request_meta,
        extra=_bad_request if bad_request else (lambda _e: []),
    )


def _refused_meta(e: BaseException) -> dict[str, str]:
    assert isinstance(e, Refused)
    meta = {
        "campaign": e.campaign,
        "request_id": e.request_id,
        "explanation": e.reason.explanation,
    }
    if e.waited_s is not None:
        meta["waited_s"] = f"{e.waited_s:.3f}"
    return meta


def _quota(e: BaseException) -> list[Message]:
    assert isinstance(e, Refused)
    return [
        error_details_pb2.QuotaFailure(
            violations=[
                error_details_pb2.QuotaFailure.Violation(
                    subject=f"campaign:{e.campaign}", description=e.reason.explanation
                )
            ]
        )
    ]


def _refused_row(reason: Reason, status: grpc.StatusCode, retry: bool, quota: bool) -> Row:
    return Row(
        key=f"Refused:{reason.value}",
        code=status,
        reason=lambda _e: reason.value,
        metadata=_refused_meta,
        retry_after_s=(lambda e: e.retry_after_s) if retry else None,  # type: ignore[attr-defined]
        extra=_quota if quota else (lambda _e: []),
    )


def _rate_quota(e: BaseException) -> list[Message]:
    assert isinstance(e, RateLimited)
    return [
        error_details_pb2.QuotaFailure(
            violations=[
                error_details_pb2.QuotaFailure.Violation(
                    subject=e.client,
                    description=f"at most {e.rate:g} requests/s, bursts of {e.burst:g}",
                )
            ]
        )
    ]


_RE = grpc.StatusCode.RESOURCE_EXHAUSTED
_FP = grpc.StatusCode.FAILED_PRECONDITION

TABLE: tuple[Row, ...] = (
    # The engine's RequestError: bad input, refused before any state changed.
    _request_row(ErrorCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT, True),
    _request_row(ErrorCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND, False),
    _request_row(ErrorCode.ALREADY_EXISTS, grpc.StatusCode.ALREADY_EXISTS, False),
    _request_row(ErrorCode.FAILED_PRECONDITION, _FP, False),
    _request_row(ErrorCode.OUT_OF_RANGE, grpc.StatusCode.OUT_OF_RANGE, True),
    # The engine's refusals (Rejected decisions, or a blocking Acquire's last Queued reason).
    _refused_row(Reason.ABOVE_BURST, _RE, retry=True, quota=True),
    _refused_row(Reason.BUCKET_EMPTY, _RE, retry=True, quota=True),
    _refused_row(Reason.GUARANTEE_RESERVED, _RE, retry=True, quota=False),
    _refused_row(Reason.POOL_FULL, _RE, retry=True, quota=False),
    _refused_row(Reason.HEAD_OF_LINE, _RE, retry=True, quota=False),
    _refused_row(Reason.LEASE_PREEMPTING, _FP, retry=False, quota=False),
    _refused_row(Reason.DEADLINE_UNREACHABLE, _FP, retry=False, quota=False),
    # Credentials and permissions.
    Row(
        key="Unauthenticated",
        code=grpc.StatusCode.UNAUTHENTICATED,
        reason=lambda e: e.reason,  # type: ignore[attr-defined]
        metadata=lambda _e: {"metadata": "authorization", "scheme": "Bearer"},
    ),
    Row(
        key="PermissionDenied",
        code=grpc.StatusCode.PERMISSION_DENIED,
        reason=lambda e: e.reason,  # type: ignore[attr-defined]
        metadata=lambda e: {"caller": e.caller},  # type: ignore[attr-defined]
    ),
    # Per-client limits.
    Row(
        key="RateLimited",
        code=_RE,
        reason=lambda _e: "RATE_LIMITED",
        metadata=lambda e: {"client": e.client},  # type: ignore[attr-defined]
        retry_after_s=lambda e: e.retry_after_s,  # type: ignore[attr-defined]
        extra=_rate_quota,
    ),
    Row(
        key="TooManyStreams",
        code=_RE,
        reason=lambda _e: "TOO_MANY_STREAMS",
        metadata=lambda e: {"client": e.client, "limit": str(e.limit)},  # type: ignore[attr-defined]
    ),
    Row(
        key="StreamOverflow",
        code=_RE,
        reason=lambda _e: "STREAM_OVERFLOW",
        metadata=lambda e: {"backlog": str(e.backlog)},  # type: ignore[attr-defined]
        retry_after_s=lambda _e: 0.0,
    ),
    # The server itself.
    Row(
        key="ShuttingDown",
        code=grpc.StatusCode.UNAVAILABLE,
        reason=lambda _e: "SHUTTING_DOWN",
        metadata=lambda _e: {},
        retry_after_s=lambda _e: 1.0,
    ),
    Row(
        key="JournalError",
        code=grpc.StatusCode.UNAVAILABLE,
        reason=lambda _e: "JOURNAL_FAILED",
        metadata=lambda _e: {},
        retry_after_s=lambda _e: 5.0,
    ),
)

_BY_KEY: dict[str, Row] = {row.key: row for row in TABLE}


def _key(exc: BaseException) -> str | None:
    if isinstance(exc, RequestError):
        return f"RequestError:{exc.code.value}"
    if isinstance(exc, Refused):
        return f"Refused:{exc.reason.value}"
    if isinstance(exc, JournalError):
        return "JournalError"
    if isinstance(exc, ServiceError):
        return type(exc).__name__
    return None


def row_for(exc: BaseException) -> Row | None:
    """The table row for ``exc``; None if it has none (a bug: let it propagate)."""
    key = _key(exc)
    return None if key is None else _BY_KEY.get(key)


def _message(exc: BaseException) -> str:
    if isinstance(exc, RequestError | ServiceError):
        return str(exc)
    if isinstance(exc, JournalError):
        return f"the broker's journal failed and it stopped taking requests: {exc}"
    return str(exc)


def _duration(seconds: float) -> duration_pb2.Duration:
    seconds = max(0.0, seconds) if math.isfinite(seconds) else 86400.0 * 365
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def rpc_status_for(exc: BaseException, row: Row) -> status_pb2.Status:
    """The ``google.rpc.Status`` (code, message, details) for ``exc`` under ``row``."""
    details: list[Message] = [
        error_details_pb2.ErrorInfo(
            reason=row.reason(exc),
            domain=DOMAIN,
            metadata={bounded(k, 64): bounded(v) for k, v in row.metadata(exc).items()},
        )
    ]
    if row.retry_after_s is not None:
        details.append(error_details_pb2.RetryInfo(retry_delay=_duration(row.retry_after_s(exc))))
    details.extend(row.extra(exc))
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    code = getattr(code_pb2, row.code.name)
    return status_pb2.Status(code=code, message=bounded(_message(exc)), details=packed)


def status_for(exc: BaseException) -> grpc.Status | None:
    """The gRPC status to abort a call with for ``exc``; None if the table has no row."""
    row = row_for(exc)
    if row is None:
        return None
    return rpc_status.to_status(rpc_status_for(exc, row))
