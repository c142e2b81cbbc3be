"""The small client interface agents are written against, once.

An agent is ``async def run(ctx)`` that awaits only what ``ctx`` gives it. Two
implementations exist: ``bursar.sim.runner.SimCtx`` (virtual time: the awaitables are
kernel commands, resumed by the discrete-event kernel) and
``bursar.workflows.grpc_ctx.GrpcCtx`` (wall time: ``AsyncBrokerClient`` and
``asyncio.sleep``). An agent must not import asyncio or read a clock: ``ctx.now()`` and
``ctx.sleep()`` are its time, ``ctx.rng`` its randomness (seeded).
"""

from __future__ import annotations

import random
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Ctx", "Lease", "MeterResult", "Refused", "SupplyView"]


class Refused(Exception):
    """The broker would not grant (or renew) now: ``reason`` (ABOVE_BURST, BUCKET_EMPTY,
    POOL_FULL, ...) and ``retry_after`` seconds. ``OUT_OF_RANGE`` (retry after inf): a
    request that can never be granted as asked (under prepaid enforcement, more above
    the sustained rate for its duration than the whole bucket holds)."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(f"{reason} (retry after {retry_after:.1f}s)")
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Lease:
    id: str
    gpus: float
    requested_at: float
    starts_at: float
    """When the resources are usable (later than the grant on the reclaim and cold paths)."""
    expires_at: float
    path: str


@dataclass(frozen=True, slots=True)
class MeterResult:
    requested: float
    granted: float
    wait_s: float


@dataclass(frozen=True, slots=True)
class SupplyView:
    """The supply signals an agent reads (GPU dimension, and its own campaign's buckets)."""

    at: float
    price: float
    """Credits per GPU-hour."""
    capacity: float
    available_warm: float
    reclaimable: float
    cold: float
    held: float
    """GPUs the caller's campaign holds."""
    bucket: float
    """The caller's GPU bucket level (GPU-seconds; inf when unlimited)."""
    fs_bw_bucket: float
    """The caller's fs_bw bucket level (MB; inf when unlimited or absent)."""


class Ctx(Protocol):
    campaign: str
    rng: random.Random

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def acquire(
        self,
        gpus: float,
        duration_s: float,
        *,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> Lease:
        """A lease of ``gpus`` GPUs; raises ``Refused``. A blocking acquire waits up to
        ``timeout`` for the grant (not for activation: see ``wait_active``)."""
        ...

    async def wait_active(self, lease: Lease) -> bool:
        """Wait until the lease's resources are usable; False if it ended first."""
        ...

    async def wait_end(self, lease: Lease, timeout: float | None = None) -> str | None:
        """Wait until the lease ends (released, expired, revoked); its cause, or None on
        timeout."""
        ...

    async def renew(self, lease: Lease, duration_s: float) -> Lease:
        """Extend to now + ``duration_s``; raises ``Refused``."""
        ...

    async def release(self, lease: Lease) -> None:
        """End the lease early (idempotent: an ended lease is left alone)."""
        ...

    async def supply(self) -> SupplyView: ...

    async def meter(self, dim: str, amount: float) -> MeterResult: ...

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> None:
        """Run ``coro`` concurrently with the caller (a task of the same agent)."""
        ...

    def record(self, kind: str, **data: Any) -> None:
        """An observation for the metrics (a task done, a latency); never affects the broker."""
        ...
