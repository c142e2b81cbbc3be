"""Proto ↔ engine values. Pure functions, no I/O; the servicer calls them both ways.

Incoming messages are checked for what the engine cannot see (a field the wire left
empty, an enum number outside the contract, too many labels); what the engine checks
itself (dimensions, sizes, envelopes) is left to it, so that each rule has one home.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bursar.broker import codec, dims, elastic
from bursar.broker.decisions import LeasePath
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import RequestLease
from bursar.broker.lease import EndedLease, Lease, LeaseState
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
    "decision_kind_to_proto",
    "decision_record",
    "lease_class_from_proto",
    "lease_class_to_proto",
    "lease_to_proto",
    "path_to_proto",
    "reason_to_proto",
    "shape_from_proto",
    "spec_from_proto",
    "spec_to_proto",
    "state_to_proto",
    "supply_to_proto",
]

MAX_ID_LEN = 64
MAX_LABELS = 16
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 256
MAX_SIZE_ENTRIES = 8

MAX_WAIT_S = 3600.0
"""Longest a blocking Acquire may wait (AcquireRequest.timeout_s)."""

_STATE = {s: pb.LeaseState.Value(f"LEASE_STATE_{s.name}") for s in LeaseState}
_PATH = {p: pb.LeasePath.Value(f"LEASE_PATH_{p.name}") for p in LeasePath}
_CLASS = {c: pb.LeaseClass.Value(f"LEASE_CLASS_{c.name}") for c in LeaseClass}
_CLASS_BACK = {v: k for k, v in _CLASS.items()}
_REASON = {r: pb.ReasonCode.Value(f"REASON_{r.value}") for r in Reason}


def _bad(field: str, message: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_ARGUMENT, field, message)


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
    if not value:
        raise _bad(field, "required")
    if len(value) > MAX_ID_LEN or not value.isprintable():
        raise _bad(field, f"at most {MAX_ID_LEN} printable characters")
    return value


def check_number(value: float, field: str, *, low: float = 0.0, high: float = math.inf) -> float:
    if not math.isfinite(value) or value < low or value > high:
        raise _bad(field, f"must be a finite number in [{low:g}, {high:g}] (got {value!r})")
    return value


def check_labels(labels: Mapping[str, str]) -> dict[str, str]:
    if len(labels) > MAX_LABELS:
        raise _bad("labels", f"at most {MAX_LABELS} labels (got {len(labels)})")
    for k, v in labels.items():
        if not k or len(k) > MAX_LABEL_KEY:
            raise _bad("labels", f"label keys must have 1 to {MAX_LABEL_KEY} characters")
        if len(v) > MAX_LABEL_VALUE:
            raise _bad(f"labels.{k}", f"at most {MAX_LABEL_VALUE} characters")
    return dict(labels)


def check_size(size: Mapping[str, float], shape: Shape | None = None) -> dict[str, float]:
    """The size as a dict; it may be empty only when the shape gives it (per_node or
    exclusive)."""
    if not size and (shape is None or not (shape.per_node or shape.exclusive)):
        raise _bad("size", "give a size per dimension, e.g. {'gpu': 8}")
    if len(size) > MAX_SIZE_ENTRIES:
        raise _bad("size", f"at most {MAX_SIZE_ENTRIES} dimensions")
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
    if len(s.per_node) > MAX_SIZE_ENTRIES:
        raise _bad("shape.per_node", f"at most {MAX_SIZE_ENTRIES} dimensions")
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


def intent_from_proto(req: pb.AcquireRequest) -> elastic.Intent | None:
    """The request's intent, None when it has none. Only the sizes of repeated and map
    fields are bounded here; every value's range is the engine's check (it names the
    field and the range)."""
    if not req.HasField("intent"):
        return None
    it = req.intent
    for where, m in (("intent.min", it.min), ("intent.max", it.max), ("intent.step", it.step)):
        if len(m) > MAX_SIZE_ENTRIES:
            raise _bad(where, f"at most {MAX_SIZE_ENTRIES} dimensions")
    model = it.speedup.WhichOneof("model")
    points = tuple((p.units, p.throughput) for p in it.speedup.curve.points)
    if len(points) > elastic.MAX_CURVE_POINTS:
        raise _bad("intent.speedup.curve", f"at most {elastic.MAX_CURVE_POINTS} points")
    if len(it.degrade) > elastic.MAX_MODES:
        raise _bad("intent.degrade", f"at most {elastic.MAX_MODES} modes")
    kind = _DECAY.get(it.decay.kind)
    if kind is None:
        raise _bad("intent.decay.kind", "allowed: STEP, LINEAR, EXPONENTIAL")
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


# --------------------------------------------------------------------------- campaigns


def spec_from_proto(spec: pb.CampaignSpec) -> CampaignSpec:
    if not spec.name:
        raise _bad("spec.name", "required")
    if len(spec.envelopes) > len(dims.ALL):
        raise _bad("spec.envelopes", f"at most one per dimension ({', '.join(dims.ALL)})")
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
