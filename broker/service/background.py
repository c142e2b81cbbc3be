"""The service's background tasks: the timer task (the engine's timers and the backend's
reports as they fall due), the metrics and decision-index refresh, and the journal's WAL
checkpoints, each on the event loop until the service stops; and the signal that wakes
the WatchSupply streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable

from bursar.broker.clock import Clock, wait_event_until
from bursar.broker.errors import JournalError
from bursar.broker.journal import JournalStore
from bursar.broker.runtime import Runtime

__all__ = [
    "CHECKPOINT_INTERVAL_S",
    "INDEX_SLICE",
    "Signal",
    "TimerTask",
    "checkpoints",
    "refreshes",
]

log = logging.getLogger(__name__)

INDEX_SLICE = 200
"""Journal entries the background task adds to the decision index at a time (about 0.7 ms)."""

CHECKPOINT_INTERVAL_S = 1.0
"""How often the journal's WAL is checkpointed, on a worker thread (see ``checkpoints``)."""


class TimerTask:
    """Sleeps until the engine's next timer (expiry, revocation, wake-up) or the backend's
    next event (a node ready), then catches up; woken early when a commit moves what is
    due next (:meth:`moved`), a backend report arrives, or the broker fails."""

    def __init__(self, runtime: Runtime, clock: Clock) -> None:
        self.runtime = runtime
        self._clock = clock
        self.wake = asyncio.Event()
        self._sleeping_until = -math.inf
        """When the task wakes unless woken earlier; -inf while it is not asleep."""
        self._sleeping_for: float | None = None
        """The timer it sleeps for (None: it sleeps for the one-minute cap)."""
        self._stopped = False
        self.fatal: BaseException | None = None
        """What stopped the broker (a journal write it could not roll back): raised here."""

    def next_due(self) -> float | None:
        times = [self.runtime.engine.next_timer(), self.runtime.actuator.next_report_time()]
        present = [t for t in times if t is not None]
        return min(present) if present else None

    def stop(self) -> None:
        self._stopped = True
        self.wake.set()

    def fail(self, exc: BaseException) -> None:
        if self.fatal is None:
            self.fatal = exc
            self.wake.set()

    def moved(self) -> None:
        """After a commit: wake the task only if what is due next moved, earlier than it
        sleeps until or away from the timer it sleeps for (that one died: a renewal, a
        release). Most requests move neither, and a wake-up costs more (a task and a timer
        on the loop) than looking."""
        if self._sleeping_until > -math.inf:
            due = self.next_due()
            if (due is not None and due < self._sleeping_until) or (
                self._sleeping_for is not None and due != self._sleeping_for
            ):
                self.wake.set()

    async def run(self, catch_up: Callable[[], None]) -> None:
        """Call ``catch_up`` whenever something falls due, until stopped."""
        loop = asyncio.get_running_loop()

        def reported() -> None:  # from an actuator thread: a report is waiting
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to wake
                loop.call_soon_threadsafe(self.wake.set)

        self.runtime.actuator.on_report(reported)
        try:
            await self._run(catch_up)
        finally:
            self.runtime.actuator.on_report(None)

    async def _run(self, catch_up: Callable[[], None]) -> None:
        while not self._stopped:
            if self.fatal is not None:
                raise self.fatal
            self.wake.clear()
            self._sleeping_until = -math.inf  # awake: decisions need not wake it
            due = self.next_due()
            wall = self._clock.now()
            if due is not None and due <= wall:
                catch_up()
                continue
            # Until the next timer on the clock or a decision's wake-up; a minute at most, as
            # a backend's next event may move without one.
            until = wall + 60.0 if due is None else min(wall + 60.0, due)
            self._sleeping_until = until
            self._sleeping_for = due if until == due else None
            try:
                await wait_event_until(self._clock, self.wake, until)
            finally:
                self._sleeping_until = -math.inf
        if self.fatal is not None:
            raise self.fatal


class Signal:
    """Wakes whoever waits (the WatchSupply streams) at the next :meth:`notify`; costs
    nothing while nobody waits."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiters = 0

    def notify(self) -> None:
        if not self._waiters:
            return  # nobody waits: no new event per decision
        ev, self._event = self._event, asyncio.Event()
        ev.set()

    async def wait(self, timeout_s: float) -> None:
        """Until the next notify, or ``timeout_s``."""
        self._waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout_s)
        finally:
            self._waiters -= 1


async def refreshes(
    journal: JournalStore, refresh: Callable[[], None], stop: asyncio.Event, interval_s: float
) -> None:
    """Every ``interval_s``: ``refresh`` (the metrics), then bring the journal's decision
    index up to date (in bulk, off the requests' path, so that a ListDecisions after a
    busy spell has little left to index)."""
    while not stop.is_set():
        refresh()
        try:
            # In slices, yielding between them: one second of a busy broker's entries
            # at once would hold up its requests for milliseconds.
            while journal.update_index(INDEX_SLICE) == INDEX_SLICE:
                await asyncio.sleep(0)
        except JournalError as exc:  # the next query tries again (and says why)
            log.warning("could not update the journal's decision index: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def checkpoints(journal: JournalStore, stop: asyncio.Event, interval_s: float) -> None:
    """Checkpoint the journal's WAL on a worker thread, instead of inside whichever commit
    takes it past SQLite's threshold: a checkpoint fsyncs, and on a busy disk the commit
    doing it held the event loop, and every call, for up to seconds."""
    journal.manual_checkpoints()
    while not stop.is_set():
        try:
            await asyncio.to_thread(journal.checkpoint)
        except JournalError as exc:  # the next round tries again; appends go on
            log.warning("journal checkpoint failed: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
