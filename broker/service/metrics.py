"""Prometheus metrics on a side HTTP port (``--metrics-port``).

The HTTP server runs in a thread of its own, but it only reads this registry: gauges
that describe the engine are set on the event loop (every second and at start-up), so
the engine is never touched from another thread. Counters and the grant-latency
histogram are updated as calls and decisions happen.

    bursar_leases{campaign,state}               live leases
    bursar_pending_requests{campaign}           queued requests
    bursar_grant_latency_seconds{path}          Acquire: call received -> grant (histogram)
    bursar_bucket_level{campaign,dim}           unit-seconds (+Inf: unlimited)
    bursar_price                                credits per unit-hour of the primary dim
    bursar_pressure                             (firm held + queued) / capacity
    bursar_supply_units{dim,kind}               capacity, warm_free, reserve, reclaimable, cold
    bursar_journal_entries                      entries in the journal
    bursar_journal_bytes                        journal file size (database + WAL)
    bursar_decisions_total{kind}                decisions made by this process
    bursar_journal_commits_total                journal commits by this process (batches)
    bursar_journal_committed_entries_total      entries those commits held
    bursar_rpc_errors_total{method,code}        calls that ended in an error status
    bursar_open_streams                         Watch / WatchSupply streams open
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from bursar.broker.decisions import DECISION_TYPES, Decision, LeasePath
from bursar.broker.runtime import Runtime
from bursar.broker.supply import supply

__all__ = ["Metrics"]

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
        self.bucket = Gauge(
            "bursar_bucket_level",
            "Token bucket level, unit-seconds (+Inf: unlimited)",
            ["campaign", "dim"],
            registry=r,
        )
        self.price = Gauge(
            "bursar_price",
            "Congestion price, credits per unit-hour of the primary dimension",
            registry=r,
        )
        self.pressure = Gauge(
            "bursar_pressure", "(firm units held + queued) / capacity", registry=r
        )
        self.supply = Gauge(
            "bursar_supply_units", "Pool supply by dimension and kind", ["dim", "kind"], registry=r
        )
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
            "bursar_decisions", "Decisions made by this process", ["kind"], registry=r
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
        self._by_kind: dict[str, Any] = {k: self.decisions.labels(k) for k in DECISION_TYPES}
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
        self._http: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    # ----- updates (event loop)

    def on_decisions(self, decisions: Iterable[Decision]) -> None:
        if not self.watched:
            return
        by_kind = self._by_kind
        for d in decisions:
            child = by_kind.get(d.kind)
            if child is None:  # a kind added without a type in DECISION_TYPES
                child = by_kind[d.kind] = self.decisions.labels(d.kind)
            child.inc()

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
        for name in eng.campaigns:
            self.pending.labels(name).set(queued.get(name, 0))
            for d, level in eng.bucket_levels(name, now).items():
                self.bucket.labels(name, d).set(level)
        s = supply(eng)
        self.price.set(s.price)
        self.pressure.set(s.pressure)
        for d, x in s.dims.items():
            for kind in ("capacity", "warm_free", "reserve", "reclaimable", "cold"):
                self.supply.labels(d, kind).set(getattr(x, kind))
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
