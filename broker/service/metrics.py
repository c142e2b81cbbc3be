"""Prometheus metrics on a side HTTP port (``--metrics-port``).

The HTTP server runs in a thread of its own, but it only reads this registry: gauges
that describe the engine are set on the event loop (every second and at start-up), so
the engine is never touched from another thread. Counters and histograms are updated as
calls and decisions happen (only while /metrics is served).

No sample is ever +Inf or NaN (``promtool check metrics`` and most dashboards choke on
them): an unlimited bucket has no ``bursar_bucket_level_unit_seconds`` series at all, and a
dimension a campaign may not use has no envelope series.

    bursar_build_info{version,python}                    1; the labels say what serves
    bursar_leases{campaign,state}                        live leases
    bursar_pending_requests{campaign}                    queued requests
    bursar_held_units{campaign,dim}                      units held by live leases
    bursar_envelope_guarantee_units{campaign,dim}        the campaign's guarantee
    bursar_envelope_burst_units{campaign,dim}            its burst ceiling
    bursar_envelope_sustained_units{campaign,dim}        its sustained (token-free) rate
    bursar_bucket_level_unit_seconds{campaign,dim}       bucket level (absent: unlimited)
    bursar_price_credits_per_unit_hour                   congestion price, primary dim
    bursar_pressure_ratio                                (firm held + queued) / capacity
    bursar_capacity_units{dim}                           total capacity of the pool
    bursar_warm_free_units{dim}                          idle powered capacity (with reserve)
    bursar_guarantee_reserve_units{dim}                  unmet guarantees kept warm
    bursar_reclaimable_units{dim}                        held by preemptible leases
    bursar_cold_units{dim}                               on cold or booting nodes
    bursar_fragmentation_units{dim,kind}                 stranded, partial_free
    bursar_journal_entries                               entries in the journal
    bursar_journal_bytes                                 journal file size (database + WAL)
    bursar_decisions_total{kind,campaign,reason}         decisions made by this process
    bursar_grant_latency_seconds{path}                   Acquire: call received -> grant
    bursar_time_to_usable_seconds{path}                  grant -> usable (grace, boot)
    bursar_rpc_requests_total{method,code}               calls answered, by status code
    bursar_rpc_duration_seconds{method}                  calls: received -> answered
    bursar_rpc_errors_total{method,code}                 calls that ended in an error status
    bursar_journal_commits_total                         journal commits (batches)
    bursar_journal_committed_entries_total               entries those commits held
    bursar_open_streams                                  Watch / WatchSupply streams open
    bursar_role{role}                                    1 for this broker's role: leader
                                                         or standby (shared journal), or
                                                         single (SQLite)
    bursar_leader_epoch                                  the journal's leadership epoch as
                                                         this broker last read it (0: SQLite)
    bursar_leadership_changes_total                      times this process took the lead
    bursar_standby_lag_entries{address}                  committed entries a standby had
                                                         not applied, as the store says
    bursar_standby_lag_seconds{address}                  how long the oldest of them had
                                                         been in the journal

Until it leads, a standby serves a registry of its own with only the leadership series set
(its role, the epoch, every standby's lag; the engine's series empty or 0); then the
service's registry takes the port. Every broker's port
carries every standby's lag as the store records it (each standby reports at every poll);
a standby that stopped reporting keeps its last lag, and ``bursar status`` says when it
last reported.
"""

from __future__ import annotations

import contextlib
import math
import platform
import threading
from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from bursar.broker import dims
from bursar.broker.decisions import Activated, Decision, Granted, LeasePath
from bursar.broker.runtime import Runtime
from bursar.broker.supply import supply

__all__ = ["METRIC_NAMES", "Metrics"]

_ENDS = frozenset({"revoke", "expire", "release"})
"""Decision kinds that end a lease (one still starting is then never usable)."""

_BOOT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Grant -> usable: 0 on the warm path, the grace period or a node's boot on the others."""

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.leases = Gauge("bursar_leases", "Live leases", ["campaign", "state"], registry=r)
        self.pending = Gauge(
            "bursar_pending_requests", "Requests waiting in the queue", ["campaign"], registry=r
        )
        self.grant_latency = Histogram(
            "bursar_grant_latency_seconds",
            "Acquire calls: seconds from receiving the call to the grant",
            ["path"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.build_info = Gauge(
            "bursar_build_info",
            "Always 1: the labels say which Bursar and Python serve",
            ["version", "python"],
            registry=r,
        )
        try:
            served = version("bursar")
        except PackageNotFoundError:
            served = "unknown"
        self.build_info.labels(served, platform.python_version()).set(1)
        self.held = Gauge(
            "bursar_held_units",
            "Units held by the campaign's live leases, per placed dimension",
            ["campaign", "dim"],
            registry=r,
        )
        self.envelope = {
            kind: Gauge(
                f"bursar_envelope_{kind}_units",
                f"The campaign's envelope: its {text}, per dimension it may use",
                ["campaign", "dim"],
                registry=r,
            )
            for kind, text in (
                ("guarantee", "guarantee"),
                ("burst", "burst ceiling (most units held at once)"),
                ("sustained", "sustained rate (units held, or per second, that cost no tokens)"),
            )
        }
        self.bucket = Gauge(
            "bursar_bucket_level_unit_seconds",
            "Token bucket level, unit-seconds; no series for an unlimited bucket",
            ["campaign", "dim"],
            registry=r,
        )
        self.price = Gauge(
            "bursar_price_credits_per_unit_hour",
            "Congestion price, credits per unit-hour of the primary dimension",
            registry=r,
        )
        self.pressure = Gauge(
            "bursar_pressure_ratio", "(firm units held + queued) / capacity", registry=r
        )
        self.supply = {
            kind: Gauge(f"bursar_{name}_units", text, ["dim"], registry=r)
            for kind, name, text in (
                ("capacity", "capacity", "Total capacity of the pool"),
                ("warm_free", "warm_free", "Idle powered capacity, the guarantee reserve included"),
                ("reserve", "guarantee_reserve", "Unmet guarantees, kept warm for their owners"),
                ("reclaimable", "reclaimable", "Held by preemptible leases: after the grace"),
                ("cold", "cold", "On cold or booting nodes: after the boot latency"),
            )
        }
        self.fragmentation = Gauge(
            "bursar_fragmentation_units",
            "Free capacity on powered nodes that node-shaped requests cannot use, by dimension: "
            "stranded (unusable at the pool's typical ratio per primary unit) and partial_free "
            "(on partly used nodes, out of reach of whole-node requests)",
            ["dim", "kind"],
            registry=r,
        )
        self.journal_entries = Gauge("bursar_journal_entries", "Entries in the journal", registry=r)
        self.journal_bytes = Gauge(
            "bursar_journal_bytes", "Journal file size, database plus WAL, bytes", registry=r
        )
        self.decisions = Counter(
            "bursar_decisions",
            "Decisions made by this process, by kind, campaign (empty: the pool's) and reason "
            "(queue and reject only; else empty)",
            ["kind", "campaign", "reason"],
            registry=r,
        )
        self.time_to_usable = Histogram(
            "bursar_time_to_usable_seconds",
            "Granted leases: seconds from the grant until usable (0 warm; the grace "
            "period on the reclaim path, the boot on the cold path)",
            ["path"],
            buckets=_BOOT_BUCKETS,
            registry=r,
        )
        self.rpc_requests = Counter(
            "bursar_rpc_requests",
            "Calls answered (unary) or ended (streams), by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.rpc_duration = Histogram(
            "bursar_rpc_duration_seconds",
            "Unary calls: seconds from receiving the call to the answer (a blocking Acquire "
            "includes its wait in the queue)",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # prometheus_client's labels() costs microseconds per call, and a request makes two
        # or three decisions: every child is bound once, here.
        self.commits = Counter(
            "bursar_journal_commits", "Journal commits by this process (batches)", registry=r
        )
        self.committed_entries = Counter(
            "bursar_journal_committed_entries",
            "Journal entries committed by this process (entries per commit: over the commits)",
            registry=r,
        )
        self._by_kind: dict[tuple[str, str, str], Any] = {}
        """Bound children by (kind, campaign, reason), made on first use."""
        self._usable: dict[tuple[str, ...], Any] = {
            p.value: self.time_to_usable.labels(p.value) for p in LeasePath
        }
        self._starting: dict[str, tuple[str, float]] = {}
        """Leases granted on the reclaim or cold path, not usable yet: (path, granted at)."""
        self._by_path: dict[str, Any] = {
            p.value: self.grant_latency.labels(p.value) for p in LeasePath
        }
        self.watched = False
        """True once /metrics is served: until then nobody can read the per-request counters
        and histogram, and the requests skip updating them (the gauges are set by
        ``refresh`` either way)."""
        self.rpc_errors = Counter(
            "bursar_rpc_errors",
            "Calls that ended in an error status",
            ["method", "code"],
            registry=r,
        )
        self.open_streams = Gauge("bursar_open_streams", "Server streams open", registry=r)
        self.role = Gauge(
            "bursar_role",
            "1 for this broker's role: leader, standby or single",
            ["role"],
            registry=r,
        )
        self.epoch = Gauge(
            "bursar_leader_epoch",
            "The journal's leadership epoch as this broker last read it (0: SQLite)",
            registry=r,
        )
        self.leadership_changes = Counter(
            "bursar_leadership_changes",
            "Times this process took the lead of a shared journal",
            registry=r,
        )
        self.standby_lag = Gauge(
            "bursar_standby_lag_entries",
            "Committed journal entries a standby had not applied, as it last reported",
            ["address"],
            registry=r,
        )
        self.standby_lag_s = Gauge(
            "bursar_standby_lag_seconds",
            "How long the oldest entry a standby had not applied had been in the journal",
            ["address"],
            registry=r,
        )
        self._http: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # ----- updates (event loop)

    def on_decisions(self, decisions: Iterable[Decision]) -> None:
        if not self.watched:
            return
        by_kind = self._by_kind
        for d in decisions:
            reason = getattr(d, "reason", None)
            key = (d.kind, getattr(d, "campaign", "") or "", reason.value if reason else "")
            child = by_kind.get(key)
            if child is None:
                child = by_kind[key] = self.decisions.labels(*key)
            child.inc()
            if isinstance(d, Granted):
                if d.starts_at <= d.at:
                    self._usable[d.path.value].observe(0.0)
                else:
                    self._starting[d.lease_id] = (d.path.value, d.at)
            elif isinstance(d, Activated) or d.kind in _ENDS:
                started = self._starting.pop(getattr(d, "lease_id", ""), None)
                if started is not None and isinstance(d, Activated):
                    self._usable[started[0]].observe(max(0.0, d.at - started[1]))

    def on_rpc(self, method: str, code: str, seconds: float | None) -> None:
        """A call ended with status ``code`` (``OK`` included), after ``seconds`` (None
        for a stream: its life is no latency)."""
        if not self.watched:
            return
        self.rpc_requests.labels(method, code).inc()
        if seconds is not None:
            self.rpc_duration.labels(method).observe(seconds)

    def on_commit(self, entries: int) -> None:
        if self.watched:
            self.commits.inc()
            self.committed_entries.inc(entries)

    def observe_grant(self, path: str, seconds: float) -> None:
        if not self.watched:
            return
        child = self._by_path.get(path)
        if child is None:
            child = self._by_path[path] = self.grant_latency.labels(path)
        child.observe(seconds)

    def refresh(self, broker: Runtime, now: float, open_streams: int) -> None:
        eng = broker.engine
        self.leases.clear()
        counts: dict[tuple[str, str], int] = {}
        for ls in eng.holders_leases():
            key = (ls.campaign, ls.state.value)
            counts[key] = counts.get(key, 0) + 1
        for (campaign, state), n in counts.items():
            self.leases.labels(campaign, state).set(n)
        self.pending.clear()
        queued: dict[str, int] = {}
        for p in eng.pending.values():
            queued[p.campaign] = queued.get(p.campaign, 0) + 1
        for g in (self.held, self.bucket, *self.envelope.values()):
            g.clear()  # a campaign's dimensions (and buckets) change with its envelope
        for name, c in eng.campaigns.items():
            self.pending.labels(name).set(queued.get(name, 0))
            for i, d in enumerate(dims.PLACED):
                if d in c.spec.envelopes or c.held[i]:
                    self.held.labels(name, d).set(c.held[i])
            for d, env in c.spec.envelopes.items():
                for kind, g in self.envelope.items():
                    g.labels(name, d).set(getattr(env, kind))
            for d, level in eng.bucket_levels(name, now).items():
                if math.isfinite(level):  # unlimited: no series (see the module doc)
                    self.bucket.labels(name, d).set(level)
        s = supply(eng)
        self.price.set(s.price)
        self.pressure.set(s.pressure)
        for d, x in s.dims.items():
            for kind, g in self.supply.items():
                g.labels(d).set(getattr(x, kind))
            for kind in ("stranded", "partial_free"):
                self.fragmentation.labels(d, kind).set(getattr(x, kind))
        self.journal_entries.set(broker.journal.last_seq)
        path: Path = broker.journal.path
        size = 0
        for p in (path, path.with_name(path.name + "-wal")):
            with contextlib.suppress(OSError):
                size += p.stat().st_size
        self.journal_bytes.set(size)
        self.open_streams.set(open_streams)

    def on_lead(self, role: str, epoch: int, took: bool = False) -> None:
        """This broker's role (leader, standby, single) and the epoch; ``took``: it took
        the lead now."""
        self.role.clear()
        self.role.labels(role).set(1)
        self.epoch.set(epoch)
        if took:
            self.leadership_changes.inc()

    def on_topology(self, standbys: Iterable[tuple[str, int, float]]) -> None:
        """Each standby's (address, lag in entries, lag in seconds), as the store says."""
        self.standby_lag.clear()
        self.standby_lag_s.clear()
        for address, entries, seconds in standbys:
            self.standby_lag.labels(address).set(entries)
            self.standby_lag_s.labels(address).set(seconds)

    # ----- the HTTP side port

    def start_http(self, host: str, port: int) -> int:
        """Serve /metrics on ``host:port`` (0: any free port); returns the port."""
        self._http, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.watched = True
        return int(self._http.server_port)

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def _metric_names() -> frozenset[str]:
    out: set[str] = set()
    for m in Metrics().registry.collect():
        out.add(m.name)
        out.update(m.name + suffix for suffix in _SUFFIXES.get(m.type, ()))
    return frozenset(out)


METRIC_NAMES = _metric_names()
"""Every series name the broker exports (what a dashboard's queries may name)."""
