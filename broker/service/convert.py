"""Proto ↔ engine values. Pure functions, no I/O; the servicer calls them both ways.

Every request is first checked field by field against the wire's contract
(:func:`check_request`, which the servicer runs on every call of every RPC before its
handler): each number is finite, non-negative and bounded, each integer bounded, each
enum number known, each list and map bounded, each string and map key within its
documented character set and length. Only then does anything compare or add the values,
so no malformed value can reach arithmetic or a comparison and fail there. What needs
the engine's state (relations between fields, what the pool and the campaign allow) is
the engine's check, so that each rule has one home.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from google.protobuf import descriptor
from google.protobuf.message import Message

from bursar.broker import codec, dims, elastic
from bursar.broker.backends.base import active_at_grant
from bursar.broker.decisions import (
    Activated,
    Allocated,
    Decision,
    Expired,
    Granted,
    LeasePath,
    PreemptWarned,
    Released,
    Renewed,
    Resized,
    ResizeWarned,
    Revoked,
)
from bursar.broker.engine import Engine
from bursar.broker.envelope import CAMPAIGN_NAME, CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import RequestLease
from bursar.broker.lease import EndedLease, Lease, LeaseState
from bursar.broker.pending import Pending
from bursar.broker.reasons import Reason
from bursar.broker.shape import MAX_NODES, Shape
from bursar.broker.supply import Supply
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = [
    "MAX_ID_LEN",
    "MAX_LABELS",
    "MAX_WAIT_S",
    "AcquireArgs",
    "acquire_from_proto",
    "campaign_to_proto",
    "check_id",
    "check_labels",
    "check_number",
    "check_pending_filters",
    "decision_kind_to_proto",
    "decision_record",
    "granted_lease_to_proto",
    "lease_by_id",
    "lease_class_from_proto",
    "lease_class_to_proto",
    "lease_event",
    "lease_to_proto",
    "live_lease_to_proto",
    "path_to_proto",
    "pending_places",
    "pending_to_proto",
    "reason_to_proto",
    "revoke_reason",
    "shape_from_proto",
    "snapshot_event",
    "spec_from_proto",
    "spec_to_proto",
    "state_to_proto",
    "supply_to_proto",
]

MAX_ID_LEN = 64
MAX_LABELS = 16
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 256

MAX_WAIT_S = 3600.0
"""Longest a blocking Acquire may wait (AcquireRequest.timeout_s)."""

_STATE = {s: pb.LeaseState.Value(f"LEASE_STATE_{s.name}") for s in LeaseState}
_PATH = {p: pb.LeasePath.Value(f"LEASE_PATH_{p.name}") for p in LeasePath}
_CLASS = {c: pb.LeaseClass.Value(f"LEASE_CLASS_{c.name}") for c in LeaseClass}
_CLASS_BACK = {v: k for k, v in _CLASS.items()}
_REASON = {r: pb.ReasonCode.Value(f"REASON_{r.value}") for r in Reason}


def _bad(field: str, message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_ARGUMENT, field, message)


# --------------------------------------------------------------------------- the wire's contract
#
# Checked in one pass over the request, before its handler runs: for every field, first
# its type (a finite number, a known enum number, a string of printable characters),
# then its range (non-negative and bounded; a name in its character set and length).
# Relations between fields are the engine's (guarantee <= burst, min <= max, a size
# within the pool and the campaign's envelope): they compare values already checked here.
# Integers need nothing here: the wire's are unsigned, a journal position past the end
# finds nothing, and counts (nodes, limit) are bounded where they are read.

MAX_NUMBER = 1e15
"""The largest number a request may carry. Every number on the wire is an amount of a
dimension, a rate, unit-seconds, a duration, a fraction or a time: none is negative and
none comes near this; below it, sums over every campaign and lease stay finite."""

MAX_ENTRIES = 1000
"""The most elements of one list or map of a request (stricter limits are per field)."""

MAX_TEXT = 1024
"""The longest string a request may carry, whole documents (a policy) aside."""

MIN_NUMBER = 1e-9
"""The smallest number but zero a request may carry: the broker compares amounts with
this slack (an amount below it is none), and dividing by a smaller one could overflow."""

SHOWN = 32
"""The most characters of a refused name that an error quotes."""

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
"""A lease or request id (the broker's are "L7"), matched whole."""

LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
"""A label key (``engine``, ``parsl_job``, ``bursar.io/lease-id``), matched whole."""

SIZE_RULE = re.compile(
    re.escape(elastic.POWERS_OF_TWO) + "|" + re.escape(elastic.DIVISORS_OF) + r"[1-9][0-9]{0,14}"
)
"""An intent's size rule, matched whole: the batch is bounded as every number is (below
:data:`MAX_NUMBER`), so that dividing by it stays exact."""


def shown(value: str, limit: int = SHOWN) -> str:
    """``value`` as an error may quote it: escaped as a Python literal (a control character
    shows as ``\\x00``), and cut to ``limit`` characters with its length noted."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


@dataclass(frozen=True, slots=True)
class Text:
    """What a string field, or the keys of a map, may hold."""

    what: str
    """What the value is, as a refusal names it ("campaign name")."""
    allowed: str
    """The documented rule, as a refusal states it."""
    pattern: re.Pattern[str] | None = None
    """Matched whole; None (and no ``choices``): any printable characters."""
    choices: tuple[str, ...] = ()
    most: int = MAX_TEXT
    optional: bool = True
    """May be empty: the field's default (the caller's own campaign, every lease...)."""
    document: bool = False
    """A whole document (JSON, TOML) that its own parser checks: any characters, as long
    as the request size limit allows."""

    def check(self, value: str, where: str) -> None:
        if not value:
            if not self.optional:
                raise _bad(where, f"required: a {self.what} ({self.allowed})")
            return
        if self.document:
            return
        if self.choices:
            ok = value in self.choices
        else:
            # isprintable() is False for control and format characters (NUL, newline,
            # bidi overrides) and for separators other than the space.
            ok = len(value) <= self.most and value.isprintable()
            if ok and self.pattern is not None:
                ok = self.pattern.fullmatch(value) is not None
        if not ok:
            bad = "unknown" if self.choices else "invalid"
            raise _bad(where, f"{bad} {self.what} {shown(value)}; allowed: {self.allowed}")


CAMPAIGN = Text(
    "campaign name",
    "1 to 63 characters: lower-case letters, digits, '.', '_' or '-', starting with a letter "
    "or a digit",
    CAMPAIGN_NAME,
)
LEASE_ID = Text(
    "lease id",
    f"1 to {MAX_ID_LEN} characters: letters, digits, '.', '_', ':' or '-', starting with a "
    "letter or a digit (such as 'L7')",
    ID_PATTERN,
    optional=False,
)
REQUEST_ID = Text("request id", LEASE_ID.allowed, ID_PATTERN)
IDEMPOTENCY_KEY = Text("idempotency key", "at most 128 printable characters", most=128)
DIMENSION = Text("dimension", ", ".join(dims.ALL), choices=dims.ALL)
LEASED = Text("dimension", ", ".join(dims.ENVELOPED), choices=dims.ENVELOPED, optional=False)
"""A size's or an envelope's key: power (watts) too."""
TEXT = Text("text", f"at most {MAX_TEXT} printable characters")

_STRINGS: dict[str, Text] = {
    "bursar.v1.AcquireRequest.campaign": CAMPAIGN,
    "bursar.v1.AcquireRequest.idempotency_key": IDEMPOTENCY_KEY,
    "bursar.v1.CampaignSpec.name": replace(CAMPAIGN, optional=False),
    "bursar.v1.DegradeMode.name": Text("mode name", "1 to 63 printable characters", most=63),
    "bursar.v1.Intent.size_rule": Text(
        "size rule",
        f"{elastic.POWERS_OF_TWO}, {elastic.DIVISORS_OF}B (B a whole number from 1 to "
        "999999999999999)",
        SIZE_RULE,
    ),
    "bursar.v1.RenewRequest.lease_id": LEASE_ID,
    "bursar.v1.ReleaseRequest.lease_id": LEASE_ID,
    "bursar.v1.GetLeaseRequest.lease_id": LEASE_ID,
    "bursar.v1.ListLeasesRequest.campaign": CAMPAIGN,
    "bursar.v1.ListPendingRequest.campaign": CAMPAIGN,
    "bursar.v1.ListPendingRequest.request_id": REQUEST_ID,
    "bursar.v1.ListPendingRequest.idempotency_key": IDEMPOTENCY_KEY,
    "bursar.v1.WatchRequest.lease_ids": LEASE_ID,
    "bursar.v1.WatchRequest.campaign": CAMPAIGN,
    "bursar.v1.SupplyRequest.dim": DIMENSION,
    "bursar.v1.WatchSupplyRequest.dim": DIMENSION,
    "bursar.v1.MeterRequest.campaign": CAMPAIGN,
    "bursar.v1.MeterRequest.dim": Text(
        "metered dimension", ", ".join(dims.RATE), choices=dims.RATE, optional=False
    ),
    "bursar.v1.ListDecisionsRequest.campaign": CAMPAIGN,
    "bursar.v1.ListDecisionsRequest.lease_id": REQUEST_ID,
    "bursar.v1.GetCampaignRequest.name": replace(CAMPAIGN, optional=False),
    "bursar.v1.RotateTokenRequest.campaign": replace(CAMPAIGN, optional=False),
    "bursar.v1.RevokeLeaseRequest.lease_id": LEASE_ID,
    "bursar.v1.RevokeLeaseRequest.reason": TEXT,
    "bursar.v1.ApplyPolicyRequest.spec_json": Text("policy", "JSON", document=True),
    "bursar.v1.ApplyPolicyRequest.toml": Text("policy", "TOML", document=True),
}
"""Every string field of every request, by its full name (a test holds the table to the
proto); the elements of a repeated one alike."""

_MAP_KEYS: dict[str, Text] = {
    "bursar.v1.AcquireRequest.size": LEASED,
    "bursar.v1.AcquireRequest.labels": Text(
        "label key",
        f"1 to {MAX_LABEL_KEY} characters: letters, digits, '.', '_', '/' or '-', starting "
        "with a letter or a digit",
        LABEL_KEY,
        optional=False,
    ),
    "bursar.v1.Shape.per_node": replace(DIMENSION, optional=False),
    "bursar.v1.Intent.min": replace(DIMENSION, optional=False),
    "bursar.v1.Intent.max": replace(DIMENSION, optional=False),
    "bursar.v1.Intent.step": replace(DIMENSION, optional=False),
    "bursar.v1.CampaignSpec.envelopes": LEASED,
}
"""The keys of every map field of every request, by the map's full name."""

_MAP_VALUES: dict[str, Text] = {
    "bursar.v1.AcquireRequest.labels": Text(
        "label value", f"at most {MAX_LABEL_VALUE} printable characters", most=MAX_LABEL_VALUE
    ),
}
"""The values of every map of strings of every request."""

_PATHS: dict[str, str] = {
    "bursar.v1.WhatIfRequest.acquire": "",
    "bursar.v1.WhatIfRequest.envelope": "spec",
}
"""Fields whose contents are named as another RPC names them: a WhatIf's acquire as
Acquire's request, its envelope as UpdateCampaign's spec (a WhatIf refuses as they do)."""

FD = descriptor.FieldDescriptor


def check_request(msg: Message) -> None:
    """Raise INVALID_ARGUMENT, naming the field, for the first value of ``msg`` outside the
    wire's contract (see the section's comment); change nothing."""
    _check_message(msg, "")


def _check_message(msg: Message, path: str) -> None:
    for fd in msg.DESCRIPTOR.fields:
        where = _PATHS.get(fd.full_name, f"{path}.{fd.name}" if path else fd.name)
        value = getattr(msg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            _check_map(fd, value, where)
        elif fd.is_repeated:
            if len(value) > MAX_ENTRIES:
                raise _bad(where, f"at most {MAX_ENTRIES} entries (got {len(value)})")
            for i, v in enumerate(value):
                _check_value(fd, v, f"{where}[{i}]")
        elif fd.message_type is None or msg.HasField(fd.name):
            _check_value(fd, value, where)


def _check_map(fd: descriptor.FieldDescriptor, value: Any, where: str) -> None:
    if len(value) > MAX_ENTRIES:
        raise _bad(where, f"at most {MAX_ENTRIES} entries (got {len(value)})")
    keys = _MAP_KEYS.get(fd.full_name, replace(TEXT, optional=False))
    vfd = fd.message_type.fields_by_name["value"]
    for k in value:
        # The key first: it names the value's field in what follows.
        keys.check(k, where)
        _check_value(vfd, value[k], f"{where}.{k}", _MAP_VALUES.get(fd.full_name))


def _check_value(
    fd: descriptor.FieldDescriptor, v: Any, where: str, text: Text | None = None
) -> None:
    t = fd.type
    if t in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        if not math.isfinite(v):
            raise _bad(where, f"must be a finite number (got {v!r})")
        if v < 0:
            raise _bad(where, f"must not be negative (got {v!r})")
        if v > MAX_NUMBER or 0 < v < MIN_NUMBER:
            raise _bad(where, f"must be 0 or from {MIN_NUMBER:g} to {MAX_NUMBER:g} (got {v!r})")
    elif t == FD.TYPE_ENUM:
        if fd.enum_type.values_by_number.get(v) is None:
            names = ", ".join(x.name for x in fd.enum_type.values)
            raise _bad(where, f"unknown {fd.enum_type.name} {v}; allowed: {names}")
    elif t == FD.TYPE_STRING:
        (text or _STRINGS.get(fd.full_name, TEXT)).check(v, where)
    elif t == FD.TYPE_MESSAGE:
        _check_message(v, where)


def state_to_proto(s: LeaseState) -> int:
    return _STATE[s]


def path_to_proto(p: LeasePath) -> int:
    return _PATH[p]


def reason_to_proto(r: Reason | None) -> int:
    return pb.REASON_UNSPECIFIED if r is None else _REASON[r]


def lease_class_to_proto(c: LeaseClass) -> int:
    return _CLASS[c]


def decision_kind_to_proto(kind: str) -> int:
    """The wire's DecisionKind for a decision's ``kind`` ("grant", "queue", ...)."""
    return pb.DecisionKind.Value(f"DECISION_KIND_{kind.upper()}")


def decision_record(seq: int, d: Mapping[str, Any]) -> pb.DecisionRecord:
    """A decision as the journal records it (its dict form), as ListDecisions sends it."""
    reason = d.get("reason")
    return pb.DecisionRecord(
        seq=seq,
        at=d.get("at", 0.0),
        kind=decision_kind_to_proto(d["kind"]),
        campaign=d.get("campaign", ""),
        lease_id=d.get("lease_id") or d.get("request_id") or "",
        reason=reason_to_proto(Reason(reason) if reason else None),
        json=codec.dumps(d),
    )


def lease_class_from_proto(value: int, field: str = "lease_class") -> LeaseClass | None:
    """None for UNSPECIFIED (the campaign's class); INVALID_ARGUMENT for unknown numbers."""
    if value == pb.LEASE_CLASS_UNSPECIFIED:
        return None
    try:
        return _CLASS_BACK[value]
    except KeyError:
        raise _bad(field, f"unknown lease class {value}; allowed: 0 to 3") from None


def check_id(value: str, field: str) -> str:
    LEASE_ID.check(value, field)
    return value


def check_number(value: float, field: str, *, low: float = 0.0, high: float = math.inf) -> float:
    if not math.isfinite(value) or value < low or value > high:
        raise _bad(field, f"must be a finite number in [{low:g}, {high:g}] (got {value!r})")
    return value


MAX_REVOKE_REASON = 200
"""Longest reason Admin.RevokeLease accepts (it is journaled and sent to the holder)."""


def revoke_reason(reason: str) -> str:
    """Admin.RevokeLease's reason, stripped: required, printable, bounded."""
    reason = reason.strip()
    if not reason:
        raise _bad(
            "reason",
            "required: say why the lease is revoked (it is journaled and sent to its holder)",
        )
    if len(reason) > MAX_REVOKE_REASON or not reason.isprintable():
        raise _bad(
            "reason", f"at most {MAX_REVOKE_REASON} printable characters (got {len(reason)})"
        )
    return reason


def check_pending_filters(request_id: str, key: str) -> None:
    """ListPending's request id and idempotency key filters."""
    for value, name in ((request_id, "request_id"), (key, "idempotency_key")):
        if len(value) > 128 or not value.isprintable():
            raise _bad(name, "at most 128 printable characters")


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels as a dict (each key and value was checked with the request)."""
    if len(labels) > MAX_LABELS:
        raise _bad("labels", f"at most {MAX_LABELS} labels (got {len(labels)})")
    return dict(labels)


def check_size(size: Mapping[str, float], shape: Shape | None = None) -> dict[str, float]:
    """The size as a dict; it may be empty only when the shape gives it (per_node or
    exclusive)."""
    if not size and (shape is None or not (shape.per_node or shape.exclusive)):
        raise _bad("size", "give a size per dimension, e.g. {'gpu': 8}")
    return dict(size)


def shape_from_proto(req: pb.AcquireRequest) -> Shape | None:
    """The request's shape; None when it has none or every field is at its default
    (total units), so that such a request journals exactly as one from before shapes.
    Ranges that need the pool (node counts, what fits a node) are the engine's checks."""
    if not req.HasField("shape"):
        return None
    s = req.shape
    if s.nodes > MAX_NODES:
        raise _bad("shape.nodes", f"must be from 0 to {MAX_NODES} (got {s.nodes})")
    shape = Shape(
        nodes=int(s.nodes),
        per_node=dict(s.per_node),
        exclusive=s.exclusive,
        cpus_per_gpu=check_number(s.cpus_per_gpu, "shape.cpus_per_gpu"),
        mem_per_gpu=check_number(s.mem_per_gpu, "shape.mem_per_gpu"),
    )
    return None if shape.is_default else shape


_DECAY = {
    pb.Decay.KIND_UNSPECIFIED: elastic.DecayKind.STEP,
    pb.Decay.KIND_STEP: elastic.DecayKind.STEP,
    pb.Decay.KIND_LINEAR: elastic.DecayKind.LINEAR,
    pb.Decay.KIND_EXPONENTIAL: elastic.DecayKind.EXPONENTIAL,
}


_SPEED_MODEL = {
    pb.Intent.SPEED_MODEL_UNSPECIFIED: elastic.MEASURED,
    pb.Intent.SPEED_MODEL_MEASURED: elastic.MEASURED,
    pb.Intent.SPEED_MODEL_INTERPOLATED: elastic.INTERPOLATED,
}


def intent_from_proto(req: pb.AcquireRequest) -> elastic.Intent | None:
    """The request's intent, None when it has none. Only the sizes of repeated and map
    fields are bounded here; every value's range is the engine's check (it names the
    field and the range)."""
    if not req.HasField("intent"):
        return None
    it = req.intent
    model = it.speedup.WhichOneof("model")
    points = tuple((p.units, p.throughput) for p in it.speedup.curve.points)
    if len(points) > elastic.MAX_CURVE_POINTS:
        raise _bad("intent.speedup.curve", f"at most {elastic.MAX_CURVE_POINTS} points")
    if len(it.degrade) > elastic.MAX_MODES:
        raise _bad("intent.degrade", f"at most {elastic.MAX_MODES} modes")
    kind = _DECAY.get(it.decay.kind)
    if kind is None:
        raise _bad("intent.decay.kind", "allowed: STEP, LINEAR, EXPONENTIAL")
    if len(it.sizes) > elastic.MAX_CURVE_POINTS:
        raise _bad("intent.sizes", f"at most {elastic.MAX_CURVE_POINTS} sizes")
    return elastic.Intent(
        min=dict(it.min),
        max=dict(it.max),
        remaining_work=it.remaining_work,
        deadline_s=it.deadline_s,
        step=dict(it.step),
        amdahl=it.speedup.amdahl_serial_fraction if model == "amdahl_serial_fraction" else None,
        curve=points if model == "curve" else (),
        value=it.value or 1.0,
        decay=elastic.Decay(kind, it.decay.window_s),
        degrade=tuple(
            elastic.DegradeMode(m.name, m.work_factor, m.value_factor) for m in it.degrade
        ),
        # check_request has refused an unknown enum number already.
        speed_model=_SPEED_MODEL[it.speed_model],
        # Empty on the wire: no list (every size from min in whole steps).
        sizes=tuple(it.sizes) or None,
        size_rule=it.size_rule,
    )


@dataclass(frozen=True, slots=True)
class AcquireArgs:
    """An Acquire as the wire asked for it, checked for what the engine cannot see: what
    Acquire submits and WhatIf decides on a copy, from the one conversion."""

    campaign: str
    size: dict[str, float]
    duration_s: float
    timeout_s: float
    lease_class: LeaseClass | None
    labels: dict[str, str]
    key: str = ""
    shape: Shape | None = None
    intent: elastic.Intent | None = None

    def event(self, at: float) -> RequestLease:
        """The engine's event for this Acquire arriving at ``at``: a request that may wait
        queues (blocking), one that may not is refused when it cannot be granted now."""
        return RequestLease(
            at=at,
            campaign=self.campaign,
            size=self.size,
            duration_s=self.duration_s,
            blocking=self.timeout_s > 0,
            lease_class=self.lease_class,
            labels=self.labels,
            idempotency_key=self.key,
            shape=self.shape,
            intent=self.intent,
        )


def acquire_from_proto(req: pb.AcquireRequest, campaign: str) -> AcquireArgs:
    """An AcquireRequest for ``campaign`` (the caller's, as its token allows)."""
    shape = shape_from_proto(req)
    intent = intent_from_proto(req)
    return AcquireArgs(
        campaign,
        # With an intent the size may be left empty: intent.min is the size.
        check_size(req.size, shape) if intent is None else dict(req.size),
        req.duration_s,
        check_number(req.timeout_s, "timeout_s", high=MAX_WAIT_S),
        lease_class_from_proto(req.lease_class),
        check_labels(req.labels),
        req.idempotency_key,
        shape,
        intent,
    )


# --------------------------------------------------------------------------- leases


def lease_to_proto(engine: Engine, ls: Lease) -> pb.Lease:
    nodes = engine.pool.nodes
    # An elastic lease is its own size and pieces and its extra steps'.
    size, pieces = engine.elastic_size(ls.id)
    out = pb.Lease(
        lease_id=ls.id,
        campaign=ls.campaign,
        state=_STATE[ls.state],
        size=dims.as_dict(size),
        path=_PATH[ls.path],
        lease_class=_CLASS[ls.lease_class],
        preemptible=ls.preemptible,
        granted_at=ls.granted_at,
        starts_at=ls.starts_at,
        expires_at=ls.expires_at,
        # Placed (usable) only once active; a starting lease's pieces are still claims.
        nodes=[nodes[i].name for i in sorted(pieces)]
        if ls.state is not LeaseState.STARTING
        else [],
        labels=ls.labels,
    )
    if ls.preempt_deadline is not None:
        out.preempt_deadline = ls.preempt_deadline
    el = engine.elastic.by_lease.get(ls.id)
    if el is not None:
        out.elastic.CopyFrom(elastic_to_proto(engine, el))
    return out


def elastic_to_proto(engine: Engine, el: elastic.ElasticLease) -> pb.ElasticState:
    """The allocator's view of an elastic lease, as of the engine's clock."""
    now, risk = engine.now, engine.policy.elastic_risk
    table = el.table(now, risk)
    out = pb.ElasticState(
        min=dict(el.intent.min),
        max=dict(el.intent.max),
        step={d: v for d, v in dims.as_dict(el.step).items() if v},
        units=table["units"],
        mode=table["mode"],
        deadline=el.deadline,
        remaining_work=table["work_left"],
        slack_s=table["slack_s"],
        risk=table["risk"],
        marginal_utility=table["nmu"],
    )
    if el.warned:
        out.resize_deadline = min(el.warned.values())
        out.resize_to.update(dims.as_dict(engine.elastic_size_after_shrink(el.lease_id)))
    return out


def ended_lease_to_proto(rec: EndedLease) -> pb.Lease:
    """A lease that has ended, from the engine's bounded record of it."""
    return pb.Lease(
        lease_id=rec.id,
        campaign=rec.campaign,
        state=_STATE[rec.state],
        size=dims.as_dict(rec.size),
        path=_PATH[rec.path],
        lease_class=_CLASS[rec.lease_class],
        preemptible=rec.preemptible,
        granted_at=rec.granted_at,
        starts_at=rec.starts_at,
        expires_at=rec.at,
        labels=rec.labels,
        ended_at=rec.at,
        end_cause=rec.cause,
    )


# --------------------------------------------------------------------------- watch events

EVENT_KIND = {
    Granted: pb.LEASE_EVENT_KIND_GRANTED,
    Activated: pb.LEASE_EVENT_KIND_ACTIVATED,
    PreemptWarned: pb.LEASE_EVENT_KIND_PREEMPT_WARNING,
    Renewed: pb.LEASE_EVENT_KIND_RENEWED,
    Revoked: pb.LEASE_EVENT_KIND_REVOKED,
    Expired: pb.LEASE_EVENT_KIND_EXPIRED,
    Released: pb.LEASE_EVENT_KIND_RELEASED,
    Allocated: pb.LEASE_EVENT_KIND_ALLOCATED,
    Resized: pb.LEASE_EVENT_KIND_RESIZED,
    ResizeWarned: pb.LEASE_EVENT_KIND_RESIZE_WARNING,
}
"""The Watch event each lease decision is sent as."""
_END_KIND = {
    LeaseState.RELEASED: pb.LEASE_EVENT_KIND_RELEASED,
    LeaseState.EXPIRED: pb.LEASE_EVENT_KIND_EXPIRED,
    LeaseState.REVOKED: pb.LEASE_EVENT_KIND_REVOKED,
}
END_KINDS = frozenset(_END_KIND.values())
"""The events after which a lease sends no more."""
_LIVE_KIND = {
    LeaseState.STARTING: pb.LEASE_EVENT_KIND_GRANTED,
    LeaseState.ACTIVE: pb.LEASE_EVENT_KIND_ACTIVATED,
    LeaseState.PREEMPTING: pb.LEASE_EVENT_KIND_PREEMPT_WARNING,
}
LEASE_KINDS = frozenset(cls.kind for cls in EVENT_KIND)
"""The journal's ``kind`` of every decision a Watch sends."""


def live_lease_to_proto(
    engine: Engine, ls: Lease, allocation: Mapping[str, str] | None
) -> pb.Lease:
    """A live lease, with how to run inside its resources where a real backend (Slurm)
    says (``allocation``; the simulated pool has none)."""
    out = lease_to_proto(engine, ls)
    if allocation:  # none: skip the proto map's update
        out.allocation.update(allocation)
    return out


def granted_lease_to_proto(
    engine: Engine, grant: Granted, allocation: Mapping[str, str] | None
) -> pb.Lease:
    """The lease an Acquire answers with, as its grant made it: size, path, times and (on
    the warm path, active at once) nodes from the decision; the lease's fixed facts
    (class, preemptibility, labels) from its record (an elastic lease: all of it);
    ``allocation``, the backend's, once placed. A lease that has ended since (its
    placement failed) is answered as it ended."""
    ls = engine.leases.get(grant.lease_id)
    if ls is None:
        ended = engine.ended.get(grant.lease_id)
        if ended is not None:
            return ended_lease_to_proto(ended)
    elif ls.id in engine.elastic.by_lease:
        # Grown in the step that granted it (its Resized is in the grant's entry): as its
        # record holds it, with every step.
        return live_lease_to_proto(engine, ls, allocation)
    active = active_at_grant(grant)
    out = pb.Lease(
        lease_id=grant.lease_id,
        campaign=grant.campaign,
        state=_STATE[LeaseState.ACTIVE if active else LeaseState.STARTING],
        size=grant.size,
        path=_PATH[grant.path],
        granted_at=grant.at,
        starts_at=grant.starts_at,
        expires_at=grant.expires_at,
        nodes=grant.nodes if active else (),
    )
    if ls is not None:
        out.lease_class = _CLASS[ls.lease_class]
        out.preemptible = ls.preemptible
        out.labels.update(ls.labels)
    if allocation:
        out.allocation.update(allocation)
    return out


def lease_by_id(
    engine: Engine, lease_id: str, allocation: Callable[[str], Mapping[str, str] | None]
) -> pb.Lease | None:
    """The lease as the engine holds it now, live or ended (an elastic lease's extra step
    is no lease of its own); None if it never was or was forgotten. ``allocation``: the
    backend's, for a live lease."""
    ls = engine.leases.get(lease_id)
    if ls is not None and lease_id not in engine.elastic.parent_of:
        return live_lease_to_proto(engine, ls, allocation(lease_id))
    ended = engine.ended.get(lease_id)
    return ended_lease_to_proto(ended) if ended is not None else None


def pending_places(
    engine: Engine, only: str | None, request_id: str, key: str
) -> list[tuple[int, Pending]]:
    """The waiting requests ListPending shows, each with its place in the admission order:
    those of campaign ``only`` (None: every campaign's), or the one ``request_id`` names,
    or those with idempotency key ``key``."""
    queue, pending = engine.queue, engine.pending
    if not (request_id or key):
        ordered = enumerate(queue.ordered(), start=1)
        return [(i, p) for i, p in ordered if only is None or p.campaign == only]
    # One request (an on_queued poll, every second per waiting client): its place is
    # counted, not sorted for.
    if request_id:
        picked = [pending[request_id]] if request_id in pending else []
    else:
        picked = list(pending.values())
    if key:
        picked = [p for p in picked if p.key == key]
    if only is not None:
        picked = [p for p in picked if p.campaign == only]
    places = []
    for p in picked:
        mine = queue.key(p)
        places.append((1 + sum(queue.key(q) < mine for q in pending.values()), p))
    return places


def pending_to_proto(
    engine: Engine, now: float, places: Iterable[tuple[int, Pending]]
) -> pb.ListPendingResponse:
    """The waiting requests ``places`` (each with its place in the admission order) as of
    ``now`` on the service's clock: each one's estimated wait from its reservation if it
    holds one, else from the engine's estimate (made on the engine's clock)."""
    places = list(places)
    # Only aged requests hold reservations: the profile is built only for them.
    aged = any(p.id in engine.queue.aged for _, p in places)
    reserved = engine.reservation_starts() if aged else {}
    lag = now - engine.now
    out = pb.ListPendingResponse(at=now)
    for position, p in places:
        at = reserved.get(p.id)
        if at is not None and math.isfinite(at):
            wait = at - now
        else:
            wait = engine.estimated_wait(p.id) - lag
        item = out.requests.add(
            request_id=p.id,
            campaign=p.campaign,
            size=dims.as_dict(p.size),
            duration_s=p.duration_s,
            lease_class=_CLASS[p.lease_class],
            queued_at=p.queued_at,
            waited_s=max(0.0, now - p.queued_at),
            reason=reason_to_proto(p.reason),
            estimated_wait_s=max(0.0, wait),
            position=position,
            labels=p.labels,
            idempotency_key=p.key,
        )
        if at is not None and math.isfinite(at):
            item.reserved_at = at
    return out


def snapshot_event(
    engine: Engine, lease_id: str, at: float, allocation: Mapping[str, str] | None
) -> pb.LeaseEvent:
    """What a Watch opening without ``from_seq`` sends first for a lease: its state now."""
    ls = engine.leases.get(lease_id)
    if ls is not None:
        lease = live_lease_to_proto(engine, ls, allocation)
        ev = pb.LeaseEvent(kind=_LIVE_KIND[ls.state], at=at, lease=lease, snapshot=True)
        if ls.preempt_deadline is not None:
            ev.deadline = ls.preempt_deadline
        return ev
    ended = engine.ended[lease_id]
    return pb.LeaseEvent(
        kind=_END_KIND[ended.state],
        at=ended.at,
        lease=ended_lease_to_proto(ended),
        cause=ended.cause if ended.state is LeaseState.REVOKED else "",
        snapshot=True,
    )


def lease_event(d: Decision, seq: int, index: int, lease: pb.Lease | None) -> pb.LeaseEvent:
    """The Watch event for lease decision ``d``, journal entry ``seq`` position ``index``.

    What happened (kind, time, deadline, cause, new expiry, nodes) comes from the
    decision; the lease's fixed facts (size, class, labels) from ``lease``, its record
    (None: forgotten, ended long ago; the decision is all there is). ``lease`` is
    changed."""
    lease_id: str = d.lease_id  # type: ignore[attr-defined]
    if lease is None:
        lease = pb.Lease(lease_id=lease_id, campaign=d.campaign)  # type: ignore[attr-defined]
    kind = EVENT_KIND[type(d)]
    ev = pb.LeaseEvent(kind=kind, at=d.at, seq=seq, index=index)
    if isinstance(d, Granted):
        lease.state = _STATE[LeaseState.ACTIVE if active_at_grant(d) else LeaseState.STARTING]
        lease.starts_at, lease.expires_at = d.starts_at, d.expires_at
    elif isinstance(d, Activated):
        lease.state = _STATE[LeaseState.ACTIVE]
        lease.nodes[:] = list(d.nodes)
    elif isinstance(d, Renewed):
        lease.expires_at = d.expires_at
    elif isinstance(d, Allocated):
        lease.allocation.clear()
        lease.allocation.update(d.allocation)
    elif isinstance(d, Resized):
        lease.size.clear()
        lease.size.update(d.size)
        lease.nodes[:] = list(d.nodes)
    elif isinstance(d, ResizeWarned):
        ev.deadline = d.deadline
        ev.resize_to.update(d.to)
    elif isinstance(d, PreemptWarned):
        lease.state = _STATE[LeaseState.PREEMPTING]
        lease.preempt_deadline = d.deadline
        ev.deadline = d.deadline
        ev.for_request = d.for_request
    else:
        state = {
            pb.LEASE_EVENT_KIND_RELEASED: LeaseState.RELEASED,
            pb.LEASE_EVENT_KIND_EXPIRED: LeaseState.EXPIRED,
        }.get(kind, LeaseState.REVOKED)
        lease.state = _STATE[state]
        lease.ended_at = d.at
        if isinstance(d, Revoked):
            ev.cause = d.cause
            lease.end_cause = d.cause
    ev.lease.CopyFrom(lease)
    return ev


# --------------------------------------------------------------------------- campaigns


def spec_from_proto(spec: pb.CampaignSpec) -> CampaignSpec:
    if not spec.name:
        raise _bad("spec.name", "required")
    envelopes = {}
    for d, e in spec.envelopes.items():
        envelopes[d] = DimEnvelope(
            guarantee=e.guarantee,
            sustained=e.sustained,
            burst=e.burst,
            bucket=e.bucket if e.HasField("bucket") else None,
        )
    lc = lease_class_from_proto(spec.lease_class, "spec.lease_class") or LeaseClass.BATCH
    return CampaignSpec(
        name=spec.name, envelopes=envelopes, lease_class=lc, preemptible=spec.preemptible
    )


def spec_to_proto(spec: CampaignSpec) -> pb.CampaignSpec:
    out = pb.CampaignSpec(
        name=spec.name, lease_class=_CLASS[spec.lease_class], preemptible=spec.preemptible
    )
    for d, e in sorted(spec.envelopes.items()):
        env = out.envelopes[d]
        env.guarantee = e.guarantee
        env.sustained = e.sustained
        env.burst = e.burst
        if e.bucket is not None:
            env.bucket = e.bucket
    return out


def campaign_to_proto(
    engine: Engine, name: str, at: float, token_issued_at: float
) -> admin_pb2.Campaign:
    c = engine.campaigns[name]
    queued = sum(1 for p in engine.pending.values() if p.campaign == name)
    return admin_pb2.Campaign(
        spec=spec_to_proto(c.spec),
        held=dims.as_dict(c.held),
        bucket=engine.bucket_levels(name, at),
        credits=c.credits,
        leases=sum(1 for lid in c.leases if lid not in engine.elastic.parent_of),
        queued=queued,
        token_issued_at=token_issued_at,
    )


# --------------------------------------------------------------------------- supply


def supply_to_proto(
    s: Supply,
    engine: Engine,
    at: float,
    visible: set[str] | None,
    units: float = 0.0,
    dim: str = "",
) -> pb.Supply:
    """Supply as of ``at``; ``visible`` limits the campaigns shown (None: all)."""
    out = pb.Supply(
        at=at,
        price=s.price,
        pressure=s.pressure,
        grace_s=s.grace_s,
        boot_latency_s=s.boot_latency_s,
    )
    for d, x in s.dims.items():
        out.dims[d].CopyFrom(
            pb.DimSupply(
                capacity=x.capacity,
                warm_free=x.warm_free,
                reserve=x.reserve,
                available_warm=x.available_warm,
                reclaimable=x.reclaimable,
                cold=x.cold,
                stranded=x.stranded,
                partial_free=x.partial_free,
                lendable=x.lendable,
            )
        )
    if s.power is not None:
        p = s.power
        out.power.CopyFrom(
            pb.PowerSupply(
                cap_w=p.cap_w,
                draw_w=p.draw_w,
                idle_w=p.idle_w,
                reserved_w=p.reserved_w,
                headroom_w=p.headroom_w,
                reclaimable_w=p.reclaimable_w,
                price=p.price,
            )
        )
    for name, c in s.campaigns.items():
        if visible is not None and name not in visible:
            continue
        cs = out.campaigns[name]
        cs.held.update(c.held)
        cs.bucket.update(engine.bucket_levels(name, at))
        cs.time_to_empty_s.update({d: v for d, v in c.time_to_empty_s.items() if v is not None})
        cs.headroom_to_burst.update(c.headroom_to_burst)
        cs.unmet_guarantee.update(c.unmet_guarantee)
        cs.credits = c.credits
        cs.queued = c.queued
    if units > 0:
        dim = dim or "gpu"
        if dim not in s.dims:
            raise _bad("dim", f"no capacity in {dim!r}; allowed: {', '.join(s.dims)}")
        # A campaign asking for itself gets the figure that counts its own unmet guarantee.
        own = next(iter(visible)) if visible is not None and len(visible) == 1 else None
        tt = s.time_to(units, dim, own)
        out.time_to.units = units
        out.time_to.dim = dim
        for path, v in tt.items():
            if v is not None:
                setattr(out.time_to, f"{path}_s", v)
    return out
