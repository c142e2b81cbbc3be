"""The agents' ``Ctx`` against a live broker: ``AsyncBrokerClient`` and its clock.

Time is the client's clock (``AsyncBrokerClient(clock=...)``: the wall clock, which is
the service's, unless a test gives both a manual one); the agent code is the same that
runs in the simulator. Leases and refusals are the client's own values.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from bursar.providers.client import (
    AsyncBrokerClient,
    FailedPrecondition,
    LeaseState,
    OutOfRange,
)
from bursar.workflows.api import Lease, MeterResult, SupplyView, refused

__all__ = ["GrpcCtx"]

_POLL_S = 0.05


@dataclass
class GrpcCtx:
    client: AsyncBrokerClient
    campaign: str
    rng: random.Random
    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def now(self) -> float:
        return self.client.clock.now()

    async def sleep(self, seconds: float) -> None:
        clock = self.client.clock
        await clock.sleep_until(clock.now() + max(0.0, seconds))

    async def acquire(
        self,
        gpus: float,
        duration_s: float,
        *,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> Lease:
        try:
            return await self.client.acquire(
                {"gpu": gpus}, duration_s, blocking=blocking, timeout=timeout
            )
        except OutOfRange:
            raise refused("OUT_OF_RANGE", math.inf) from None

    async def wait_active(self, lease: Lease) -> bool:
        while True:
            x = await self.client.get_lease(lease.id)
            if x.ended:
                return False
            if x.state in (LeaseState.ACTIVE, LeaseState.PREEMPTING):
                return True
            await asyncio.sleep(_POLL_S)

    async def wait_end(self, lease: Lease, timeout: float | None = None) -> str | None:
        deadline = math.inf if timeout is None else self.now() + timeout
        while self.now() < deadline:
            x = await self.client.get_lease(lease.id)
            if x.ended:
                return x.end_cause or x.state.value
            await asyncio.sleep(_POLL_S)
        return None

    async def renew(self, lease: Lease, duration_s: float) -> Lease:
        try:
            return await self.client.renew(lease.id, duration_s)
        except FailedPrecondition:
            raise refused("ENDED", math.inf) from None

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
            lendable=g.lendable,
            reclaimable=g.reclaimable,
            cold=g.cold,
            held=held,
            bucket=bucket,
            fs_bw_bucket=fs,
        )

    async def meter(self, dim: str, amount: float) -> MeterResult:
        return await self.client.meter(dim, amount)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro, name=name or None))

    def record(self, kind: str, **data: Any) -> None:
        self.records.append((kind, {"campaign": self.campaign, "t": self.now(), **data}))
