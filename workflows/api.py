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
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from bursar.providers.client import Lease, LeasePath, LeaseState, MeterResult, Refused

__all__ = ["Ctx", "Lease", "MeterResult", "Refused", "SupplyView", "granted", "refused"]

# ``Lease``, ``MeterResult`` and ``Refused`` are the client's (bursar.providers.client): an
# agent reads a lease's ``id``, ``starts_at`` (when the resources are usable: later than
# the grant on the reclaim and cold paths), ``expires_at`` and ``path``, and a refusal's
# ``reason`` and ``retry_after``, whichever Ctx it runs on.


def refused(reason: str, retry_after: float) -> Refused:
    """The refusal a Ctx raises: the broker would not grant (or renew) now, with ``reason``
    (ABOVE_BURST, BUCKET_EMPTY, POOL_FULL, ...) and ``retry_after`` seconds. A Ctx also
    raises it as ``OUT_OF_RANGE`` (retry after inf) for a request that can never be
    granted as asked (under prepaid enforcement, more above the sustained rate for its
    duration than the whole bucket holds) and ``ENDED`` for a lease that has ended."""
    return Refused(
        f"{reason} (retry after {retry_after:.1f}s)", reason=reason, retry_after=retry_after
    )


def granted(
    lease_id: str,
    campaign: str,
    size: Mapping[str, float],
    path: str,
    at: float,
    starts_at: float,
    expires_at: float,
    nodes: tuple[str, ...] = (),
) -> Lease:
    """The lease a grant at ``at`` describes, for a Ctx that is not reading it from a
    broker's answer (the simulator's): ``path`` is the path's name in any case."""
    return Lease(
        id=lease_id,
        campaign=campaign,
        state=LeaseState.ACTIVE if starts_at <= at else LeaseState.STARTING,
        size=MappingProxyType(dict(sorted(size.items()))),
        path=LeasePath(path.upper()),
        granted_at=at,
        starts_at=starts_at,
        expires_at=expires_at,
        nodes=tuple(nodes),
    )


@dataclass(frozen=True, slots=True)
class SupplyView:
    """The supply signals an agent reads (GPU dimension, and its own campaign's buckets)."""

    at: float
    price: float
    """Credits per GPU-hour."""
    capacity: float
    available_warm: float
    lendable: float
    """Reserve a preemptible lease may fill beyond ``available_warm`` (batch guarantees)."""
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
