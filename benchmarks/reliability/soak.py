"""Soak: many agents on one broker for a while, with Watch and WatchSupply streams open.

Each agent (an asyncio task on its own gRPC channel, all in this process) loops: acquire
(mostly non-blocking, some blocking for up to a second), hold the lease while renewing it
once or twice, release it (one lease in ten is left to expire). One agent in five also
keeps a Watch stream on its campaign open, one in ten a WatchSupply stream.

Reported: every call's outcome by gRPC status code, expected refusals (RESOURCE_EXHAUSTED,
and FAILED_PRECONDITION on a renewal that raced its own expiry) counted by reason apart
from failures (anything else: UNKNOWN, INTERNAL, UNAVAILABLE...); the server's RSS and
open file descriptors at start and end, and its RSS every few seconds throughout (the
series, and the growth after a settling time, show whether memory levels off); non-blocking acquire latency p50/p99/p99.9/max per
window (a minute in long mode, 10 s in short); every call slower than 100 ms, clustered
into stalls (calls within 50 ms of each other, from several agents). With
``BURSAR_STALL_LOG=1`` the server logs what held its event loop (garbage collections,
journal commits, WAL checkpoints over 100 ms); those lines are kept with the figures so a
stall can be matched to its cause.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from common import Mode, Result, quantiles
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from server import Server, md, pool_toml, proc_stats

from bursar.broker.service.stalls import run_queue_wait_s
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

SIZES = {
    # agents, seconds, window seconds, campaigns, nodes
    "short": (24, 40.0, 10.0, 4, 8),
    "long": (60, 600.0, 60.0, 6, 20),
}

SLOW_S = 0.1
"""A call slower than this is listed (and counted toward a stall)."""

EXPECTED = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION}
"""Refusals a well-behaved agent meets under load; any other code is a failure."""


def reason_of(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a bursar error ('' when it carries none)."""
    status = rpc_status.from_call(err)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return info.reason
    return ""


@dataclass
class Tally:
    ok: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    acquire_lat: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since start, latency) of every non-blocking Acquire."""
    slow: list[tuple[float, float, str, int]] = field(default_factory=list)
    """(start, latency, call, agent) of every call slower than SLOW_S."""
    events: int = 0
    supplies: int = 0
    stream_errors: Counter[str] = field(default_factory=Counter)


class Agent:
    def __init__(
        self, n: int, address: str, token: str, rng: random.Random, t0: float, tally: Tally
    ) -> None:
        self.n = n
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = pbg.BrokerStub(self.channel)
        self.md = md(token)
        self.rng = rng
        self.t0 = t0
        self.tally = tally

    async def call(self, name: str, fn: object, req: object) -> object | None:
        start = time.monotonic()
        try:
            out = await fn(req, metadata=self.md, timeout=30)  # type: ignore[operator]
            self.tally.ok[name] += 1
            return out
        except grpc.aio.AioRpcError as err:
            code = err.code()
            key = f"{name} {code.name} {reason_of(err)}".rstrip()
            (self.tally.refused if code in EXPECTED else self.tally.failed)[key] += 1
            return None
        finally:
            lat = time.monotonic() - start
            at = start - self.t0
            if name == "Acquire":
                self.tally.acquire_lat.append((at, lat))
            if lat > SLOW_S and name != "Acquire(blocking)":
                self.tally.slow.append((at, lat, name, self.n))

    async def loop(self, stop: asyncio.Event) -> None:
        rng = self.rng
        i = 0
        # Agents start apart, as independent ones do, not as one burst of fifty calls.
        await asyncio.sleep(rng.uniform(0, 0.5))
        while not stop.is_set():
            i += 1
            blocking = rng.random() < 0.2
            req = pb.AcquireRequest(
                # As the client library does: a fresh key on every call (the broker keeps
                # each for a day, so they add to what it holds in memory).
                idempotency_key=f"agent{self.n}-{i}",
                size={"gpu": rng.choice((1, 1, 2, 2, 4))},
                duration_s=rng.uniform(3, 8),
                timeout_s=1.0 if blocking else 0.0,
                labels={"agent": str(self.n)},
            )
            got = await self.call(
                "Acquire(blocking)" if blocking else "Acquire", self.stub.Acquire, req
            )
            if got is None:
                await asyncio.sleep(rng.uniform(0.05, 0.3))
                continue
            lease_id = got.lease.lease_id  # type: ignore[attr-defined]
            for _ in range(rng.randint(0, 2)):
                await asyncio.sleep(rng.uniform(0.1, 0.8))
                renew = pb.RenewRequest(lease_id=lease_id, duration_s=rng.uniform(3, 8))
                await self.call("Renew", self.stub.Renew, renew)
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            if rng.random() < 0.9:
                await self.call("Release", self.stub.Release, pb.ReleaseRequest(lease_id=lease_id))

    async def watch(self, stop: asyncio.Event) -> None:
        stream = self.stub.Watch(pb.WatchRequest(), metadata=self.md)
        await self._follow(stream, stop, "Watch")

    async def watch_supply(self, stop: asyncio.Event) -> None:
        stream = self.stub.WatchSupply(
            pb.WatchSupplyRequest(min_interval_s=0.2, max_interval_s=2), metadata=self.md
        )
        await self._follow(stream, stop, "WatchSupply")

    async def _follow(
        self, stream: grpc.aio.UnaryStreamCall, stop: asyncio.Event, name: str
    ) -> None:
        reader = asyncio.ensure_future(self._read(stream, name))
        await stop.wait()
        stream.cancel()
        await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, stream: grpc.aio.UnaryStreamCall, name: str) -> None:
        try:
            async for _ in stream:
                if name == "Watch":
                    self.tally.events += 1
                else:
                    self.tally.supplies += 1
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                self.tally.stream_errors[f"{name} {err.code().name} {reason_of(err)}"] += 1


class ClientProbe:
    """This process's side of a stall: a 10 ms heartbeat on the agents' event loop that
    notes each time it woke late, with the garbage collection and run-queue wait (waiting
    for a CPU) of the loop's thread meanwhile."""

    def __init__(self) -> None:
        self.held: list[tuple[float, float, str]] = []
        """(start, end, what) on the monotonic clock, for each wake-up over 50 ms late."""
        self.gc_s = 0.0
        self._gc0 = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc0 = time.monotonic()
        else:
            self.gc_s += time.monotonic() - self._gc0

    async def run(self, stop: asyncio.Event) -> None:
        gc.callbacks.append(self._on_gc)
        try:
            wait0 = run_queue_wait_s()
            while not stop.is_set():
                gc0, t0 = self.gc_s, time.monotonic()
                await asyncio.sleep(0.01)
                t1 = time.monotonic()
                wait1 = run_queue_wait_s()
                if t1 - t0 - 0.01 > SLOW_S / 2:
                    what = (
                        f"client loop held {(t1 - t0 - 0.01) * 1000:.0f} ms (gc "
                        f"{(self.gc_s - gc0) * 1000:.0f} ms, waiting for a CPU "
                        f"{(wait1 - wait0) * 1000:.0f} ms)"
                    )
                    self.held.append((t0, t1, what))
                wait0 = wait1
        finally:
            gc.callbacks.remove(self._on_gc)


_MONO = re.compile(r"stall-log: mono ([0-9.]+): (.*)")


def server_spells(lines: list[str]) -> list[tuple[float, float, str]]:
    """(start, end, what) of each slow spell the server's stall log reported."""
    out = []
    for line in lines:
        m = _MONO.search(line)
        if m is None:
            continue
        end, what = float(m.group(1)), m.group(2)
        took = re.search(r"(\d+) ms", what)
        out.append((end - (int(took.group(1)) / 1000 if took else 0.0), end, f"server {what}"))
    return out


class RssSampler:
    """The server's resident memory every ``every_s`` seconds, on a thread: (seconds since
    ``t0``, MiB) pairs."""

    def __init__(self, server_pid: int, every_s: float) -> None:
        self.pid = server_pid
        self.every_s = every_s
        self.t0 = time.monotonic()
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            try:
                rss = proc_stats(self.pid)["rss_mib"]
            except OSError:
                return  # the server is gone
            self.samples.append((round(time.monotonic() - self.t0, 1), rss))
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def rss_growth(samples: list[tuple[float, float]], settle_s: float) -> dict[str, float] | None:
    """RSS at the first sample from ``settle_s`` on, at the last sample, and the growth
    between them in percent (None when the run ended before ``settle_s``)."""
    after = [(t, m) for t, m in samples if t >= settle_s]
    if len(after) < 2:
        return None
    (t_a, a), (t_b, b) = after[0], after[-1]
    return {
        "from_s": t_a,
        "to_s": t_b,
        "from_mib": a,
        "to_mib": b,
        "growth_pct": round((b - a) / a * 100, 2),
    }


def plot_rss(samples: list[tuple[float, float]], settle_s: float, title: str, out: Path) -> None:
    """The RSS series as a PNG (matplotlib, from the ``plots`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t / 60 for t, _ in samples], [m for _, m in samples], lw=1.5)
    ax.axvline(settle_s / 60, color="grey", ls="--", lw=1, label=f"{settle_s / 60:g} min")
    ax.set_xlabel("minutes since the load started")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


class CpuSampler:
    """Every 20 ms, on a thread: the CPU time and run-queue wait (runnable, waiting for a
    CPU) of the server's and this process's event-loop threads, and the machine's idle
    time, so that a stall can be matched to CPU starvation."""

    def __init__(self, server_pid: int) -> None:
        # This process's event loop runs on the thread that builds the sampler.
        self.files = (
            f"/proc/{server_pid}/task/{server_pid}/schedstat",
            f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat",
        )
        self.samples: list[tuple[float, float, float, float, float, float]] = []
        """(mono, server cpu s, server wait s, client cpu s, client wait s, machine idle s)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _read(self) -> tuple[float, float, float, float, float, float]:
        out: list[float] = [time.monotonic()]
        for f in self.files:
            try:
                with open(f) as fh:
                    cpu, wait = fh.read().split()[:2]
                out += [int(cpu) / 1e9, int(wait) / 1e9]
            except (OSError, ValueError):
                out += [0.0, 0.0]
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
        out.append((int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK"))
        return tuple(out)  # type: ignore[return-value]

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.samples.append(self._read())

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def over(self, lo: float, hi: float) -> tuple[float, float, float] | None:
        """(server wait, client wait, machine idle fraction) between ``lo`` and ``hi``."""
        inside = [x for x in self.samples if lo - 0.02 <= x[0] <= hi + 0.02]
        if len(inside) < 2:
            return None
        a, b = inside[0], inside[-1]
        span = max(b[0] - a[0], 1e-3)
        ncpu = os.cpu_count() or 1
        return b[2] - a[2], b[4] - a[4], min(1.0, (b[5] - a[5]) / (span * ncpu))


def attribute(
    found: list[dict[str, object]],
    t0: float,
    spells: list[tuple[float, float, str]],
    cpu: CpuSampler,
) -> None:
    """Give each stall its causes (the server's and this process's slow spells that overlap
    it, and the run-queue wait of the two event-loop threads over it) and a ``kind``:
    'cpu-starved' when either thread spent 30% of the stall or more waiting for a CPU (a
    collection or a callback that waited that long was mostly not running), else the kinds
    of the spells that overlap it, else 'unexplained'."""
    for s in found:
        lo, hi = t0 + s["at"], t0 + s["end"]  # type: ignore[operator]
        causes = [what for a, b, what in spells if a <= hi + 0.02 and b >= lo - 0.02]
        kinds = sorted({_kind(x) for x in causes})
        seen = cpu.over(lo, hi)
        if seen is not None:
            srv, cli, idle = seen
            s["cpu_wait_ms"] = {"server": round(srv * 1000), "client": round(cli * 1000)}
            s["machine_idle"] = round(idle, 2)
            if max(srv, cli) >= 0.3 * (hi - lo):
                kinds = ["cpu-starved"]
                causes.append(
                    f"waiting for a CPU: server {srv * 1000:.0f} ms, client {cli * 1000:.0f} ms "
                    f"of {(hi - lo) * 1000:.0f}; machine idle {idle:.0%}"
                )
        s["causes"] = causes
        s["kind"] = "+".join(kinds) or "unexplained"


def stalls(slow: list[tuple[float, float, str, int]]) -> list[dict[str, object]]:
    """Slow calls grouped by overlap: calls in flight at the same moment form one stall."""
    out: list[dict[str, object]] = []
    for at, lat, _name, agent in sorted(slow):
        if out and at <= out[-1]["end"]:  # type: ignore[operator]
            s = out[-1]
            s["end"] = max(s["end"], at + lat)  # type: ignore[call-overload]
            s["calls"] += 1  # type: ignore[operator]
            s["agents"].add(agent)  # type: ignore[attr-defined]
            s["max_s"] = max(s["max_s"], lat)  # type: ignore[call-overload]
        else:
            out.append({"at": at, "end": at + lat, "calls": 1, "agents": {agent}, "max_s": lat})
    for s in out:
        s["agents"] = len(s["agents"])  # type: ignore[arg-type]
        s["at"] = round(s["at"], 2)  # type: ignore[call-overload]
        s["end"] = round(s["end"], 2)  # type: ignore[call-overload]
        s["max_s"] = round(s["max_s"], 3)  # type: ignore[call-overload]
    return out


def _kind(what: str) -> str:
    """A spell's kind, for counting: its side (server or client) and what took the time."""
    side, rest = what.split(" ", 1)
    if rest.startswith("gc generation"):
        return f"{side} gc"
    m = re.match(r"(journal\.\w+|metrics\.\w+) ", rest) or re.search(
        r"slow calls: (journal\.\w+|metrics\.\w+)", rest
    )
    if m:
        return f"{side} {m.group(1)}"
    m = re.search(r"gc (\d+) ms.*waiting for a CPU (\d+) ms", rest)
    if m:
        gc_ms, cpu_ms = int(m.group(1)), int(m.group(2))
        if cpu_ms >= gc_ms and cpu_ms > 20:
            return f"{side} cpu-starved"
        if gc_ms > 20:
            return f"{side} gc"
    held = re.match(r"event loop held (\d+) ms", rest)
    work = re.search(r"work: decide \d+ calls (\d+) ms, .*?commit \d+ calls (\d+) ms", rest)
    if held and work and int(work.group(1)) + int(work.group(2)) >= int(held.group(1)) / 2:
        # Most of the spell was the service deciding and committing: calls that arrived
        # together, each waiting for those before it.
        return f"{side} backlog"
    return f"{side} loop held"


def run(
    mode: Mode,
    work_dir: Path,
    *,
    stall_log: bool = True,
    agents: int | None = None,
    seconds: float | None = None,
    window_s: float | None = None,
    policy: Mapping[str, str] | None = None,
    rss_every_s: float | None = None,
    settle_s: float | None = None,
) -> Result:
    """The soak at ``mode``'s size, or with ``agents``, ``seconds`` and ``window_s`` given;
    ``policy`` adds settings to the pool file's ``[policy]`` table (TOML values as text).
    RSS is sampled every ``rss_every_s`` (default: a 60th of the run, 1 s at least) and its
    growth reported from ``settle_s`` (default: a sixth of the run) to the end."""
    agents_n, seconds_d, window_d, campaigns_n, nodes = SIZES[mode]
    agents_n = agents if agents is not None else agents_n
    seconds = seconds if seconds is not None else seconds_d
    window_s = window_s if window_s is not None else window_d
    res = Result("soak")
    names = [f"c{i}" for i in range(campaigns_n)]
    cfg = work_dir / "pool.toml"
    text = pool_toml(nodes=nodes, campaigns={n: nodes * 8 / 2 for n in names})
    extra = "".join(f"\n{k} = {v}" for k, v in (policy or {}).items())
    cfg.write_text(text.replace("[policy]", "[policy]" + extra, 1))
    rss_every_s = rss_every_s if rss_every_s is not None else max(1.0, seconds / 60)
    settle_s = settle_s if settle_s is not None else seconds / 6
    env = {"BURSAR_STALL_LOG": "1"} if stall_log else {}
    server = Server(work_dir / "state", "--config", str(cfg), env=env)
    try:
        tokens = server.tokens()
        tally = Tally()
        start_stats = proc_stats(server.pid)
        probe = ClientProbe()
        cpu = CpuSampler(server.pid)
        rss = RssSampler(server.pid, rss_every_s)
        started: list[float] = []

        async def main() -> None:
            stop = asyncio.Event()
            t0 = time.monotonic()
            agents = [
                Agent(i, server.address, tokens[names[i % len(names)]], random.Random(i), t0, tally)
                for i in range(agents_n)
            ]
            # Connected before the clock starts: the first window measures calls, not
            # fifty TCP and HTTP/2 handshakes at once.
            await asyncio.gather(*(a.channel.channel_ready() for a in agents))
            t0 = time.monotonic()
            started.append(t0)
            rss.t0 = t0
            for a in agents:
                a.t0 = t0
            tasks = [asyncio.ensure_future(probe.run(stop))]
            tasks += [asyncio.ensure_future(a.loop(stop)) for a in agents]
            tasks += [asyncio.ensure_future(a.watch(stop)) for a in agents[::5]]
            tasks += [asyncio.ensure_future(a.watch_supply(stop)) for a in agents[::10]]
            await asyncio.sleep(seconds)
            stop.set()
            await asyncio.gather(*tasks)
            for a in agents:
                await a.channel.close()

        with cpu, rss:
            asyncio.run(main())
        # Streams and channels are closed: their descriptors should be gone too.
        time.sleep(0.5)
        end_stats = proc_stats(server.pid)
        stopped = server.kill(signal.SIGTERM)  # the stall log's summary comes on the way out
    finally:
        server.close()

    windows: dict[int, list[float]] = {}
    for at, lat in tally.acquire_lat:
        windows.setdefault(int(at // window_s), []).append(lat)
    per_window = []
    for w in sorted(windows):
        q = quantiles(windows[w])
        per_window.append(
            {
                "from_s": w * window_s,
                **{k: (v if k == "n" else round(v * 1000, 2)) for k, v in q.items()},
            }
        )
    overall = quantiles([lat for _, lat in tally.acquire_lat])
    found = stalls(tally.slow)
    stall_lines = [line.rstrip() for line in server.errors if "stall-log" in line]
    attribute(found, started[0], server_spells(stall_lines) + probe.held, cpu)
    causes = Counter(str(s["kind"]) for s in found)
    # Samples taken while the agents were still connecting have t < 0: the load starts at 0.
    rss_series = [(t, m) for t, m in rss.samples if t >= 0]
    growth = rss_growth(rss_series, settle_s)
    res.figures.update(
        agents=agents_n,
        seconds=seconds,
        window_s=window_s,
        watch_streams=len(range(0, agents_n, 5)),
        supply_streams=len(range(0, agents_n, 10)),
        ok=dict(tally.ok),
        refused=dict(tally.refused),
        failed=dict(tally.failed),
        stream_errors=dict(tally.stream_errors),
        watch_events=tally.events,
        supply_snapshots=tally.supplies,
        server_start=start_stats,
        server_end=end_stats,
        policy=dict(policy or {}),
        rss_every_s=rss_every_s,
        rss_mib=rss_series,
        rss_growth=growth,
        acquire_ms=[  # per window
            *per_window
        ],
        acquire_ms_overall={k: (v if k == "n" else round(v * 1000, 2)) for k, v in overall.items()},
        slow_calls=len(tally.slow),
        stalls=found,
        stall_causes=dict(causes),
        client_spells=[what for _, _, what in probe.held][:50],
        server_stall_log=stall_lines[-50:],
    )
    total_ok = sum(tally.ok.values())
    res.lines += [
        f"{agents_n} agents for {seconds:.0f} s ({res.figures['watch_streams']} Watch, "
        f"{res.figures['supply_streams']} WatchSupply streams): {total_ok} calls ok, "
        f"{sum(tally.refused.values())} refused as expected, {sum(tally.failed.values())} failed",
        f"refusals: {dict(tally.refused.most_common(6))}",
        f"stream events: {tally.events} lease events, {tally.supplies} supply snapshots",
        f"server RSS {start_stats['rss_mib']} -> {end_stats['rss_mib']} MiB, "
        f"fds {start_stats['fds']:.0f} -> {end_stats['fds']:.0f}",
        (
            f"server RSS from {growth['from_s']:.0f} s to {growth['to_s']:.0f} s: "
            f"{growth['from_mib']} -> {growth['to_mib']} MiB ({growth['growth_pct']:+.1f}%)"
            if growth
            else "server RSS: the run was shorter than its settling time"
        ),
        "acquire ms per window: "
        + "; ".join(
            f"{w['from_s']:.0f}s n={w['n']} p50 {w['p50']} p99 {w['p99']} p99.9 {w['p999']} "
            f"max {w['max']}"
            for w in per_window
        ),
        "acquire ms overall: "
        + " ".join(f"{k} {res.figures['acquire_ms_overall'][k]}" for k in ("n", "p50", "p99"))
        + f" p99.9 {res.figures['acquire_ms_overall']['p999']} "
        + f"max {res.figures['acquire_ms_overall']['max']}",
        f"calls over {SLOW_S * 1000:.0f} ms: {len(tally.slow)}; stalls (overlapping slow "
        f"calls, at s / max s / agents): {[(s['at'], s['max_s'], s['agents']) for s in found][:10]}",
        f"stalls by cause: {dict(causes)}",
    ]
    summary = [x for x in stall_lines if "summary" in x]
    held = [x for x in stall_lines if "summary" not in x]
    res.lines.append(
        f"server stall log: {len(held)} slow spells {held[:5]}; "
        + (summary[-1].split("stall-log: ", 1)[-1] if summary else "no summary")
    )
    if stopped != 0:
        res.fail(f"the server exited {stopped} on SIGTERM")
    if tally.failed:
        res.fail(f"failed calls: {dict(tally.failed)}")
    if tally.stream_errors:
        res.fail(f"streams broken: {dict(tally.stream_errors)}")
    if not tally.events or not tally.supplies:
        res.fail("the streams delivered nothing")
    if end_stats["fds"] > start_stats["fds"] + 10:
        res.fail(f"descriptors grew from {start_stats['fds']} to {end_stats['fds']}")
    return res


def main(argv: list[str] | None = None) -> int:
    """Run the soak alone, at a size of one's choosing; prints its summary and writes the
    figures as JSON."""
    import argparse
    import json
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("short", "long"), default="short", help="default sizes")
    ap.add_argument("--agents", type=int, help="agents (default: the mode's)")
    ap.add_argument("--seconds", type=float, help="how long (default: the mode's)")
    ap.add_argument("--window", type=float, help="seconds per latency window (the mode's)")
    ap.add_argument("--out", type=Path, help="write the figures here as JSON")
    ap.add_argument("--no-stall-log", action="store_true", help="run without BURSAR_STALL_LOG")
    ap.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a [policy] setting for the pool file (TOML value), repeatable",
    )
    ap.add_argument("--rss-every", type=float, help="seconds between RSS samples")
    ap.add_argument("--settle", type=float, help="seconds before RSS growth is counted")
    ap.add_argument("--plot", type=Path, help="write the RSS series as a PNG here")
    args = ap.parse_args(argv)
    policy = {}
    for item in args.policy:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            ap.error(f"--policy {item!r}: expected KEY=VALUE")
        policy[key.strip()] = value.strip()
    with tempfile.TemporaryDirectory(prefix="bursar-soak-") as work:
        res = run(
            args.mode,
            Path(work),
            stall_log=not args.no_stall_log,
            agents=args.agents,
            seconds=args.seconds,
            window_s=args.window,
            policy=policy,
            rss_every_s=args.rss_every,
            settle_s=args.settle,
        )
    for line in res.lines:
        print(line)
    for p in res.problems:
        print(f"PROBLEM: {p}")
    if args.out is not None:
        args.out.write_text(json.dumps(res.figures, indent=2, default=str))
    if args.plot is not None and res.figures.get("rss_mib"):
        growth = res.figures["rss_growth"]
        title = f"{res.figures['agents']} agents, {res.figures['seconds'] / 60:g} min"
        if growth:
            title += f": {growth['growth_pct']:+.1f}% after {growth['from_s'] / 60:.0f} min"
        plot_rss(res.figures["rss_mib"], growth["from_s"] if growth else 0.0, title, args.plot)
    return 0 if res.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
