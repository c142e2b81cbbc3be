"""The dashboard's JSON views, built from the same reads the RPCs use.

Every function here reads the service core (its engine, journal and tokens) and returns
plain JSON values; none changes anything, so a view may be built at any moment on the
event loop. What a campaign token sees is cut here: its own campaign's leases, queue,
journal and credits, and the pool's public supply (capacity, price, pressure), never
another campaign's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict

from bursar.broker import dims
from bursar.broker.colours import campaign_colour
from bursar.broker.dashboard.series import Series, build
from bursar.broker.service import convert
from bursar.broker.service.auth import Principal
from bursar.broker.service.core import ServiceCore
from bursar.broker.supply import supply

__all__ = [
    "TAIL",
    "iso",
    "lease_history",
    "message",
    "queue_view",
    "state_view",
    "time_to_usable",
]

TAIL = 50
"""Journal decisions the journal panel shows."""

_TAIL_WINDOW = 100
"""Journal entries looked back through for the tail (an entry holds one or more
decisions, so this finds at least ``TAIL`` when the journal has them)."""

_USABLE_WINDOW = 5000
"""Journal entries looked back through for the time-to-usable distribution."""


def iso(t: float | None) -> str:
    """A broker time (Unix seconds) as ISO 8601 UTC, to the millisecond; '' for none."""
    if t is None or not math.isfinite(t):
        return ""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message(msg: Any) -> dict[str, Any]:
    """A proto message as the JSON a browser reads (field names as in the .proto)."""
    return MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an unlimited level is sent as null."""
    return x if x is not None and math.isfinite(x) else None


def _visible(core: ServiceCore, who: Principal) -> list[str]:
    names = sorted(core.engine.campaigns)
    return names if who.admin else [n for n in names if n == who.campaign]


def campaigns_view(core: ServiceCore, who: Principal) -> list[dict[str, Any]]:
    """Each visible campaign: envelope (guarantee, sustained, burst, bucket) per dimension,
    what it holds, bucket levels, credits, leases and queued requests."""
    eng = core.engine
    now = core.now()
    out = []
    for name in _visible(core, who):
        c = eng.campaigns[name]
        held = dims.as_dict(c.held)
        env = {
            d: {
                "guarantee": e.guarantee,
                "sustained": e.sustained,
                "burst": e.burst,
                "bucket": e.bucket,
                "held": held.get(d, 0.0),
            }
            for d, e in sorted(c.spec.envelopes.items())
        }
        out.append(
            {
                "name": name,
                "colour": campaign_colour(name),
                "lease_class": c.spec.lease_class.value,
                "preemptible": c.spec.preemptible,
                "envelopes": env,
                "held": held,
                "bucket": {d: _finite(v) for d, v in eng.bucket_levels(name, now).items()},
                "credits": c.credits,
                "leases": sum(1 for lid in c.leases if lid not in eng.elastic.parent_of),
                "queued": sum(1 for p in eng.pending.values() if p.campaign == name),
            }
        )
    return out


def supply_view(core: ServiceCore, who: Principal) -> dict[str, Any]:
    """The pool's supply as GetSupply answers this caller (its own campaign only)."""
    visible = None if who.admin else {who.campaign or ""}
    now = core.now()
    out = message(convert.supply_to_proto(supply(core.engine), core.engine, now, visible))
    out["at_iso"] = iso(now)
    return out


def leases_view(core: ServiceCore, who: Principal) -> list[dict[str, Any]]:
    """The live leases this caller may see, as ListLeases answers, with ISO times and, for
    an elastic lease, the allocator's table (units, mode, slack, risk, marginal utility)."""
    out = []
    for lease in core.list_leases(who, ""):
        d = message(lease)
        for k in ("granted_at", "starts_at", "expires_at"):
            d[k + "_iso"] = iso(getattr(lease, k))
        out.append(d)
    return out


def paths_in_use(leases: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Live leases per path (warm, reclaim, cold)."""
    counts: dict[str, int] = {}
    for ls in leases:
        p = str(ls.get("path", "")).removeprefix("LEASE_PATH_").lower()
        counts[p] = counts.get(p, 0) + 1
    return dict(sorted(counts.items()))


def queue_view(core: ServiceCore, who: Principal) -> list[dict[str, Any]]:
    """The waiting requests this caller may see, oldest first: why each waits, how long
    it is likely to wait, and when its reservation starts if it holds one."""
    eng = core.engine
    now = eng.now
    rows = []
    for p in sorted(eng.pending.values(), key=lambda p: p.seq):
        if not who.may_see(p.campaign):
            continue
        c = eng.campaigns[p.campaign]
        wait = (
            eng.ledger.estimate_wait(c, p.size, p.duration_s, p.reason, now)
            if p.reason is not None
            else None
        )
        reserved = eng.reservation(p.id)
        rows.append(
            {
                "request_id": p.id,
                "campaign": p.campaign,
                "size": dims.as_dict(p.size),
                "duration_s": p.duration_s,
                "lease_class": p.lease_class.value,
                "queued_at": p.queued_at,
                "queued_at_iso": iso(p.queued_at),
                "waited_s": max(0.0, now - p.queued_at),
                "reason": p.reason.value if p.reason is not None else "",
                "estimated_wait_s": _finite(wait),
                "reservation_at": reserved,
                "reservation_at_iso": iso(reserved),
            }
        )
    return rows


def _decision_row(seq: int, d: Mapping[str, Any]) -> dict[str, Any]:
    ident = d.get("lease_id") or d.get("request_id") or ""
    skip = {"at", "kind", "campaign", "inputs", "lease_id", "request_id", "pieces"}
    return {
        "seq": seq,
        "at": d.get("at"),
        "at_iso": iso(d.get("at")),
        "kind": d.get("kind"),
        "campaign": d.get("campaign", ""),
        "id": ident,
        "details": {
            k: iso(v) if _is_time(k, v) else v
            for k, v in d.items()
            if k not in skip and v not in ({}, [], None)
        },
    }


def _is_time(key: str, value: Any) -> bool:
    """A decision field that holds an instant (not a duration): shown as ISO time."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (key.endswith("_at") or key in ("ready_by", "deadline"))
    )


def journal_tail(core: ServiceCore, who: Principal, *, lease_id: str = "") -> list[dict[str, Any]]:
    """The latest decisions this caller may read (ListDecisions' filter), newest last;
    with ``lease_id``, that lease's whole history still in the journal's index."""
    last = core.runtime.journal.last_seq
    start = 1 if lease_id else max(1, last - _TAIL_WINDOW)
    rows, _ = core.list_decisions(
        who,
        start_seq=start,
        campaign="" if who.admin else who.campaign or "",
        kinds=set(),
        lease_id=lease_id,
        since=0.0,
        limit=1000,
    )
    out = [_decision_row(seq, d) for seq, _i, d in rows]
    return out if lease_id else out[-TAIL:]


def lease_history(core: ServiceCore, who: Principal, lease_id: str) -> dict[str, Any]:
    """One lease as GetLease answers (the caller must own it) and its journal history."""
    core.own_lease(who, lease_id)
    lease = core.lease_proto(lease_id)
    out = message(lease)
    for k in ("granted_at", "starts_at", "expires_at", "ended_at"):
        out[k + "_iso"] = iso(getattr(lease, k) or None)
    return {"lease": out, "history": journal_tail(core, who, lease_id=lease_id)}


def time_to_usable(core: ServiceCore, who: Principal) -> dict[str, list[float]]:
    """Seconds from grant to usable per path, from the journal's Granted/Activated pairs
    (a warm grant is usable with its grant: 0). Recent entries only."""
    last = core.runtime.journal.last_seq
    rows, _ = core.list_decisions(
        who,
        start_seq=max(1, last - _USABLE_WINDOW),
        campaign="" if who.admin else who.campaign or "",
        kinds={"grant", "activate"},
        lease_id="",
        since=0.0,
        limit=_USABLE_WINDOW,
    )
    granted: dict[str, tuple[str, float]] = {}
    out: dict[str, list[float]] = {}
    for _seq, _i, d in rows:
        if d["kind"] == "grant":
            path = str(d.get("path", ""))
            if path == "warm":
                out.setdefault(path, []).append(0.0)
            else:
                granted[d["lease_id"]] = (path, float(d["at"]))
        elif d["lease_id"] in granted:
            path, at = granted.pop(d["lease_id"])
            out.setdefault(path, []).append(max(0.0, float(d["at"]) - at))
    return dict(sorted(out.items()))


def state_view(
    core: ServiceCore,
    who: Principal,
    series: Series | None = None,
    usable: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """Everything the page shows at once, for this caller. ``series``: the pool-over-time
    chart's (``series.build``; none: built here from the journal). ``usable``: its
    ``time_to_usable`` if already known (it reads thousands of journal decisions)."""
    leases = leases_view(core, who)
    return {
        "caller": str(who),
        "admin": who.admin,
        "now": core.now(),
        "now_iso": iso(core.now()),
        "journal_seq": core.runtime.journal.last_seq,
        "campaigns": campaigns_view(core, who),
        "supply": supply_view(core, who),
        "leases": leases,
        "paths": paths_in_use(leases),
        "queue": queue_view(core, who),
        "journal": journal_tail(core, who),
        "time_to_usable": time_to_usable(core, who) if usable is None else usable,
        "series": (series if series is not None else build(core)).view(who, core.now()),
        "brokers": brokers_view(core),
    }


def brokers_view(core: ServiceCore) -> list[dict[str, str]]:
    """The brokers on this broker's journal with their dashboards (PostgreSQL: the leader
    and its standbys; SQLite: none): where the page looks for the lead if this broker
    stops answering."""
    top = core.topology
    if top is None:
        return []
    return [{"address": p.address, "role": p.role, "dashboard": p.dashboard} for p in top.brokers]
