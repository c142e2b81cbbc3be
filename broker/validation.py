"""Validation: whether an event may apply to the engine's state, and the message if not.

Each check is a pure function of the engine's state and the event: it reads, changes
nothing, and raises ``RequestError`` (field, code and a message that says what to do)
before the engine touches anything. ``validate`` is the one entry; ``unknown_lease`` also
answers ``Engine.lease`` for an id it does not hold.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from bursar.broker import admission, dims, shape
from bursar.broker.envelope import CampaignSpec, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    AllocationReady,
    CancelRequest,
    CreateCampaign,
    Event,
    LeaseLost,
    Meter,
    NodeLost,
    NodeReady,
    Release,
    Renew,
    RequestLease,
    UpdateCampaign,
)
from bursar.broker.keys import request_fingerprint
from bursar.broker.lease import EndedLease
from bursar.broker.policy import Enforcement
from bursar.broker.pool import NodeState

if TYPE_CHECKING:
    from bursar.broker.engine import Engine
    from bursar.broker.ledger import CampaignState

EPS = 1e-9
"""Slack on size comparisons against the pool and the burst ceiling."""


def bad(field_: str, message: str, code: ErrorCode = ErrorCode.INVALID_ARGUMENT) -> RequestError:
    return RequestError(code, field_, message)


def unknown_lease(ended: Mapping[str, EndedLease], lease_id: str) -> RequestError:
    """The error for a lease id the engine does not hold: ended (and when), or never seen."""
    if lease_id in ended:
        return bad(
            "lease_id",
            f"lease {lease_id} already ended ({ended[lease_id].state.value}); request a new lease",
            ErrorCode.FAILED_PRECONDITION,
        )
    return bad("lease_id", f"no lease {lease_id!r}", ErrorCode.NOT_FOUND)


def validate(eng: Engine, event: Event) -> None:
    """Raise ``RequestError`` if ``event`` may not apply to ``eng`` now; change nothing."""
    at = event.at
    if not isinstance(at, int | float) or not math.isfinite(at):
        raise bad("at", f"time must be a finite number of seconds (got {at!r})")
    if at < eng.now:
        raise bad("at", f"time {at} is before the engine's clock {eng.now}; time never goes back")
    validator = _VALIDATORS.get(type(event))
    if validator is not None:
        validator(eng, event)


def _campaign(eng: Engine, name: str) -> CampaignState:
    try:
        return eng.campaigns[name]
    except KeyError:
        known = ", ".join(sorted(eng.campaigns)[:10]) or "none yet"
        raise bad(
            "campaign", f"unknown campaign {name!r} (known: {known})", ErrorCode.NOT_FOUND
        ) from None


def _spec(eng: Engine, spec: CampaignSpec, creating: bool) -> None:
    if not isinstance(spec, CampaignSpec):
        raise bad("spec", "expected a CampaignSpec")
    problems = spec.problems()
    if problems:
        raise bad("spec", "; ".join(problems))
    if creating and spec.name in eng.campaigns:
        raise bad(
            "spec.name",
            f"campaign {spec.name!r} already exists; use update",
            ErrorCode.ALREADY_EXISTS,
        )
    if not creating:
        _campaign(eng, spec.name)
    total = spec.placed("guarantee")
    for name, c in eng.campaigns.items():
        if name != spec.name:
            total = dims.add(total, c.guarantee)
    if not dims.fits(total, eng.pool.capacity):
        raise bad(
            "spec.envelopes",
            f"guarantees would sum to {dims.as_dict(total)}, more than the pool's "
            f"capacity {dims.as_dict(eng.pool.capacity)}; lower a guarantee",
            ErrorCode.FAILED_PRECONDITION,
        )


def _duration(eng: Engine, d: object) -> float:
    if isinstance(d, bool) or not isinstance(d, int | float) or not math.isfinite(d) or d <= 0:
        raise bad("duration_s", f"must be a finite number of seconds > 0 (got {d!r})")
    if d > eng.policy.max_lease_s:
        raise bad(
            "duration_s",
            f"{d} s is longer than the pool's maximum lease of {eng.policy.max_lease_s} s; "
            "ask for less and renew",
            ErrorCode.OUT_OF_RANGE,
        )
    return d


def _create(eng: Engine, e: CreateCampaign) -> None:
    _spec(eng, e.spec, creating=True)


def _update(eng: Engine, e: UpdateCampaign) -> None:
    _spec(eng, e.spec, creating=False)


def _request(eng: Engine, e: RequestLease) -> None:
    c = _campaign(eng, e.campaign)
    shaped = isinstance(e.shape, shape.Shape) and (
        bool(e.shape.per_node) or e.shape.exclusive is True
    )
    if not isinstance(e.size, Mapping) or (not e.size and not shaped):
        raise bad("size", "give a size per dimension, e.g. {'gpu': 8}")
    for d, x in e.size.items():
        if d in dims.RATE:
            raise bad("size", f"{d} is a metered rate dimension: use Meter, not a lease")
        if d not in dims.PLACED:
            raise bad("size", f"unknown dimension {d!r}; allowed: {', '.join(dims.PLACED)}")
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            raise bad(f"size.{d}", f"must be a finite number (got {x!r})")
        if x < 0:
            raise bad(f"size.{d}", f"must not be negative (got {x})")
        if x > 0 and d not in c.spec.envelopes:
            raise bad(
                f"size.{d}", f"campaign {e.campaign!r} has no envelope for {d}; ask the admin"
            )
    demand = shape.resolve(e.size, e.shape, eng.pool.kinds)
    size = demand.size
    if dims.is_zero(size):
        raise bad("size", "at least one dimension must be greater than zero")
    for i, dim in enumerate(dims.PLACED):
        # Dimensions the shape added (CPUs per GPU, a whole node's memory) need an
        # envelope as much as named ones.
        if size[i] > 0 and dim not in c.spec.envelopes:
            raise bad(
                "shape",
                f"the shape gives {size[i]:g} {dims.UNITS[dim]} of {dim}, but campaign "
                f"{e.campaign!r} has no envelope for {dim}; ask the admin",
            )
    d = _duration(eng, e.duration_s)
    for i, dim in enumerate(dims.PLACED):
        if size[i] > eng.pool.capacity[i] + EPS:
            raise bad(
                f"size.{dim}",
                f"{size[i]} is larger than the whole pool ({eng.pool.capacity[i]})",
                ErrorCode.OUT_OF_RANGE,
            )
        if size[i] > c.burst[i] + EPS:
            raise bad(
                f"size.{dim}",
                f"{size[i]} is above campaign {e.campaign!r}'s burst ceiling ({c.burst[i]}) "
                "and can never be granted",
                ErrorCode.OUT_OF_RANGE,
            )
    shape.check_pool(demand, eng.pool.kinds)
    if eng.policy.enforcement is Enforcement.PREPAID:
        need = admission.token_need(dims.ZERO, size, c.sustained)
        for i, dim in enumerate(dims.PLACED):
            b = c.buckets.get(dim)
            if b is not None and not b.unlimited and need[i] * d > b.capacity + EPS:
                raise bad(
                    "duration_s",
                    f"{dims.as_dict(size)} for {d} s needs {need[i] * d:.0f} {dim}-seconds "
                    f"of bucket above the sustained rate, but the bucket holds at most "
                    f"{b.capacity:.0f}; ask for less or shorter",
                    ErrorCode.OUT_OF_RANGE,
                )
    _key(eng, e)
    if e.lease_class is not None:
        if not isinstance(e.lease_class, LeaseClass):
            raise bad("lease_class", "allowed: interactive, batch, opportunistic")
        if e.lease_class.rank > c.spec.lease_class.rank:
            raise bad(
                "lease_class",
                f"campaign {e.campaign!r} is {c.spec.lease_class.value}; a request may not "
                f"ask for a higher class ({e.lease_class.value})",
                ErrorCode.FAILED_PRECONDITION,
            )


def _key(eng: Engine, e: RequestLease) -> None:
    key = e.idempotency_key
    if not isinstance(key, str):
        raise bad("idempotency_key", "must be a string")
    if not key:
        return
    if len(key) > 128 or not key.isprintable():
        raise bad("idempotency_key", f"at most 128 printable characters (got {len(key)})")
    rec = eng.key_record(e.campaign, key)
    if rec is None:
        return
    if rec.fingerprint != request_fingerprint(e):
        raise bad(
            "idempotency_key",
            f"key {key!r} was used for another request ({rec.request_id}) of campaign "
            f"{e.campaign!r} with a different size, duration, class or labels; use a new "
            "key for a new request",
        )
    raise bad(
        "idempotency_key",
        f"request {rec.request_id} already carries key {key!r}: this is a retry of it",
        ErrorCode.ALREADY_EXISTS,
    )


def _cancel(eng: Engine, e: CancelRequest) -> None:
    if not isinstance(e.also, tuple) or not all(isinstance(r, str) for r in e.also):
        raise bad("also", "a tuple of request ids")
    ids = (e.request_id, *e.also)
    if len(set(ids)) != len(ids):
        raise bad("also", "each request may be withdrawn once")
    for rid in e.also:
        if rid not in eng.pending:
            raise bad("also", f"no queued request {rid!r}", ErrorCode.NOT_FOUND)
    if e.request_id not in eng.pending:
        if e.request_id in eng.leases or e.request_id in eng.ended:
            raise bad(
                "request_id",
                f"request {e.request_id} was already granted; release the lease instead",
                ErrorCode.FAILED_PRECONDITION,
            )
        raise bad("request_id", f"no queued request {e.request_id!r}", ErrorCode.NOT_FOUND)


def _renew(eng: Engine, e: Renew) -> None:
    if e.lease_id not in eng.leases:
        raise unknown_lease(eng.ended, e.lease_id)
    _duration(eng, e.duration_s)
    _alive(eng, e.lease_id, e.at)


def _release(eng: Engine, e: Release) -> None:
    if e.lease_id not in eng.leases:
        raise unknown_lease(eng.ended, e.lease_id)
    _alive(eng, e.lease_id, e.at)


def _alive(eng: Engine, lease_id: str, at: float) -> None:
    # The clock advances to ``at`` before the event applies; a lease whose expiry or
    # revocation falls before then would be gone by the time the handler runs.
    ls = eng.leases[lease_id]
    end = ls.expires_at
    if ls.preempt_deadline is not None:
        end = min(end, ls.preempt_deadline)
    if at >= end:
        what = "expires" if end == ls.expires_at else "is revoked"
        raise bad(
            "lease_id",
            f"lease {lease_id} {what} at {end}, before this call at {at}; request a new lease",
            ErrorCode.FAILED_PRECONDITION,
        )


def _node(eng: Engine, e: NodeReady | NodeLost) -> None:
    i = eng.pool.index.get(e.node)
    if i is None:
        raise bad("node", f"unknown node {e.node!r}", ErrorCode.NOT_FOUND)
    power = eng.pool.nodes[i].power
    if isinstance(e, NodeReady) and power not in (NodeState.BOOTING, NodeState.DOWN):
        raise bad(
            "node",
            f"node {e.node} is {power.value}, not booting",
            ErrorCode.FAILED_PRECONDITION,
        )
    if isinstance(e, NodeLost) and power is NodeState.DOWN:
        raise bad("node", f"node {e.node} is already down", ErrorCode.FAILED_PRECONDITION)


def _lease_lost(eng: Engine, e: LeaseLost) -> None:
    if not isinstance(e.lease_id, str) or not e.lease_id:
        raise bad("lease_id", "must be a lease id such as 'L7'")
    if not isinstance(e.cause, str) or not e.cause:
        raise bad("cause", "must say why the lease's resources are gone")


def _allocation_ready(eng: Engine, e: AllocationReady) -> None:
    if not isinstance(e.lease_id, str) or not e.lease_id:
        raise bad("lease_id", "must be a lease id such as 'L7'")
    a = e.allocation
    if not isinstance(a, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in a.items()
    ):
        raise bad("allocation", "must map names to strings (e.g. {'job_id': '42'})")


def _meter(eng: Engine, e: Meter) -> None:
    c = _campaign(eng, e.campaign)
    if e.dim not in dims.RATE:
        raise bad("dim", f"{e.dim!r} is not metered; allowed: {', '.join(dims.RATE)}")
    if e.dim not in c.rate_buckets:
        raise bad("dim", f"campaign {e.campaign!r} has no envelope for {e.dim}")
    a = e.amount
    if isinstance(a, bool) or not isinstance(a, int | float) or not math.isfinite(a) or a <= 0:
        raise bad("amount", f"must be a finite number > 0 (got {a!r})")


_VALIDATORS: dict[type, Callable[[Engine, Any], None]] = {
    CreateCampaign: _create,
    UpdateCampaign: _update,
    RequestLease: _request,
    CancelRequest: _cancel,
    Renew: _renew,
    Release: _release,
    NodeReady: _node,
    NodeLost: _node,
    LeaseLost: _lease_lost,
    AllocationReady: _allocation_ready,
    Meter: _meter,
}
