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

from bursar.broker import (
    admission,
    dims,
    elastic,
    isolation,
    policy_change,
    power_budget,
    shape,
)
from bursar.broker.envelope import CampaignSpec, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    AllocationReady,
    ApplyPolicy,
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
from bursar.broker.policy import Enforcement, PolicySpec
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


def validate(eng: Engine, event: Event) -> shape.Demand | None:
    """Raise ``RequestError`` if ``event`` may not apply to ``eng`` now; change nothing.
    Returns a ``RequestLease``'s demand, resolved against the pool in the checking (the
    fold uses it rather than resolving it again); None for any other event."""
    at = event.at
    if not isinstance(at, int | float) or not math.isfinite(at):
        raise bad("at", f"time must be a finite number of seconds (got {at!r})")
    if at < eng.now:
        raise bad("at", f"time {at} is before the engine's clock {eng.now}; time never goes back")
    validator = _VALIDATORS.get(type(event))
    if validator is not None:
        return validator(eng, event)
    return None


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
    specs = [c.spec for n, c in eng.campaigns.items() if n != spec.name] + [spec]
    for _, message in power_budget.problems(eng.pool_spec, eng.policy, specs):
        raise bad("spec.envelopes", message, ErrorCode.FAILED_PRECONDITION)
    _strands(eng, spec)


def _watts(
    eng: Engine, spec: CampaignSpec, where: str, watts: float, declared: float | None
) -> None:
    """A lease's watts above the campaign's power burst, or above what the cap leaves
    beside the warm nodes' idle draw and the others' power guarantees, would wait for good."""
    budget = eng.watts
    if not budget.leased or watts <= 0:
        return
    how = "declared" if declared is not None else "its size draws by default"
    env = spec.envelopes.get(dims.POWER)
    if env is not None and watts > env.burst + EPS:
        raise bad(
            f"{where}.power",
            f"{watts:g} W ({how}) is above campaign {spec.name!r}'s power burst "
            f"({env.burst:g} W) and can never be granted; declare a lower power limit "
            "(size.power) or ask for less",
            ErrorCode.OUT_OF_RANGE,
        )
    room = budget.room_for(eng.pool_spec, spec.name)
    if room is not None and watts > room + EPS:
        raise bad(
            f"{where}.power",
            f"{watts:g} W ({how}) can never be granted under the power cap: it leaves "
            f"{room:g} W beside the nodes' idle draw and the other campaigns' power "
            "guarantees; declare a lower power limit (size.power) or ask for less",
            ErrorCode.OUT_OF_RANGE,
        )


def _guarantors(eng: Engine, name: str, i: int, most: int = 3) -> str:
    """The other campaigns holding guarantees in dimension ``i``, largest first."""
    held = sorted(
        ((-c.guarantee[i], n) for n, c in eng.campaigns.items() if n != name and c.guarantee[i]),
    )
    named = [f"{n!r} ({-g:g})" for g, n in held[:most]]
    if len(held) > most:
        named.append(f"{len(held) - most} more")
    return ", ".join(named) or "none"


def _strands(eng: Engine, spec: CampaignSpec) -> None:
    """An envelope change may not leave a waiting request that could then never be granted
    (above its campaign's new burst, or above what the new guarantees leave it): it would
    wait for good. The admin withdraws such requests first, or chooses other envelopes."""
    if not eng.pending:
        return
    specs = {n: c.spec for n, c in eng.campaigns.items()}
    specs[spec.name] = spec
    burst = spec.placed("burst")
    rooms: dict[str, dims.Vec] = {}
    totals = isolation.kept(specs.values())
    stranded: list[str] = []
    for p in eng.pending.values():
        room = rooms.get(p.campaign)
        if room is None:
            s = specs[p.campaign]
            room = isolation.ceiling(s, totals, eng.pool.capacity)
            if s.name == spec.name:
                room = dims.vmin(room, burst)
            rooms[p.campaign] = room
        if not dims.fits(p.size, room):
            stranded.append(f"{p.id} (campaign {p.campaign!r}, {dims.as_dict(p.size)})")
    if stranded:
        shown = ", ".join(stranded[:5]) + (
            f" and {len(stranded) - 5} more" if len(stranded) > 5 else ""
        )
        raise bad(
            "spec.envelopes",
            f"this change would leave {len(stranded)} waiting request(s) that could then never "
            f"be granted: {shown}; withdraw them first, or keep guarantees and bursts that "
            "leave room for them",
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


def _request(eng: Engine, e: RequestLease) -> shape.Demand:
    c = _campaign(eng, e.campaign)
    sized, where = e.size, "size"
    if e.intent is not None:
        _intent(eng, c, e)
        sized, where = e.intent.min, "intent.min"
    shaped = isinstance(e.shape, shape.Shape) and (
        bool(e.shape.per_node) or e.shape.exclusive is True
    )
    if not isinstance(sized, Mapping) or (not sized and not shaped):
        raise bad(where, "give a size per dimension, e.g. {'gpu': 8}")
    declared = sized.get(dims.POWER) if e.intent is None else None
    if declared is not None:
        if (
            isinstance(declared, bool)
            or not isinstance(declared, int | float)
            or not math.isfinite(declared)
            or declared < 0
        ):
            raise bad(f"{where}.power", f"must be a finite number of watts >= 0 (got {declared!r})")
        sized = {d: x for d, x in sized.items() if d != dims.POWER}
    for d, x in sized.items():
        if d in dims.RATE:
            raise bad(where, f"{d} is a metered rate dimension: use Meter, not a lease")
        if d not in dims.PLACED:
            raise bad(where, f"unknown dimension {d!r}; allowed: {', '.join(dims.PLACED)}")
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            raise bad(f"{where}.{d}", f"must be a finite number (got {x!r})")
        if x < 0:
            raise bad(f"{where}.{d}", f"must not be negative (got {x})")
        if x > 0 and d not in c.spec.envelopes:
            raise bad(
                f"{where}.{d}", f"campaign {e.campaign!r} has no envelope for {d}; ask the admin"
            )
    demand = shape.resolve(sized, e.shape, eng.pool.kinds)
    size = demand.size
    if dims.is_zero(size):
        raise bad(where, "at least one dimension must be greater than zero")
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
                f"{where}.{dim}",
                f"{size[i]} is larger than the whole pool ({eng.pool.capacity[i]})",
                ErrorCode.OUT_OF_RANGE,
            )
        if size[i] > c.burst[i] + EPS:
            raise bad(
                f"{where}.{dim}",
                f"{size[i]} is above campaign {e.campaign!r}'s burst ceiling ({c.burst[i]}) "
                "and can never be granted",
                ErrorCode.OUT_OF_RANGE,
            )
    # Only campaigns holding a guarantee count; the ledger keeps the answer until a
    # guarantee changes, so a request costs a look-up, not a sum over every campaign.
    room = eng.ledger.ceiling(c.spec, eng.pool.capacity)
    for i, dim in enumerate(dims.PLACED):
        if size[i] > room[i] + EPS:
            raise bad(
                f"{where}.{dim}",
                f"{size[i]:g} can never be granted beside the other campaigns' guarantees: "
                f"the pool has {eng.pool.capacity[i]:g} and "
                f"{eng.pool.capacity[i] - room[i]:g} of it is guaranteed to "
                f"{_guarantors(eng, c.spec.name, i)}; ask for at most {room[i]:g}, or ask the "
                "admin to lower a guarantee",
                ErrorCode.OUT_OF_RANGE,
            )
    shape.check_pool(demand, eng.pool.kinds)
    _watts(eng, c.spec, where, eng.watts.watts_of(declared, size, eng._primary), declared)
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
    return demand


def _number(where: str, x: object, lo: float, hi: float, lo_open: bool, hi_open: bool) -> float:
    """``x`` as a float in the range, or an error naming the field and the range."""
    ok = not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)
    if ok:
        v = float(x)  # type: ignore[arg-type]
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        top = "inf" if math.isinf(hi) else f"{hi:g}"
        raise bad(where, f"must be a number in {left}{lo:g}, {top}{right} (got {x!r})")
    return float(x)  # type: ignore[arg-type]


_INF = math.inf


def _intent(eng: Engine, c: CampaignState, e: RequestLease) -> None:
    """An elastic intent (``broker/elastic.py``): every field in its range, min <= max in
    the same dimensions, max - min a whole number of steps, a speedup model that covers
    min to max."""
    it = e.intent
    if not isinstance(it, elastic.Intent):
        raise bad("intent", "must be an Intent")
    if e.size and dict(e.size) != dict(it.min):
        raise bad("size", "with an intent, leave the size empty (intent.min is the size)")
    if c.spec.preemptible:
        raise bad(
            "intent",
            f"campaign {e.campaign!r} is preemptible: its leases are reclaimable already and "
            "cannot be elastic; ask for a fixed size",
            ErrorCode.FAILED_PRECONDITION,
        )
    for where, m in (("intent.min", it.min), ("intent.max", it.max), ("intent.step", it.step)):
        if not isinstance(m, Mapping):
            raise bad(where, "units per placed dimension, e.g. {'gpu': 8}")
        for d, x in m.items():
            if d not in dims.PLACED:
                raise bad(where, f"unknown dimension {d!r}; allowed: {', '.join(dims.PLACED)}")
            _number(f"{where}.{d}", x, 0, _INF, False, True)
    if not it.max:
        raise bad("intent.max", "give the most the lease may hold, e.g. {'gpu': 64}")
    if set(it.max) != set(it.min):
        raise bad("intent.max", f"must name the same dimensions as intent.min ({sorted(it.min)})")
    for d, x in it.max.items():
        if x < it.min[d]:
            raise bad(f"intent.max.{d}", f"must be at least intent.min.{d} ({it.min[d]:g})")
        i = dims.PLACED.index(d)
        if x > eng.pool.capacity[i] + EPS:
            raise bad(
                f"intent.max.{d}",
                f"{x:g} is larger than the whole pool ({eng.pool.capacity[i]:g})",
                ErrorCode.OUT_OF_RANGE,
            )
    step = elastic.resolve_step(it)
    grows = {d: it.max[d] - it.min.get(d, 0.0) for d in it.max}
    if any(g > 0 for g in grows.values()):
        if not step or any(v <= 0 for v in step.values()):
            raise bad("intent.step", "must hold at least one dimension > 0")
        name = elastic.scale_dim(step)
        n = grows[name] / step[name]
        # A tiny step makes the count overflow to inf (round() would raise): not whole.
        if not math.isfinite(n) or abs(n - round(n)) > 1e-9 or round(n) < 1:
            raise bad(
                "intent.max",
                f"max - min of {name} ({grows[name]:g}) is not a whole number of steps "
                f"({step[name]:g})",
            )
        for d, g in grows.items():
            if abs(g - round(n) * step.get(d, 0.0)) > 1e-6:
                raise bad(
                    "intent.step",
                    f"{round(n)} steps of {dims.as_dict(dims.vec(step))} do not lead from min to "
                    f"max in {d} ({g:g}); give a step that does",
                )
        for d, v in step.items():
            # A step below one unit (1e-300) is within the slack of zero, which is no step:
            # a lease of 1e300 such steps would be walked one step at a time.
            if abs(v - round(v)) > 1e-9 or round(v) < 1:
                raise bad(
                    "intent.step",
                    f"{d} step {v:g} is not a whole number of units; give intent.step",
                )
    else:
        name = elastic.scale_dim(it.min) if any(v > 0 for v in it.min.values()) else "gpu"
    if (it.amdahl is None) == (not it.curve):
        raise bad("intent.speedup", "give exactly one of amdahl_serial_fraction and curve")
    if it.amdahl is not None:
        _number("intent.speedup.amdahl_serial_fraction", it.amdahl, 0, 1, False, False)
    else:
        if len(it.curve) > elastic.MAX_CURVE_POINTS:
            raise bad("intent.speedup.curve", f"at most {elastic.MAX_CURVE_POINTS} points")
        last = 0.0
        for k, (u, t) in enumerate(it.curve):
            _number(f"intent.speedup.curve.points[{k}].units", u, 0, _INF, True, True)
            _number(f"intent.speedup.curve.points[{k}].throughput", t, 0, _INF, True, True)
            if u <= last:
                raise bad("intent.speedup.curve", "unit counts must be strictly increasing")
            last = u
        lo, hi = it.min.get(name, 0.0), it.max.get(name, 0.0)
        if it.curve[0][0] > lo + EPS or it.curve[-1][0] < hi - EPS:
            raise bad(
                "intent.speedup.curve",
                f"the points cover {it.curve[0][0]:g} to {it.curve[-1][0]:g} units of {name}; "
                f"they must span intent.min to intent.max ({lo:g} to {hi:g})",
            )
    _sizes(it, name)
    _number("intent.remaining_work", it.remaining_work, 0, _INF, True, True)
    _number("intent.deadline_s", it.deadline_s, 0, _INF, True, True)
    _number("intent.value", it.value, 0, _INF, True, True)
    if not isinstance(it.decay, elastic.Decay) or not isinstance(it.decay.kind, elastic.DecayKind):
        raise bad("intent.decay.kind", "allowed: step, linear, exponential")
    if it.decay.kind is elastic.DecayKind.STEP:
        if it.decay.window_s != 0:
            raise bad("intent.decay.window_s", "must be 0 with a step decay")
    else:
        _number("intent.decay.window_s", it.decay.window_s, 0, _INF, True, True)
    if len(it.degrade) > elastic.MAX_MODES:
        raise bad("intent.degrade", f"at most {elastic.MAX_MODES} modes")
    names = {elastic.FULL}
    for k, m in enumerate(it.degrade):
        where = f"intent.degrade[{k}]"
        if not isinstance(m.name, str) or not 1 <= len(m.name) <= 63 or not m.name.isprintable():
            raise bad(f"{where}.name", "1 to 63 printable characters")
        if m.name in names:
            raise bad(f"{where}.name", f"{m.name!r} is taken (names are unique, not 'full')")
        names.add(m.name)
        _number(f"{where}.work_factor", m.work_factor, 0, 1, True, False)
        _number(f"{where}.value_factor", m.value_factor, 0, 1, False, False)


def _sizes(it: elastic.Intent, name: str) -> None:
    """The speed model and the sizes the job can use: min must be one of them (the
    lease starts there)."""
    if it.speed_model not in elastic.SPEED_MODELS:
        raise bad("intent.speed_model", f"allowed: {', '.join(elastic.SPEED_MODELS)}")
    rule = it.size_rule
    if rule and rule != elastic.POWERS_OF_TWO:
        batch = rule.removeprefix(elastic.DIVISORS_OF)
        if batch == rule or not batch.isdigit() or int(batch) < 1:
            raise bad(
                "intent.size_rule",
                f"allowed: {elastic.POWERS_OF_TWO}, {elastic.DIVISORS_OF}B (B a whole number >= 1)",
            )
    if it.sizes is not None:
        if not 1 <= len(it.sizes) <= elastic.MAX_CURVE_POINTS:
            raise bad("intent.sizes", f"1 to {elastic.MAX_CURVE_POINTS} sizes")
        for k, u in enumerate(it.sizes):
            _number(f"intent.sizes[{k}]", u, 0, _INF, True, True)
    lo = it.min.get(name, 0.0)
    if not elastic.size_ok(it, lo):
        raise bad("intent.min", f"{lo:g} {name} is not among the sizes the intent allows")


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
    _not_a_step(eng, e.lease_id)
    _duration(eng, e.duration_s)
    _alive(eng, e.lease_id, e.at)


def _release(eng: Engine, e: Release) -> None:
    if e.lease_id not in eng.leases:
        raise unknown_lease(eng.ended, e.lease_id)
    _not_a_step(eng, e.lease_id)
    _alive(eng, e.lease_id, e.at)


def _not_a_step(eng: Engine, lease_id: str) -> None:
    owner = eng.elastic.parent_of.get(lease_id)
    if owner is not None:
        raise bad(
            "lease_id",
            f"{lease_id} is an extent of elastic lease {owner}, not a lease of its own; "
            f"renew or release {owner}",
            ErrorCode.NOT_FOUND,
        )


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


def _apply_policy(eng: Engine, e: ApplyPolicy) -> None:
    if not isinstance(e.policy, PolicySpec):
        raise bad("policy", f"expected a policy spec, got {type(e.policy).__name__}")
    problems = policy_change.problems(eng.policy, e.policy, eng.pool.capacity)
    if problems:
        key, message = problems[0]
        also = "".join(f"; also policy.{k}: {m}" for k, m in problems[1:])
        raise bad(f"policy.{key}", message + also)
    specs = [c.spec for c in eng.campaigns.values()]
    for key, message in power_budget.problems(eng.pool_spec, e.policy, specs):
        raise bad(key, message, ErrorCode.FAILED_PRECONDITION)


_VALIDATORS: dict[type, Callable[[Engine, Any], shape.Demand | None]] = {
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
    ApplyPolicy: _apply_policy,
}
