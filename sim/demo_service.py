"""Part two of ``bursar demo``: a short agent session against the real broker service.

The first part of the demo drives the engine directly, in virtual time. This part starts
the gRPC service (``bursar.broker.service.server.running``: the same life cycle as
``bursar serve``) on loopback, port 0, on the packaged 512-GPU pool, with a fresh state
directory, and plays two agents over real gRPC with the client library
(``bursar.providers.client``), using the campaign tokens the service wrote to
``STATE/tokens.json``:

1. the backfill agent acquires a preemptible lease and holds it (``held_lease``: watched
   on a Watch stream, renewed in the background, released on exit);
2. the science agent (campaign ``adaptive-sci``) reads the supply signals;
3. the science agent asks for more than warm capacity can give, so the broker reclaims
   backfill's lease: backfill gets PREEMPT_WARNING with its deadline on its Watch stream,
   drains and releases before it, and the science lease is ACTIVATED;
4. the science agent renews its lease, then two non-blocking requests beyond its burst
   ceiling and its bucket are refused (typed ``Refused``: reason and retry-after);
5. everything is released, the service stops, and the journal is audited.

Only the grace period and the boot latency differ from the packaged config (seconds
instead of minutes), so that the session takes a few seconds of wall time.

Server and clients share one event loop in this process: no child process to leak, the
port is known as soon as it is bound, and ``async with`` stops the server (and closes the
journal) however the session ends, also on error, timeout or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bursar.broker.audit import AuditReport, audit
from bursar.broker.config import Config, default_config
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.server import Running, Settings, running
from bursar.providers.client import (
    AsyncBrokerClient,
    Backoff,
    Lease,
    LeaseEvent,
    LeaseEventKind,
    LeaseHandle,
    LeasePath,
    LeaseState,
    Refused,
    Supply,
    TimeTo,
)

__all__ = [
    "BACKFILL",
    "SCIENCE",
    "SessionError",
    "SessionResult",
    "Step",
    "run_service_session",
    "service_config",
    "session",
]

BACKFILL = "backfill"
SCIENCE = "adaptive-sci"

GRACE_S = 2.0
"""Preempt warning → revoke (the packaged config says 30 s)."""
BOOT_S = 2.5
"""Cold node boot latency (the packaged config says 60 s)."""
DRAIN_S = 0.5
"""How long the backfill agent takes to checkpoint before it releases."""
BACKFILL_GPUS = 64.0
SCIENCE_GPUS = 160.0
LEASE_S = 600.0
RENEW_S = 900.0
WAIT_S = 15.0
"""Longest wait for any one thing the broker should do within seconds."""
TIMEOUT_S = 60.0
"""The whole session, server start to stop."""

# Files a previous session leaves in its state directory (the only ones it removes).
_STATE_FILES = ("admin.token", "serve.lock", "tokens.json")
_STATE_PREFIXES = (JOURNAL_FILENAME, "tokens.sqlite")


class SessionError(RuntimeError):
    """The broker did not do what the session expects (within ``WAIT_S``)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One printed line: seconds since the session started, who, what happened, why."""

    t: float
    agent: str
    what: str
    why: str = ""

    def text(self) -> str:
        why = f" — {self.why}" if self.why else ""
        return f"{f'+{self.t:.2f}s':>7}  {self.agent:<12} {self.what}{why}"


@dataclass
class SessionResult:
    state_dir: Path
    address: str = ""
    steps: list[Step] = field(default_factory=list)
    audit: AuditReport | None = None
    wall_s: float = 0.0

    @property
    def audit_line(self) -> str:
        r = self.audit
        if r is None:
            return "service audit: not run"
        return (
            f"service audit: {r.events_checked} events, {r.decisions_checked} decisions "
            f"re-derived, {len(r.mismatches)} mismatches"
        )

    @property
    def ok(self) -> bool:
        return self.audit is not None and self.audit.ok

    def text(self) -> str:
        """The narrative as plain text, one line per step."""
        return "\n".join(s.text() for s in self.steps)


def service_config() -> Config:
    """The packaged 512-GPU demo config with a 2 s grace period and a 2.5 s boot."""
    cfg = default_config()
    return dataclasses.replace(
        cfg,
        pool=dataclasses.replace(cfg.pool, boot_latency_s=BOOT_S),
        policy=dataclasses.replace(cfg.policy, grace_s=GRACE_S),
    )


def fresh_state_dir(path: Path) -> None:
    """Remove what an earlier session left in ``path`` (and nothing else)."""
    if not path.exists():
        return
    if not path.is_dir():
        raise SessionError(f"{path} exists and is not a directory")
    others = [
        p.name
        for p in path.iterdir()
        if p.name not in _STATE_FILES and not p.name.startswith(_STATE_PREFIXES)
    ]
    if others:
        raise SessionError(
            f"{path} holds files that are not a broker state directory's "
            f"({', '.join(sorted(others)[:3])}); choose another --out"
        )
    lock = path / "serve.lock"
    if lock.exists():
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SessionError(
                f"a broker is serving from {path} (it holds {lock}); stop it or choose "
                "another --out"
            ) from None
        finally:
            os.close(fd)
    shutil.rmtree(path)


def _gpus(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _num(x: float) -> str:
    return "unlimited" if math.isinf(x) else f"{x:,.0f}"


def _nodes(lease: Lease) -> str:
    n = lease.nodes
    if not n:
        return "no nodes yet"
    return f"{len(n)} nodes ({n[0]}..{n[-1]})" if len(n) > 1 else f"node {n[0]}"


class _Narrator:
    def __init__(self, console: Console, result: SessionResult, t0: float) -> None:
        self.console = console
        self.result = result
        self.t0 = t0  # the broker's clock is this process's time.time()

    def rel(self, at: float) -> float:
        return at - self.t0

    def step(self, agent: str, what: str, why: str = "", *, at: float | None = None) -> None:
        t = self.rel(time.time() if at is None else at)
        s = Step(t, agent, what, why)
        self.result.steps.append(s)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", width=7, style="dim")
        grid.add_column(width=12, style="bold cyan" if agent != "broker" else "bold")
        grid.add_column(ratio=1, overflow="fold")
        line = Text(what)
        if why:
            line.append(" — " + why, style="dim")
        grid.add_row(f"+{t:.2f}s", agent, line)
        self.console.print(grid)

    def heading(self, text: str) -> None:
        self.console.print(Text(text, style="bold"))


def _sole(group: BaseExceptionGroup) -> BaseException:  # type: ignore[type-arg]
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _next_kind(
    events: asyncio.Queue[LeaseEvent], kind: LeaseEventKind, what: str
) -> LeaseEvent:
    deadline = time.monotonic() + WAIT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SessionError(f"{what} did not happen within {WAIT_S:.0f} s")
        try:
            ev = await asyncio.wait_for(events.get(), left)
        except TimeoutError:
            continue
        if ev.kind is kind:
            return ev


async def _wait(event: asyncio.Event, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), WAIT_S)
    except TimeoutError:
        raise SessionError(f"{what} did not happen within {WAIT_S:.0f} s") from None


async def _pump(stream: AsyncIterator[LeaseEvent], into: asyncio.Queue[LeaseEvent]) -> None:
    async for ev in stream:
        into.put_nowait(ev)


async def session(
    state_dir: Path,
    console: Console | None = None,
    *,
    watch: Callable[[Running], Awaitable[None]] | None = None,
) -> SessionResult:
    """Run the agent session against a broker started here on ``state_dir`` (made fresh);
    the broker is stopped and its journal audited before this returns.

    ``watch``: run alongside the agents with the broker serving its dashboard (on a free
    port), cancelled once they are done; ``scripts/dashboard_screenshot.py`` photographs
    the dashboard with it."""
    console = console or Console()
    state_dir = Path(state_dir)
    fresh_state_dir(state_dir)
    config = service_config()
    result = SessionResult(state_dir)
    wall0 = time.monotonic()
    say = _Narrator(console, result, time.time())
    console.rule("[bold]Part 2: agents negotiate with the broker service over gRPC")
    settings = Settings(
        state_dir=state_dir,
        config=config,
        host="127.0.0.1",
        port=0,
        metrics_port=None,
        dashboard_port=None if watch is None else 0,
        grace_s=1.0,
        limits=LimitSettings(),
    )
    try:
        async with asyncio.timeout(TIMEOUT_S), running(settings) as server:
            result.address = server.address
            tokens = json.loads((state_dir / "tokens.json").read_text())
            warm_nodes = sum(g.warm for g in config.pool.groups)
            all_nodes = sum(g.count for g in config.pool.groups)
            say.step(
                "broker",
                f"serving bursar.v1 on {server.address}, state in {state_dir}",
                f"the packaged pool ({warm_nodes} of {all_nodes} nodes warm), grace period "
                f"{GRACE_S:g} s and boot {BOOT_S:g} s so that this takes seconds; the agents "
                "use the campaign tokens in tokens.json",
            )
            watcher = asyncio.ensure_future(watch(server)) if watch is not None else None
            try:
                await _agents(server.address, tokens, config, say)
            finally:
                if watcher is not None:
                    watcher.cancel()
                    await asyncio.gather(watcher, return_exceptions=True)
            admin = AsyncBrokerClient(
                server.address, server.core.admin_token_path.read_text().strip()
            )
            async with admin:
                live = await admin.list_leases()
            say.step(
                "broker",
                f"{len(live)} live leases; stopping",
                "every agent released what it held",
            )
    except TimeoutError:
        raise SessionError(f"the session took longer than {TIMEOUT_S:.0f} s") from None
    except ExceptionGroup as group:
        # The server runs its background tasks in a TaskGroup: an error of the session
        # arrives wrapped. Raise the one error itself (the server has stopped by now).
        raise _sole(group) from None
    with Journal.open(state_dir / JOURNAL_FILENAME) as journal:
        result.audit = audit(journal)
    say.step(
        "broker",
        "stopped; journal closed and audited",
        f"every decision re-derived from {state_dir / JOURNAL_FILENAME}: "
        f"bursar journal audit --state-dir {state_dir}",
    )
    result.wall_s = time.monotonic() - wall0
    console.print(result.audit_line)
    return result


async def _agents(address: str, tokens: dict[str, str], config: Config, say: _Narrator) -> None:
    fast = Backoff(initial_s=0.05, max_s=0.5)
    back = AsyncBrokerClient(address, tokens[BACKFILL], backoff=fast, rng=1, retry_timeout_s=10)
    sci = AsyncBrokerClient(address, tokens[SCIENCE], backoff=fast, rng=2, retry_timeout_s=10)
    headroom = config.policy.warm_headroom.get("gpu", 0.0)
    envelope = next(c for c in config.campaigns if c.name == SCIENCE).envelopes["gpu"]
    async with back, sci:
        # -- 1. backfill ----------------------------------------------------------------
        say.heading(f"1. The backfill agent acquires {_gpus(BACKFILL_GPUS)} GPUs, preemptible")
        before = await back.supply()
        gpu = before.dims["gpu"]
        handle: LeaseHandle | None = None

        async def drain(ev: LeaseEvent) -> None:
            await asyncio.sleep(DRAIN_S)  # checkpoint the work on the reclaimed nodes
            assert handle is not None
            await handle.release()

        handle = back.held_lease({"gpu": BACKFILL_GPUS}, LEASE_S, on_preempt=drain, blocking=False)
        async with handle as bf:
            lease = bf.lease
            say.step(
                BACKFILL,
                f"acquire → {lease.id} granted on the {lease.path.value} path, "
                f"{lease.state.value}, usable at +{say.rel(lease.starts_at):.2f}s",
                _backfill_why(lease, gpu.available_warm, gpu.reserve, headroom, before),
                at=lease.granted_at,
            )
            await _wait(bf.active, f"backfill's lease {lease.id} becoming active")
            say.step(
                BACKFILL,
                f"watch: ACTIVATED {bf.lease.id} on {_nodes(bf.lease)}",
                "its nodes finished booting; the lease is watched on one Watch stream and "
                "renewed in the background while the agent holds it",
            )

            # -- 2. supply --------------------------------------------------------------
            say.heading("2. The science agent reads the supply signals")
            unmet = (await sci.supply()).campaigns[SCIENCE].unmet_guarantee.get("gpu", 0.0)
            above = max(0.0, SCIENCE_GPUS - unmet)
            sup = await sci.supply(units=SCIENCE_GPUS)
            _explain_supply(say, sup, above, unmet, envelope.sustained)

            # -- 3. reclaim -------------------------------------------------------------
            say.heading(
                f"3. The science agent asks for {_gpus(SCIENCE_GPUS)} GPUs: the broker "
                "reclaims backfill"
            )
            sci_events: asyncio.Queue[LeaseEvent] = asyncio.Queue()
            mine = await sci.acquire({"gpu": SCIENCE_GPUS}, LEASE_S, blocking=False)
            pump = asyncio.create_task(_pump(sci.watch(mine.id), sci_events), name="sci-watch")
            try:
                warm_part = min(SCIENCE_GPUS, unmet + sup.dims["gpu"].available_warm)
                say.step(
                    SCIENCE,
                    f"acquire {_gpus(SCIENCE_GPUS)} GPUs for {LEASE_S:.0f} s → {mine.id} "
                    f"granted on the {mine.path.value} path, {mine.state.value}, usable by "
                    f"+{say.rel(mine.starts_at):.2f}s",
                    _science_why(mine, warm_part, SCIENCE_GPUS - warm_part, sup),
                    at=mine.granted_at,
                )
                # Its own unmet guarantee is lent to backfill: it is taken back by reclaim,
                # and the rest (if any) boots (the COLD path then also reclaims).
                if mine.path in (LeasePath.RECLAIM, LeasePath.COLD) and unmet > 0:
                    await _wait(bf.preempted, f"the preemption warning for {bf.lease.id}")
                    ev = bf.preempt_event
                    assert ev is not None and ev.deadline is not None
                    say.step(
                        BACKFILL,
                        f"watch: PREEMPT_WARNING for {ev.lease.id}, deadline "
                        f"+{say.rel(ev.deadline):.2f}s (in {ev.deadline - ev.at:.1f} s), "
                        f"reclaimed for {ev.for_request or mine.id}",
                        "preemptible leases are reclaimed first for a non-preemptible "
                        f"request; drain within the {sup.grace_s:g} s grace period or be "
                        "revoked at the deadline",
                        at=ev.at,
                    )
                    await _wait(bf.ended, f"backfill's lease {bf.lease.id} ending")
                    end = bf.end_event
                    ended_at = end.at if end is not None else bf.lease.ended_at or time.time()
                    if bf.lease.state is LeaseState.RELEASED:
                        say.step(
                            BACKFILL,
                            f"drained for {DRAIN_S:g} s, then RELEASED {bf.lease.id}, "
                            f"{ev.deadline - ended_at:.2f} s before the deadline",
                            "released, not revoked: the unused part of the lease is refunded "
                            "and its nodes go to the science lease at once",
                            at=ended_at,
                        )
                    else:  # the drain took longer than the grace period
                        say.step(
                            BACKFILL,
                            f"{bf.lease.state.value} {bf.lease.id} ({bf.lease.end_cause}) "
                            "before it finished draining",
                            "the grace period ended first: the broker took the nodes back",
                            at=ended_at,
                        )
                act = await _next_kind(sci_events, LeaseEventKind.ACTIVATED, f"{mine.id} active")
                early = mine.starts_at - act.at
                say.step(
                    SCIENCE,
                    f"watch: ACTIVATED {mine.id} on {_nodes(act.lease)}",
                    (
                        f"{early:.2f} s before the grace deadline, because backfill released early"
                        if early > 0.05
                        else "the grace period ended and the reclaimed nodes were handed over"
                    ),
                    at=act.at,
                )
            finally:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
        # Leaving the block released backfill's handle (already released: no call).

        # -- 4. renew, refuse -----------------------------------------------------------
        say.heading("4. The science agent renews, then asks beyond its burst and its bucket")
        renewed = await sci.renew(mine.id, RENEW_S)
        bucket = (await sci.supply()).campaigns[SCIENCE].bucket.get("gpu", math.inf)
        say.step(
            SCIENCE,
            f"renew {mine.id} → RENEWED, now expires at +{say.rel(renewed.expires_at):.0f}s "
            f"(was +{say.rel(mine.expires_at):.0f}s)",
            f"renewal is an admission decision: still within its burst of "
            f"{_gpus(envelope.burst)} GPUs, and its bucket prepaid the part above its "
            f"sustained {_gpus(envelope.sustained)} GPUs (bucket now {_num(bucket)} GPU-s)",
        )
        # Past the burst ceiling: what it holds plus the request exceeds ``burst``. Past
        # the bucket: it already holds more than its sustained rate, so all of a new
        # lease is above it and must be prepaid for its whole duration.
        over_burst = envelope.burst - SCIENCE_GPUS + 64.0
        over_bucket = envelope.sustained
        for size, duration, what in (
            (over_burst, 60.0, f"{_gpus(SCIENCE_GPUS + over_burst)} GPUs in all"),
            (
                over_bucket,
                3600.0,
                f"all above its sustained rate: {_num(over_bucket * 3600.0)} GPU-s to prepay",
            ),
        ):
            try:
                extra = await sci.acquire({"gpu": size}, duration, blocking=False)
            except Refused as exc:
                explanation = exc.metadata.get("explanation") or exc.message
                say.step(
                    SCIENCE,
                    f"acquire {_gpus(size)} more GPUs for {duration:.0f} s (non-blocking; "
                    f"{what}) → Refused {exc.reason}, retry after {exc.retry_after:.0f} s",
                    explanation,
                )
            else:
                await sci.release(extra.id)
                raise SessionError(
                    f"a {_gpus(size)}-GPU request ({what}) was granted as {extra.id}; "
                    "expected a refusal"
                )

        # -- 5. release -----------------------------------------------------------------
        say.heading("5. Everything is released and the journal audited")
        final = await sci.release(mine.id)
        after = (await sci.supply()).campaigns[SCIENCE]
        say.step(
            SCIENCE,
            f"release {mine.id} → {final.state.value}",
            f"the unused prepaid tokens are refunded (bucket back to "
            f"{_num(after.bucket.get('gpu', math.inf))} GPU-s); credits spent "
            f"{after.credits:.2f}",
            at=final.ended_at,
        )


def _backfill_why(
    lease: Lease, available_warm: float, reserve: float, headroom: float, sup: Supply
) -> str:
    free = max(0.0, available_warm + sup.dims["gpu"].lendable - headroom)
    if lease.path is LeasePath.COLD:
        return (
            f"preemptible leases may not take the {_gpus(reserve)}-GPU reserve for unmet "
            f"guarantees nor the {_gpus(headroom)}-GPU warm headroom, and "
            + (f"only {_gpus(free)} warm GPUs lie" if free else "no warm GPUs lie")
            + f" beyond them: cold nodes boot ({sup.boot_latency_s:g} s)"
        )
    return (
        f"{_gpus(free)} idle warm GPUs lie beyond the interactive reserve and the headroom "
        "(batch campaigns' unmet guarantees may be lent to preemptible leases: they are "
        "reclaimed within the grace period when their owners ask)"
    )


def _science_why(lease: Lease, warm: float, reclaim: float, sup: Supply) -> str:
    if lease.path is LeasePath.RECLAIM:
        return (
            f"{_gpus(warm)} GPUs come from warm capacity (its unmet guarantee and what lies "
            f"beyond the reserve); the other {_gpus(reclaim)} are taken from backfill's "
            f"preemptible lease after the {sup.grace_s:g} s grace period"
        )
    if lease.path is LeasePath.COLD:
        return (
            f"its own unmet guarantee was lent to backfill's preemptible lease and is taken "
            f"back after the {sup.grace_s:g} s grace period; the rest boots on cold nodes "
            f"({sup.boot_latency_s:g} s)"
        )
    return f"the broker chose the {lease.path.value} path"


def _explain_supply(
    say: _Narrator, sup: Supply, above: float, unmet: float, sustained: float
) -> None:
    g = sup.dims["gpu"]
    say.step(
        SCIENCE,
        f"supply: {_gpus(g.available_warm)} GPUs warm beyond the reserve, "
        f"{_gpus(g.reclaimable)} reclaimable, {_gpus(g.cold)} cold; price "
        f"{sup.price:.2f} credits/GPU-h (pressure {sup.pressure:.2f})",
        f"warm is usable at once; reclaimable is held by preemptible leases (usable after "
        f"the {sup.grace_s:g} s grace); cold nodes need a {sup.boot_latency_s:g} s boot; "
        f"{_gpus(g.reserve)} GPUs stay warm for unmet guarantees; the price rises with "
        "pressure",
        at=sup.at,
    )
    tt = sup.time_to

    def fmt(x: float | None) -> str:
        return "no" if x is None else f"{x:g} s"

    if tt is not None:
        say.step(
            SCIENCE,
            f"time to {_gpus(above + unmet)} GPUs: warm {fmt(tt.warm_s)}, "
            f"reclaim {fmt(tt.reclaim_s)}, cold {fmt(tt.cold_s)}",
            f"its own {_gpus(unmet)}-GPU unmet guarantee is kept warm for it and counts as "
            f"warm; the other {_gpus(above)} must come from warm capacity beyond the reserve, "
            f"reclaim or cold nodes: {_soonest(tt)}",
            at=sup.at,
        )
    mine = sup.campaigns[SCIENCE]
    level = mine.bucket.get("gpu", math.inf)
    say.step(
        SCIENCE,
        f"its bucket: {_num(level)} GPU-s, {_gpus(mine.headroom_to_burst.get('gpu', 0.0))} "
        f"GPUs of headroom to its burst ceiling, {mine.credits:.2f} credits spent",
        f"a lease above its sustained {_gpus(sustained)} GPUs prepays the excess for its "
        f"whole duration: {_gpus(above + unmet)} GPUs for {LEASE_S:.0f} s cost "
        f"{_num(max(0.0, above + unmet - sustained) * LEASE_S)} GPU-s",
        at=sup.at,
    )


def _soonest(tt: TimeTo) -> str:
    paths = [
        (t, name)
        for t, name in ((tt.warm_s, "warm"), (tt.reclaim_s, "reclaim"), (tt.cold_s, "cold"))
        if t is not None
    ]
    if not paths:
        return "no path can serve that now"
    t, name = min(paths)
    return f"soonest on the {name} path ({t:g} s)"


def run_service_session(state_dir: Path, console: Console | None = None) -> SessionResult:
    """``session`` on a fresh event loop (what ``bursar demo`` calls)."""
    return asyncio.run(session(state_dir, console))
