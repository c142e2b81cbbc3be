"""The flagship demo: a scripted 30-minute session on the 512-GPU pool, in virtual time.

The five campaigns of the flagship pool each play a short script against the real engine,
journal and simulated pool (through ``Runtime``, the same shell the service uses):

* backfill fills idle capacity with preemptible leases (cold path: nodes boot);
* naive-sci demands 256 GPUs at once (reclaim path: backfill is warned, then revoked);
* victim asks for 8 GPUs every minute (inside its guarantee: warm, at once, always);
* storm hammers burst-sized requests and spams inference (burst ceiling, empty bucket,
  metering hold it back);
* adaptive-sci reads the supply signals and asks only when the price is low;
* a node fails mid-run and its leases are revoked.

It prints what the broker decided and why, and writes a state directory (the journal:
``bursar journal audit --state-dir DIR`` re-derives every decision) and ``report.html``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bursar.broker.audit import audit
from bursar.broker.colours import campaign_colour
from bursar.broker.config import Config, default_config
from bursar.broker.decisions import (
    Activated,
    Decision,
    Expired,
    Granted,
    Metered,
    PreemptWarned,
    Queued,
    Rejected,
    Released,
    Revoked,
)
from bursar.broker.errors import ErrorCode, RequestError, require
from bursar.broker.events import Event, Meter, NodeLost, Release, RequestLease
from bursar.broker.lease import LeaseState
from bursar.broker.runtime import Runtime

DURATION_S = 1800.0


@dataclass
class Trace:
    """What the report plots and tabulates, recorded as the broker decides."""

    times: list[float] = field(default_factory=list)
    held: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    price: list[float] = field(default_factory=list)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    notable: list[tuple[float, str, str, str]] = field(default_factory=list)
    requested_at: dict[str, float] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    refused: list[str] = field(default_factory=list)


def _why(d: Decision) -> str:
    if isinstance(d, Granted):
        waited = d.inputs.get("waited_s", 0.0)
        guar = "within its guarantee" if d.inputs.get("within_guarantee") else "above guarantee"
        return (
            f"{d.path.value} path, {guar}, active at t={d.starts_at:.0f}s; "
            f"waited {waited:.0f}s; price {d.price:.2f}; prepaid {d.tokens:.0f} tokens"
        )
    if isinstance(d, Queued | Rejected):
        what = "queued" if isinstance(d, Queued) else "refused"
        wait = d.estimated_wait_s if isinstance(d, Queued) else d.retry_after_s
        return f"{what}: {d.reason.explanation} (wait ~{wait:.0f}s)"
    if isinstance(d, PreemptWarned):
        return f"reclaimed for {d.for_request}; drain by t={d.deadline:.0f}s"
    if isinstance(d, Revoked):
        return f"revoked ({d.cause}); refunded {d.refund_credits:.1f} credits"
    if isinstance(d, Released):
        return f"released early; refunded {d.refund_tokens:.0f} tokens"
    if isinstance(d, Metered):
        return f"{d.granted:.0f} of {d.requested:.0f} now, rest in {d.wait_s:.1f}s"
    return ""


def _subject(d: Decision) -> tuple[str, str]:
    campaign = getattr(d, "campaign", "pool")
    ref = getattr(d, "lease_id", None) or getattr(d, "request_id", None) or ""
    return campaign, ref


class Demo:
    def __init__(self, out: Path, config: Config) -> None:
        self.out = out
        self.config = config
        self.trace = Trace()
        self.broker = Runtime.open(out, config)
        self.broker.listen(self._record)
        self._record_state(0.0)

    # -- recording -----------------------------------------------------------------

    def _record(self, event: Event, decisions: Sequence[Decision]) -> None:
        tr = self.trace
        if isinstance(event, RequestLease):
            # The lease id is the request id; the engine numbers requests in order.
            for d in decisions:
                if isinstance(d, Granted | Queued | Rejected) and _subject(d)[1]:
                    tr.requested_at.setdefault(_subject(d)[1], event.at)
        for d in decisions:
            campaign, ref = _subject(d)
            tr.counts[(campaign, d.kind)] += 1
            if isinstance(d, Granted) and d.starts_at <= d.at:
                tr.latency[campaign].append(d.at - tr.requested_at.get(ref, d.at))
            if isinstance(d, Activated):
                tr.latency[campaign].append(d.at - tr.requested_at.get(ref, d.at))
            if not isinstance(d, Expired | Metered) or (
                isinstance(d, Metered) and tr.counts[(campaign, "meter")] <= 3
            ):
                why = _why(d)
                if why:
                    tr.notable.append((d.at, campaign, f"{d.kind} {ref}".strip(), why))
        self._record_state(event.at)

    def _record_state(self, at: float) -> None:
        eng = self.broker.engine
        tr = self.trace
        tr.times.append(at)
        # In use = placed on nodes: leases still starting are not counted (during a reclaim
        # hand-over their capacity is still the victim's).
        in_use = dict.fromkeys((c.name for c in self.config.campaigns), 0.0)
        for lease in eng.leases.values():
            if lease.state is not LeaseState.STARTING:
                in_use[lease.campaign] = in_use.get(lease.campaign, 0.0) + lease.size[0]
        for name, gpus in in_use.items():
            tr.held[name].append(gpus)
        tr.price.append(eng.price())

    # -- the script ----------------------------------------------------------------

    def ask(self, at: float, campaign: str, gpus: float, duration: float, **kw: object) -> str:
        try:
            decisions = self.broker.submit(
                RequestLease(
                    at=at, campaign=campaign, size={"gpu": gpus}, duration_s=duration, **kw
                )
            )
        except RequestError as exc:
            self.trace.refused.append(f"t={at:.0f}s {campaign}: {exc}")
            return ""
        for d in decisions:
            if isinstance(d, Granted | Queued | Rejected) and d.campaign == campaign:
                return _subject(d)[1]
        return ""

    def release(self, at: float, lease: str) -> None:
        """Release, as a client does: a lease that already ended needs no release."""
        try:
            self.broker.submit(Release(at=at, lease_id=lease))
        except RequestError as exc:
            if exc.code is not ErrorCode.FAILED_PRECONDITION:
                raise

    def run(self) -> None:
        """Play every campaign's script in one time-ordered schedule."""
        b = self.broker
        plan: list[tuple[float, int, Callable[[float], object]]] = []

        def at(t: float, action: Callable[[float], object]) -> None:
            plan.append((t, len(plan), action))

        # Backfill soaks up idle capacity (its first nodes boot: cold path), and comes back
        # every two minutes for whatever is idle beyond the reserve and the headroom.
        backfill: list[str] = []
        for i in range(4):
            at(1.0 + i, lambda t: backfill.append(self.ask(t, "backfill", 64, 3600)))

        def backfill_turn(t: float) -> None:
            b.catch_up(t)
            sup = b.supply()
            gpu = sup.dims["gpu"]
            idle = gpu.available_warm - self.config.policy.warm_headroom.get("gpu", 0.0)
            ask = min(64.0, 8.0 * (idle // 8))
            if ask >= 8:
                backfill.append(self.ask(t, "backfill", ask, 1200, blocking=False))

        for t in range(180, 1700, 120):
            at(float(t), backfill_turn)
        # Naive science: 256 GPUs at once, whatever the price (reclaim path).
        at(120.0, lambda t: self.ask(t, "naive-sci", 256, 900))
        # The victim: 8 GPUs every minute for two minutes, inside its guarantee.
        victim: list[str] = []

        def victim_turn(t: float) -> None:
            if len(victim) >= 2:
                self.release(t, victim.pop(0))
            lease = self.ask(t, "victim", 8, 120, blocking=False)
            if lease:
                victim.append(lease)

        for k in range(29):
            at(30.0 + 60.0 * k, victim_turn)
        # The storm: a burst-sized request every minute from t=300 s to t=900 s, and
        # inference spam at 200 tok/s (asked for in 10 s chunks).
        for t in range(300, 901, 60):
            at(t + 5.0, lambda t: self.ask(t, "storm", 128, 600, blocking=False))
        for t in range(300, 901, 10):
            at(
                t + 7.0,
                lambda t: b.submit(Meter(at=t, campaign="storm", dim="inference", amount=2000)),
            )

        # Adaptive science: reads the supply signals every 3 minutes and asks only while
        # the price is low and there is warm capacity beyond the reserve.
        def adaptive_turn(t: float) -> None:
            b.catch_up(t)
            sup = b.supply()
            if sup.price < 3.0 and sup.dims["gpu"].available_warm >= 32:
                self.ask(t, "adaptive-sci", 64, 600)

        for t in range(40, 1800, 180):
            at(float(t), adaptive_turn)

        # A node holding part of naive-sci's lease fails.
        def node_failure(t: float) -> None:
            b.catch_up(t)
            leases = sorted(b.engine.campaigns["naive-sci"].leases)
            if leases:
                node = b.engine.pool.nodes[sorted(b.engine.leases[leases[0]].pieces)[0]]
                b.submit(NodeLost(at=t, node=node.name))

        at(780.0, node_failure)
        # Backfill hands back what it still holds; the rest ends by expiry.
        at(
            1700.0,
            lambda t: [
                b.submit(Release(at=t, lease_id=x)) for x in backfill if x in b.engine.leases
            ],
        )
        for t, _, action in sorted(plan, key=lambda x: (x[0], x[1])):
            action(t)
        b.catch_up(DURATION_S)

    # -- output ----------------------------------------------------------------------

    def plot_png(self) -> bytes:
        require("matplotlib", extra="plots", feature="the demo report's figure")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tr = self.trace
        fig, (ax, ax2) = plt.subplots(
            2, 1, figsize=(10, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
        )
        names = list(tr.held)
        ax.stackplot(
            tr.times,
            *[tr.held[n] for n in names],
            labels=names,
            colors=[campaign_colour(n) for n in names],
            step="post",
        )
        ax.axhline(
            self.broker.engine.pool.capacity[0], color="black", lw=0.8, ls="--", label="pool"
        )
        ax.set_ylabel("GPUs in use")
        ax.legend(loc="upper left", ncol=3, fontsize=8)
        ax.set_title("GPUs in use by campaign (active leases, placed on nodes)")
        ax2.step(tr.times, tr.price, where="post", color="tab:red")
        ax2.set_ylabel("price\n(credits/GPU-h)")
        ax2.set_xlabel("virtual time (s)")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        return buf.getvalue()

    def summary_rows(self) -> list[dict[str, object]]:
        tr = self.trace
        eng = self.broker.engine
        rows = []
        for c in self.config.campaigns:
            lat = sorted(tr.latency.get(c.name, []))
            p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None
            rows.append(
                {
                    "campaign": c.name,
                    "grants": tr.counts[(c.name, "grant")],
                    "queued": tr.counts[(c.name, "queue")],
                    "refused": tr.counts[(c.name, "reject")],
                    "preempted": tr.counts[(c.name, "preempt_warning")],
                    "revoked": tr.counts[(c.name, "revoke")],
                    "p95 wait (s)": None if p95 is None else round(p95, 1),
                    "credits": round(eng.campaigns[c.name].credits, 1),
                }
            )
        return rows

    def write_report(self, sha: str, audit_line: str) -> Path:
        rows = self.summary_rows()
        png = base64.b64encode(self.plot_png()).decode()
        head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in r.values()) + "</tr>"
            for r in rows
        )
        notable = "".join(
            f"<tr><td>{t:.0f}</td><td>{html.escape(c)}</td><td>{html.escape(k)}</td>"
            f"<td>{html.escape(w)}</td></tr>"
            for t, c, k, w in self.trace.notable
        )
        refused = "".join(f"<li>{html.escape(r)}</li>" for r in self.trace.refused)
        page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bursar demo report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 14px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; }}
th {{ background: #f3f3f3; }}
code {{ background: #f6f6f6; padding: 1px 4px; }}
</style></head><body>
<h1>Bursar demo: 30 minutes on the 512-GPU pool</h1>
<p>Five campaigns negotiated leases with the real policy engine, in virtual time, on the
simulated pool. Every decision below is in the journal next to this file; re-derive them
all with <code>bursar journal audit --state-dir {html.escape(str(self.out))}</code>.</p>
<p>Journal SHA-256: <code>{sha}</code><br>{html.escape(audit_line)}</p>
<h2>Occupancy and price</h2>
<img alt="GPUs held by campaign over time, and the congestion price"
 src="data:image/png;base64,{png}" style="max-width:100%">
<h2>Per campaign</h2>
<table><tr>{head}</tr>{body}</table>
<h2>Requests refused as bad input (nothing changed, nothing journaled)</h2>
<ul>{refused or "<li>none</li>"}</ul>
<h2>Decisions and why</h2>
<table><tr><th>t (s)</th><th>campaign</th><th>decision</th><th>why</th></tr>{notable}</table>
</body></html>
"""
        path = self.out / "report.html"
        path.write_text(page)
        (self.out / "summary.json").write_text(
            json.dumps({"journal_sha256": sha, "campaigns": rows}, indent=2, sort_keys=True)
        )
        return path


def run_demo(out: Path, config: Config | None = None) -> tuple[Demo, str]:
    """Run the scripted session into a fresh state dir ``out``; returns the demo and the
    journal's SHA-256."""
    if (out / "journal.sqlite").exists():
        for name in ("journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"):
            (out / name).unlink(missing_ok=True)
    demo = Demo(out, config or default_config())
    demo.run()
    return demo, demo.broker.journal.sha256()


def play(
    out: Path,
    config: Config | None,
    console: Console,
    *,
    show: int = 25,
    service: bool = True,
) -> bool:
    """``bursar demo``: part 1 (the scripted session into ``out``, what the broker decided
    and why, the audit, ``out/report.html``), then part 2 (the agent session against the
    broker service, state in ``out/service``) unless ``service`` is False.

    True if every audit is clean and the service session succeeded."""
    with console.status("running the demo session..."):
        d, sha = run_demo(out, config)
    table = Table(title="What the broker decided, by campaign", box=box.SIMPLE_HEAD)
    rows = d.summary_rows()
    for k in rows[0]:
        table.add_column(k, justify="left" if k == "campaign" else "right")
    for r in rows:
        table.add_row(*["-" if v is None else str(v) for v in r.values()])
    console.print(table)
    notable = Table(title=f"First {show} decisions and why", box=box.SIMPLE_HEAD)
    for k in ("t (s)", "campaign", "decision", "why"):
        notable.add_column(k, overflow="fold")
    for t, c, k, w in d.trace.notable[:show]:
        notable.add_row(f"{t:.0f}", c, k, w)
    console.print(notable)
    with console.status("auditing the journal..."):
        report = audit(d.broker.journal)
    audit_line = (
        f"audit: {report.events_checked} events, {report.decisions_checked} decisions "
        f"re-derived, {len(report.mismatches)} mismatches"
    )
    path = d.write_report(sha, audit_line)
    d.broker.close()
    console.print(audit_line)
    console.print(f"journal SHA-256: {sha}")
    console.print(
        f"report: [bold]{path}[/bold]  (audit again: bursar journal audit --state-dir {out})"
    )
    service_ok = _service_part(out / "service", console) if service else True
    return report.ok and service_ok


def _service_part(state_dir: Path, console: Console) -> bool:
    """Part 2 of ``bursar demo``; False if it failed or its audit found a mismatch."""
    # The gRPC service and client load only when part 2 runs (not for --no-service).
    from bursar.sim.demo_service import run_service_session

    try:
        result = run_service_session(state_dir, console)
    except Exception as exc:  # the broker has stopped: say what went wrong, exit 1
        logging.getLogger(__name__).debug("the service session failed", exc_info=True)
        console.print(f"[red]service session failed: {escape(str(exc))}[/red]", highlight=False)
        return False
    console.print(f"service session: {result.wall_s:.1f} s of wall time")
    return result.ok


__all__ = ["Demo", "play", "run_demo"]
