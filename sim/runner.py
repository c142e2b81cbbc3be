"""The simulator: the kernel drives the real ``Runtime`` (engine -> journal -> simulated pool)
and the agents of ``bursar.workflows`` in virtual time.

``SimBroker`` is the kernel's source of broker timers (the engine's expiries, revocations
and wake-ups, the simulated pool's boots) and turns decisions into the signals the agents
wait on. ``SimCtx`` is the agents' ``Ctx`` in virtual time: a call to the broker is one
``Runtime.submit`` at the kernel's clock; ``sleep`` and waits are kernel commands.
Nothing here decides anything the engine decides.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bursar.broker.acquisition import AcquireCall
from bursar.broker.backends.base import active_at_grant
from bursar.broker.config import Config, default_config
from bursar.broker.decisions import (
    Activated,
    Decision,
    Expired,
    Granted,
    Metered,
    Rejected,
    Released,
    Renewed,
    Revoked,
)
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import Event, Meter, Release, Renew, RequestLease
from bursar.broker.journal import JOURNAL_FILENAME
from bursar.broker.lease import LeaseState
from bursar.broker.outcome import Outcome
from bursar.broker.runtime import Runtime
from bursar.sim.kernel import Kernel, Signal, Sleep, Wait
from bursar.workflows.api import Lease, MeterResult, SupplyView, granted, refused

__all__ = ["Params", "SimBroker", "SimCtx", "scenario_config"]


@dataclass(frozen=True)
class Params:
    """The facility knobs the simulator exposes (they go into the broker's Config)."""

    warm_headroom: float = 32.0
    grace_s: float = 30.0
    boot_latency_s: float = 60.0
    backfill: bool = True
    """Run the preemptible backfill tier."""
    probe: bool = True
    """Add the probe campaign (guarantee 0, 128 GPUs every 5 minutes)."""
    meter_window_s: float = 10.0
    """One meter call may take up to burst x window units at once. 10 s is the storm's
    metering period (it meters inference every 10 s for 10 s' worth): one grant then
    covers one period at the burst rate, so the cap is the envelope's burst ceiling. A
    shorter window caps a client that meters every 10 s below its burst (1 s: a tenth of
    it, under even its sustained rate); a longer one lets one call take several periods
    of burst at once. Tasks meter once per step, in window-sized pieces."""


PROBE = CampaignSpec(
    name="probe",
    envelopes={"gpu": DimEnvelope(guarantee=0, sustained=128, burst=128, bucket=None)},
    lease_class=LeaseClass.BATCH,
)


def scenario_config(params: Params | None = None, base: Config | None = None) -> Config:
    """The flagship pool and campaigns with the simulator's parameters applied."""
    params = params or Params()
    cfg = base or default_config()
    pool = dataclasses.replace(cfg.pool, boot_latency_s=params.boot_latency_s)
    policy = dataclasses.replace(
        cfg.policy,
        grace_s=params.grace_s,
        warm_headroom={**cfg.policy.warm_headroom, "gpu": params.warm_headroom},
        meter_window_s=params.meter_window_s,
    )
    campaigns = tuple(cfg.campaigns) + ((PROBE,) if params.probe else ())
    return Config(pool=pool, policy=policy, campaigns=campaigns)


class _LeaseSignals:
    __slots__ = ("active", "end", "granted")

    def __init__(self) -> None:
        self.granted = Signal()
        self.active = Signal()
        self.end = Signal()


class SimBroker:
    """A ``Runtime`` on the kernel's clock: the kernel's source of broker timers."""

    def __init__(self, kernel: Kernel, broker: Runtime) -> None:
        self.kernel = kernel
        self.broker = broker
        self.leases: dict[str, _LeaseSignals] = {}
        self.listeners: list[Callable[[Event, Sequence[Decision]], None]] = []
        broker.listen(self._on_decisions)
        kernel.add_source(self)

    # -- Source --------------------------------------------------------------------------

    def next_time(self) -> float | None:
        ts = [
            t
            for t in (self.broker.engine.next_timer(), self.broker.actuator.next_report_time())
            if t is not None
        ]
        return min(ts) if ts else None

    def fire(self, t: float) -> None:
        self.broker.catch_up(t)

    # -- calls -----------------------------------------------------------------------------

    def submit(self, event: Event) -> Outcome:
        return self.broker.submit(event)

    def signals(self, lease_id: str) -> _LeaseSignals:
        s = self.leases.get(lease_id)
        if s is None:
            s = self.leases[lease_id] = _LeaseSignals()
        return s

    def _on_decisions(self, event: Event, decisions: Sequence[Decision]) -> None:
        k = self.kernel
        for d in decisions:
            if isinstance(d, Granted):
                s = self.signals(d.lease_id)
                s.granted.succeed(k, d)
                if active_at_grant(d):
                    s.active.succeed(k, True)
            elif isinstance(d, Activated):
                sig = self.signals(d.lease_id).active
                if not sig.fired:
                    sig.succeed(k, True)
            elif isinstance(d, Revoked | Expired | Released):
                s = self.signals(d.lease_id)
                cause = d.cause if isinstance(d, Revoked) else d.kind
                if not s.active.fired:
                    s.active.succeed(k, False)
                if not s.end.fired:
                    s.end.succeed(k, cause)
                del self.leases[d.lease_id]
        for fn in self.listeners:
            fn(event, decisions)


def _lease(g: Granted) -> Lease:
    return granted(
        g.lease_id, g.campaign, g.size, g.path.value, g.at, g.starts_at, g.expires_at, g.nodes
    )


@dataclass
class SimCtx:
    """``bursar.workflows.api.Ctx`` in virtual time."""

    sim: SimBroker
    campaign: str
    rng: random.Random
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def kernel(self) -> Kernel:
        return self.sim.kernel

    def now(self) -> float:
        return self.kernel.now

    async def sleep(self, seconds: float) -> None:
        await Sleep(seconds)

    async def acquire(
        self,
        gpus: float,
        duration_s: float,
        *,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> Lease:
        t0 = self.now()
        call = AcquireCall(
            self.sim.submit,
            lambda: self.sim.broker.engine,
            RequestLease(
                at=t0,
                campaign=self.campaign,
                size={"gpu": gpus},
                duration_s=duration_s,
                blocking=blocking,
            ),
        )
        try:
            first = call.start()
        except RequestError as exc:
            if exc.code is ErrorCode.OUT_OF_RANGE:
                raise refused("OUT_OF_RANGE", math.inf) from None
            raise
        if isinstance(first, Granted):
            return _lease(first)
        if isinstance(first, Rejected):
            raise refused(first.reason.value, first.retry_after_s)
        rid = first.request_id
        got = await Wait(self.sim.signals(rid).granted, timeout)
        if got is None:
            if call.withdraw(self.now()):
                self.sim.leases.pop(rid, None)
                reason, _, _ = call.refusal(self.now(), 0.0)
                raise refused(reason.value, first.estimated_wait_s)
            got = self.sim.signals(rid).granted.value
        return _lease(got)

    async def wait_active(self, lease: Lease) -> bool:
        if lease.id not in self.sim.broker.engine.leases:
            return False
        return bool(await Wait(self.sim.signals(lease.id).active))

    async def wait_end(self, lease: Lease, timeout: float | None = None) -> str | None:
        if lease.id not in self.sim.broker.engine.leases:
            return "ended"
        return await Wait(self.sim.signals(lease.id).end, timeout)

    async def renew(self, lease: Lease, duration_s: float) -> Lease:
        try:
            decisions = self.sim.submit(
                Renew(at=self.now(), lease_id=lease.id, duration_s=duration_s)
            )
        except RequestError as exc:
            if exc.code is ErrorCode.FAILED_PRECONDITION:
                raise refused("ENDED", math.inf) from None
            raise
        own = decisions.own
        if isinstance(own, Renewed):
            return dataclasses.replace(lease, expires_at=own.expires_at)
        if isinstance(own, Rejected):
            raise refused(own.reason.value, own.retry_after_s)
        raise refused("ENDED", math.inf)

    async def release(self, lease: Lease) -> None:
        if lease.id not in self.sim.broker.engine.leases:
            return
        try:
            self.sim.submit(Release(at=self.now(), lease_id=lease.id))
        except RequestError as exc:
            if exc.code is not ErrorCode.FAILED_PRECONDITION:
                raise

    async def supply(self) -> SupplyView:
        b = self.sim.broker
        b.catch_up(self.now())
        s = b.supply()
        g = s.dims["gpu"]
        c = s.campaigns[self.campaign]
        lvl = c.bucket.get("gpu")
        fs = c.bucket.get("fs_bw")
        return SupplyView(
            at=self.now(),
            price=s.price,
            capacity=g.capacity,
            available_warm=g.available_warm,
            lendable=g.lendable,
            reclaimable=g.reclaimable,
            cold=g.cold,
            held=c.held.get("gpu", 0.0),
            bucket=math.inf if lvl is None else lvl,
            fs_bw_bucket=math.inf if fs is None else fs,
        )

    async def meter(self, dim: str, amount: float) -> MeterResult:
        decisions = self.sim.submit(
            Meter(at=self.now(), campaign=self.campaign, dim=dim, amount=amount)
        )
        m = decisions.own
        assert isinstance(m, Metered), m
        return MeterResult(m.requested, m.granted, m.wait_s)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> None:
        self.kernel.spawn(coro, name or f"{self.campaign}-task")

    def record(self, kind: str, **data: Any) -> None:
        self.records.append((kind, {"campaign": self.campaign, "t": self.now(), **data}))


def open_broker(state_dir: Path, config: Config) -> Runtime:
    """A fresh broker in ``state_dir`` (an existing journal there is removed first)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        (state_dir / (JOURNAL_FILENAME + suffix)).unlink(missing_ok=True)
    return Runtime.open(state_dir, config)


def in_use(broker: Runtime) -> dict[str, float]:
    """GPUs in use per campaign: active leases (placed), not starting ones."""
    out: dict[str, float] = dict.fromkeys(broker.engine.campaigns, 0.0)
    for ls in broker.engine.leases.values():
        if ls.state is not LeaseState.STARTING:
            out[ls.campaign] += ls.size[0]
    return out
