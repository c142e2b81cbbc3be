"""The client library's types for a terminal: campaigns, leases, lease events, supply
signals and what-if answers as rich tables and one-line summaries (what ``bursar
campaigns``, ``bursar leases`` and ``bursar supply`` print)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

from rich import box
from rich.table import Table

from bursar.cli.console import human_duration, iso_time
from bursar.providers.client import (
    Campaign,
    DecisionKind,
    Lease,
    LeaseEvent,
    PendingRequest,
    Supply,
    WhatIfResult,
)

__all__ = [
    "campaigns_tables",
    "clock",
    "event_line",
    "leases_table",
    "pending_table",
    "supply_tables",
    "whatif_tables",
]


def _num(x: float | None) -> str:
    """Compact: 8, 0.25, 1536, 100k, 3.84M; ∞ for unlimited (None or +inf)."""
    if x is None or math.isinf(x):
        return "∞" if x is None or x > 0 else "-∞"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.3g}k"
    if float(x).is_integer():
        return str(int(x))
    return f"{x:.4g}"


def _size(size: Mapping[str, float]) -> str:
    return " ".join(f"{_num(v)} {d}" for d, v in size.items()) or "-"


def _when(t: float | None, now: float) -> str:
    """``in 42s`` / ``3s ago`` relative to ``now``."""
    if t is None or t == 0:
        return "-"
    d = t - now
    text = human_duration(abs(d))
    return "now" if text == "0s" else f"in {text}" if d > 0 else f"{text} ago"


def clock(t: float) -> str:
    """A time as the CLI prints it: ISO 8601, UTC (see ``iso_time``)."""
    return iso_time(t)


def _table(title: str | None = None) -> Table:
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )


def campaigns_tables(items: list[Campaign]) -> list[Table]:
    """Two tables: what each campaign was given (its envelope per dimension) and where it
    stands now (held, bucket level, leases, credits)."""
    env = _table("Envelopes")
    env.add_column("campaign", no_wrap=True)
    env.add_column("class")
    env.add_column("dim", no_wrap=True)
    for col in ("guarantee", "sustained", "burst", "bucket"):
        env.add_column(col, justify="right")
    now = _table("Now")
    now.add_column("campaign", no_wrap=True)
    now.add_column("dim", no_wrap=True)
    for col in ("held", "bucket level", "leases", "queued", "credits"):
        now.add_column(col, justify="right")
    for c in items:
        dims = list(c.spec.envelopes) or ["-"]
        flags = [c.spec.lease_class.value.lower()]
        if c.spec.preemptible:
            flags.append("preemptible")
        n = max(len(dims), len(flags))
        for k in range(n):
            d = dims[k] if k < len(dims) else ""
            e = c.spec.envelopes.get(d)
            env.add_row(
                c.name if k == 0 else "",
                flags[k] if k < len(flags) else "",
                d,
                *(
                    (_num(e.guarantee), _num(e.sustained), _num(e.burst), _num(e.bucket))
                    if e
                    else ("",) * 4
                ),
                end_section=k == n - 1,
            )
        for k, d in enumerate(dims):
            now.add_row(
                c.name if k == 0 else "",
                d,
                _num(c.held.get(d, 0.0)) if d in c.spec.envelopes else "",
                _num(c.bucket[d]) if d in c.bucket else "",
                str(c.leases) if k == 0 else "",
                str(c.queued) if k == 0 else "",
                f"{c.credits:.2f}" if k == 0 else "",
                end_section=k == len(dims) - 1,
            )
    if not items:
        env.caption = "no campaigns yet: bursar campaigns create NAME --envelope gpu:..."
        return [env]
    env.caption = "bucket: unit-seconds; ∞: unlimited"
    return [env, now]


def leases_table(items: list[Lease], now: float) -> Table:
    t = _table()
    for col in ("lease", "campaign", "state", "size", "path", "class", "nodes"):
        t.add_column(col, no_wrap=col in ("lease", "campaign", "state"))
    t.add_column("starts", justify="right")
    t.add_column("expires", justify="right")
    t.add_column("labels")
    for x in items:
        state = x.state.value.lower()
        if x.preempt_deadline is not None:
            state += f" (revoked {_when(x.preempt_deadline, now)})"
        t.add_row(
            x.id,
            x.campaign,
            state,
            _size(x.size),
            x.path.value.lower(),
            x.lease_class.value.lower() + (" preemptible" if x.preemptible else ""),
            ",".join(x.nodes) or "-",
            _when(x.starts_at, now),
            _when(x.expires_at, now),
            ",".join(f"{k}={v}" for k, v in x.labels.items()) or "-",
        )
    if not items:
        t.caption = "no live leases"
    return t


def pending_table(items: list[PendingRequest], now: float) -> Table:
    """The waiting requests: why each waits, about how long, where it stands in the
    queue, and the reservation it holds (an ISO time), if any."""
    t = _table()
    for col in ("request", "campaign", "size", "class", "reason"):
        t.add_column(col, no_wrap=col in ("request", "campaign", "reason"))
    for col in ("waited", "est. wait", "position"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("reserved at", no_wrap=True)
    t.add_column("labels")
    for x in items:
        t.add_row(
            x.request_id,
            x.campaign,
            _size(x.size),
            x.lease_class.value.lower(),
            x.reason.value.lower(),
            human_duration(x.waited_s),
            human_duration(x.estimated_wait_s),
            str(x.position),
            iso_time(x.reserved_at) if x.reserved_at is not None else "-",
            ",".join(f"{k}={v}" for k, v in x.labels.items()) or "-",
        )
    if not items:
        t.caption = "no requests waiting"
    else:
        t.caption = (
            f"as of {iso_time(now)}; est. wait: the broker's estimate (until the "
            "reservation when one is held); position: place in the admission order"
        )
    return t


def event_line(ev: LeaseEvent) -> str:
    x = ev.lease
    parts = [
        clock(ev.at),
        f"{ev.kind.value.lower():<15}",
        f"{x.id:<6}",
        x.campaign,
        x.state.value.lower(),
    ]
    if x.size:
        parts.append(_size(x.size))
    if x.nodes:
        parts.append("on " + ",".join(x.nodes))
    if ev.deadline is not None:
        parts.append(f"revoked at {clock(ev.deadline)}")
    if ev.for_request:
        parts.append(f"for {ev.for_request}")
    if ev.cause:
        parts.append(f"({ev.cause})")
    if x.allocation.get("job_id"):
        parts.append(f"{x.allocation.get('backend', 'job')} job {x.allocation['job_id']}")
    if x.expires_at and not x.ended:
        parts.append(f"expires {clock(x.expires_at)}")
    if ev.snapshot:
        parts.append("[snapshot]")
    return "  ".join(parts)


def supply_tables(s: Supply) -> list[Table | str]:
    head = (
        f"price [bold]{s.price:,.4g}[/bold] credits/unit-h   pressure {s.pressure:.2f}   "
        f"grace {_num(s.grace_s)} s   boot {_num(s.boot_latency_s)} s"
    )
    dims = _table("Pool")
    for col in ("dim", "capacity", "warm free", "reserve", "available warm", "reclaimable"):
        dims.add_column(col, justify="left" if col == "dim" else "right")
    # Fragmentation: free capacity node-shaped requests cannot use (see DimSupply).
    for col in ("cold", "stranded", "partial free"):
        dims.add_column(col, justify="right")
    for d, x in s.dims.items():
        dims.add_row(
            d,
            _num(x.capacity),
            _num(x.warm_free),
            _num(x.reserve),
            _num(x.available_warm),
            _num(x.reclaimable),
            _num(x.cold),
            _num(x.stranded),
            _num(x.partial_free),
        )
    out: list[Table | str] = [head, dims]
    if s.power is not None:
        p = s.power
        cap = "none" if p.cap_w == float("inf") else f"{_num(p.cap_w)} W"
        out.append(
            f"power: cap {cap}   draw {_num(p.draw_w)} W (idle {_num(p.idle_w)} W)   "
            f"reserved {_num(p.reserved_w)} W   headroom [bold]{_num(p.headroom_w)} W[/bold]   "
            f"reclaimable {_num(p.reclaimable_w)} W   price {p.price:,.4g} credits/kWh"
        )
    if s.campaigns:
        camps = _table("Campaigns")
        for col in ("campaign", "dim", "held", "bucket", "drains in", "to burst", "unmet"):
            camps.add_column(col, justify="left" if col in ("campaign", "dim") else "right")
        camps.add_column("queued", justify="right")
        camps.add_column("credits", justify="right")
        for name, c in s.campaigns.items():
            names = list(dict.fromkeys([*c.held, *c.bucket, *c.headroom_to_burst])) or ["-"]
            for k, d in enumerate(names):
                tte = c.time_to_empty_s.get(d)
                camps.add_row(
                    name if k == 0 else "",
                    d,
                    _num(c.held.get(d, 0.0)) if d in c.held or d in c.headroom_to_burst else "",
                    _num(c.bucket[d]) if d in c.bucket else "",
                    human_duration(tte) if tte is not None else "-",
                    _num(c.headroom_to_burst[d]) if d in c.headroom_to_burst else "",
                    _num(c.unmet_guarantee[d]) if d in c.unmet_guarantee else "",
                    str(c.queued) if k == 0 else "",
                    f"{c.credits:.2f}" if k == 0 else "",
                    end_section=k == len(names) - 1,
                )
        out.append(camps)
    if s.time_to is not None:
        tt = s.time_to

        def path(v: float | None) -> str:
            return "not now" if v is None else f"{_num(v)} s"

        out.append(
            f"time to {_num(tt.units)} {tt.dim}: warm {path(tt.warm_s)}, reclaim "
            f"{path(tt.reclaim_s)}, cold {path(tt.cold_s)}"
        )
    return out


def _decision_detail(kind: DecisionKind, d: Mapping[str, Any], now: float) -> str:
    """The gist of one decision, from its JSON (``DecisionRecord.details``)."""
    if kind is DecisionKind.GRANT:
        text = f"{_size(d.get('size', {}))} {d.get('path', '')}"
        starts = d.get("starts_at")
        return text + (f", starts {_when(starts, now)}" if starts and starts > now else "")
    if kind is DecisionKind.QUEUE:
        return f"wait about {human_duration(d.get('estimated_wait_s', 0.0))}"
    if kind is DecisionKind.REJECT:
        return f"retry after {human_duration(d.get('retry_after_s', 0.0))}"
    if kind in (DecisionKind.PREEMPT_WARNING, DecisionKind.RESIZE_WARNING):
        text = f"revoked {_when(d.get('deadline'), now)}"
        return text + (f" for {d['for_request']}" if d.get("for_request") else "")
    if kind in (DecisionKind.POWER_ON, DecisionKind.POWER_OFF, DecisionKind.ACTIVATE):
        return ",".join(d.get("nodes", ())) or "-"
    if kind is DecisionKind.REVOKE:
        return str(d.get("cause", ""))
    if kind is DecisionKind.RESIZE:
        return f"to {_size(d.get('size', {}))}"
    if kind is DecisionKind.CAMPAIGN:
        return "created" if d.get("created") else "updated"
    return ""


_WOULD = {
    DecisionKind.GRANT: "[green]would be granted[/green]",
    DecisionKind.QUEUE: "[yellow]would queue[/yellow]",
    DecisionKind.REJECT: "[red]would be refused[/red]",
    DecisionKind.CAMPAIGN: "[green]would be applied[/green]",
}


def whatif_tables(r: WhatIfResult) -> list[Table | str]:
    """A what-if answer: one line (the outcome, why, how long), the lease a grant would
    be, and every decision the change would cause."""
    now = r.decisions[0].at if r.decisions else time.time()
    head = _WOULD.get(r.outcome, r.outcome.value.lower())
    if r.outcome is DecisionKind.QUEUE:
        head += f": {r.reason.value}, estimated wait {human_duration(r.estimated_wait_s)}"
    elif r.outcome is DecisionKind.REJECT:
        head += f": {r.reason.value}, retry after {human_duration(r.estimated_wait_s)}"
    out: list[Table | str] = [head + " (nothing was changed)"]
    if r.lease is not None:
        out.append(leases_table([r.lease], now))
    t = _table("Decisions it would cause")
    for col in ("decision", "campaign", "lease", "reason", "detail"):
        t.add_column(col, no_wrap=col != "detail")
    for x in r.decisions:
        t.add_row(
            x.kind.value.lower(),
            x.campaign or "-",
            x.lease_id or "-",
            x.reason.value if x.reason.value != "UNSPECIFIED" else "-",
            _decision_detail(x.kind, x.details, now),
        )
    if not r.decisions:
        t.caption = "none your token may see"
    out.append(t)
    return out
