"""One open-ended Watch stream per client, shared by all of its held leases.

The broker caps the streams a client may hold open (32 by default), and an agent or a
workflow plugin may hold many leases at once, so a :class:`LeaseHandle` does not open a
stream of its own: it subscribes to its client's :class:`LeaseWatcher`. The watcher
opens its stream before the handle's Acquire is sent, so no event about the new lease
can be missed; events for a lease that no handle has claimed yet are kept (a few per
lease, for a bounded number of leases) and replayed when its handle subscribes. The
stream is closed when the last handle unsubscribes, and reopened by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from bursar.providers.client._types import LeaseEvent

if TYPE_CHECKING:
    from bursar.providers.client._aio import AsyncBrokerClient

__all__ = ["LeaseWatcher"]

log = logging.getLogger("bursar.providers.client")

_UNCLAIMED_LEASES = 1024
"""Leases whose events are kept until a handle claims them (the oldest are dropped)."""

_UNCLAIMED_EVENTS = 16
"""Events kept per unclaimed lease."""


class _Subscriber:
    __slots__ = ("on_error", "on_event")

    def __init__(
        self, on_event: Callable[[LeaseEvent], None], on_error: Callable[[BaseException], None]
    ) -> None:
        self.on_event = on_event
        self.on_error = on_error


class LeaseWatcher:
    """Dispatches one Watch stream's events to the handles of the leases they concern."""

    def __init__(self, client: AsyncBrokerClient) -> None:
        self._client = client
        self._subs: dict[str, _Subscriber] = {}
        self._unclaimed: OrderedDict[str, list[LeaseEvent]] = OrderedDict()
        self._task: asyncio.Task[None] | None = None
        self._opened = asyncio.Event()
        self._failure: BaseException | None = None
        self._holds = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def hold(self, timeout_s: float) -> None:
        """Keep the stream open for a lease about to be acquired (until :meth:`unhold`
        or :meth:`unsubscribe`), opening it if needed, and wait up to ``timeout_s`` for
        the broker to register it. A failure to open reaches the subscribers' on_error."""
        self._holds += 1
        if not self.running:
            self._opened = asyncio.Event()
            self._failure = None
            self._unclaimed.clear()
            self._task = asyncio.create_task(self._run(), name="bursar lease watcher")
        task = self._task
        assert task is not None
        opened = asyncio.ensure_future(self._opened.wait())
        try:
            await asyncio.wait([opened, task], timeout=timeout_s, return_when="FIRST_COMPLETED")
        finally:
            opened.cancel()

    def unhold(self) -> None:
        """Give up a hold that did not lead to a lease (the Acquire failed)."""
        self._holds -= 1
        self._maybe_close()

    def subscribe(
        self,
        lease_id: str,
        on_event: Callable[[LeaseEvent], None],
        on_error: Callable[[BaseException], None],
    ) -> None:
        """Deliver ``lease_id``'s events to ``on_event``, first those already seen. The
        caller's hold now belongs to this subscription."""
        self._subs[lease_id] = _Subscriber(on_event, on_error)
        for ev in self._unclaimed.pop(lease_id, []):
            on_event(ev)
        if self._failure is not None:
            on_error(self._failure)

    def unsubscribe(self, lease_id: str) -> None:
        if self._subs.pop(lease_id, None) is not None:
            self._holds -= 1
            self._maybe_close()

    def _maybe_close(self) -> None:
        if self._holds <= 0:
            self.close()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._unclaimed.clear()

    async def aclose(self) -> None:
        task = self._task
        self.close()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        try:
            while True:  # an open-ended stream ends only by failing; if it ever ends, reopen
                async for ev in self._client._watch([], True, None, self._opened.set):
                    self._dispatch(ev)
                clock = self._client.clock
                await clock.sleep_until(clock.now() + self._client._conn.backoff.initial_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported to every handle, raised again at their exit
            log.error("the lease watch stream failed: %s", exc)
            self._failure = exc
            for sub in list(self._subs.values()):
                sub.on_error(exc)

    def _dispatch(self, ev: LeaseEvent) -> None:
        sub = self._subs.get(ev.lease.id)
        if sub is not None:
            sub.on_event(ev)
            return
        kept = self._unclaimed.setdefault(ev.lease.id, [])
        self._unclaimed.move_to_end(ev.lease.id)
        kept.append(ev)
        del kept[:-_UNCLAIMED_EVENTS]
        while len(self._unclaimed) > _UNCLAIMED_LEASES:
            self._unclaimed.popitem(last=False)
