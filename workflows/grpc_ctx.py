"""The agents' ``Ctx`` against a live broker: ``AsyncBrokerClient`` and ``asyncio.sleep``.

Time is the broker's clock as its answers report it (``Supply.at``), advanced locally by
the monotonic clock between calls; the agent code is the same that runs in the simulator.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from bursar.providers.client import (
    AsyncBrokerClient,
    FailedPrecondition,
    LeaseState,
    OutOfRange,
)
from bursar.providers.client import Lease as ClientLease
from bursar.providers.client import Refused as ClientRefused
from bursar.workflows.api import Lease, MeterResult, Refused, SupplyView

__all__ = ["GrpcCtx"]

_POLL_S = 0.05


def _lease(x: ClientLease, requested_at: float) -> Lease:
    return Lease(
        id=x.id,
        gpus=float(x.size.get("gpu", 0.0)),
        requested_at=requested_at,
        starts_at=x.starts_at,
        expires_at=x.expires_at,
        path=x.path.value,
    )


@dataclass
class GrpcCtx:
    client: AsyncBrokerClient
    campaign: str
    rng: random.Random
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    _t0: float = field(default_factory=time.monotonic)
    _broker_t0: float = field(default_factory=time.time)

    def now(self) -> float:
        """Broker time (the service's clock is the wall clock)."""
        return self._broker_t0 + (time.monotonic() - self._t0)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def acquire(
        self,
        gpus: float,
        duration_s: float,
        *,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> Lease:
        t0 = self.now()
        try:
            x = await self.client.acquire(
                {"gpu": gpus}, duration_s, blocking=blocking, timeout=timeout
            )
        except ClientRefused as exc:
            raise Refused(str(exc.reason or "REFUSED"), exc.retry_after) from None
        except OutOfRange:
            raise Refused("OUT_OF_RANGE", math.inf) from None
        return _lease(x, t0)

    async def wait_active(self, lease: Lease) -> bool:
        while True:
            x = await self.client.get_lease(lease.id)
            if x.ended:
                return False
            if x.state in (LeaseState.ACTIVE, LeaseState.PREEMPTING):
                return True
            await asyncio.sleep(_POLL_S)

    async def wait_end(self, lease: Lease, timeout: float | None = None) -> str | None:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        while time.monotonic() < deadline:
            x = await self.client.get_lease(lease.id)
            if x.ended:
                return x.end_cause or x.state.value
            await asyncio.sleep(_POLL_S)
        return None

    async def renew(self, lease: Lease, duration_s: float) -> Lease:
        try:
            x = await self.client.renew(lease.id, duration_s)
        except ClientRefused as exc:
            raise Refused(str(exc.reason or "REFUSED"), exc.retry_after) from None
        except FailedPrecondition:
            raise Refused("ENDED", math.inf) from None
        return _lease(x, lease.requested_at)

    async def release(self, lease: Lease) -> None:
        await self.client.release(lease.id)

    async def supply(self) -> SupplyView:
        s = await self.client.supply()
        g = s.dims["gpu"]
        c = s.campaigns.get(self.campaign)
        held = c.held.get("gpu", 0.0) if c else 0.0
        bucket = c.bucket.get("gpu", math.inf) if c else math.inf
        fs = c.bucket.get("fs_bw", math.inf) if c else math.inf
        return SupplyView(
            at=s.at,
            price=s.price,
            capacity=g.capacity,
            available_warm=g.available_warm,
            reclaimable=g.reclaimable,
            cold=g.cold,
            held=held,
            bucket=bucket,
            fs_bw_bucket=fs,
        )

    async def meter(self, dim: str, amount: float) -> MeterResult:
        r = await self.client.meter(dim, amount)
        return MeterResult(r.requested, r.granted, r.wait_s)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro, name=name or None))

    def record(self, kind: str, **data: Any) -> None:
        self.records.append((kind, {"campaign": self.campaign, "t": self.now(), **data}))
