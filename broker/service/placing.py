"""The leases whose placement an asynchronous actuator (Slurm) is making on worker threads,
off the event loop, so that other calls go on meanwhile; and the Acquire calls waiting for
them. Such an Acquire answers, and its lease's Watch event is sent, once the allocation
is ready, so that both carry it; a failed allocation ends the lease (LeaseLost) and the
answer is the revoked lease.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bursar.broker.backends.base import placed_by
from bursar.broker.decisions import Allocated, Decision, Expired, Released, Revoked
from bursar.broker.service.errors import ShuttingDown

__all__ = ["Placements"]


@dataclass(slots=True)
class _Placing:
    done: asyncio.Future[None]
    """Resolved by the lease's Allocated decision (or its end)."""

    def cut_off(self) -> None:
        """End the wait with UNAVAILABLE (a shutdown): the client retries, with its key,
        against the restarted server, which re-adopts the job."""
        if not self.done.done():
            self.done.set_exception(ShuttingDown("the wait for the allocation"))
            self.done.add_done_callback(lambda f: f.exception())


class Placements:
    """Placements under way, each with the future its Acquire waits on."""

    def __init__(self) -> None:
        self._placing: dict[str, _Placing] = {}
        self._closing = False

    def heard(self, d: Decision) -> None:
        """A committed decision of a broker whose actuator is asynchronous: a placement
        begins (a grant placed at once, an activation) or is over (allocated, or the
        lease ended first: the allocation failed)."""
        lease_id = placed_by(d)
        if lease_id is not None and lease_id not in self._placing:
            placing = _Placing(asyncio.get_running_loop().create_future())
            if self._closing:
                # The shutdown began while this grant was being committed, after it cut off
                # the waits under way: cut this one off too, as it would have.
                placing.cut_off()
            self._placing[lease_id] = placing
        if isinstance(d, Allocated | Revoked | Expired | Released):
            placing = self._placing.pop(d.lease_id, None)
            if placing is not None and not placing.done.done():
                placing.done.set_result(None)

    async def until_placed(self, lease_id: str) -> None:
        """Wait until the lease's placement is over (at once if none is under way)."""
        placing = self._placing.get(lease_id)
        if placing is not None:
            await asyncio.shield(placing.done)

    def cut_off(self) -> None:
        """A shutdown: every wait under way, and any that begins later, ends with
        UNAVAILABLE, as a queued request's does."""
        self._closing = True
        for placing in self._placing.values():
            placing.cut_off()
        self._placing.clear()
