"""Actuation: carrying committed decisions out on the pool backend, and hearing back.

A request ends at the journal commit: the engine has decided and the journal holds it.
Making the decisions real (power a node on, make a lease's Slurm allocation, cancel it,
signal it) is the actuator's job, and what comes of it is reported back as *reports* that
the broker takes in like any other input (``Runtime.catch_up``):

* an engine event (``NodeReady``, ``NodeLost``, ``LeaseLost``), submitted through the
  normal path and journaled. A placement the backend cannot make (``PlaceFailed``) is a
  ``LeaseLost`` with the backend's answer as the cause: the lease ends, and its holder
  hears it on its Watch stream;
* :class:`Placed`: a lease's resources are usable now (its allocation is ready). The
  runtime journals it as an ``AllocationReady`` event with the backend's allocation
  details; the engine records an ``Allocated`` decision, the service answers the Acquire
  that waited for it, and the holder's Watch stream hears ALLOCATED, in journal order.

Two actuators, one interface:

* :class:`InlineActuator` calls the backend at once, in the caller's thread, in decision
  order: the simulated pool, whose runs the simulator and the demo replay bit for bit. A
  placement completes inside ``actuate``, so it never reports :class:`Placed`.
* :class:`ThreadedActuator` hands the calls to worker threads and returns at once, for
  backends that declare themselves ``slow`` (Slurm: ``salloc`` may wait for minutes). Each
  lease's calls run in decision order on one lane (place, then warn, then unplace); lanes
  run side by side, so one lease's slow allocation holds up no other request. A placement
  waits only for the unplacing of the leases that held its nodes before (Slurm would
  otherwise find the node still busy with the old job and start the new one a scheduling
  pass later). Node power calls share a lane of their own. A poller thread asks the
  backend for its events (Slurm's ``squeue`` / ``sinfo`` comparison) when they fall due,
  off the event loop too.
"""

from __future__ import annotations

import abc
import logging
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bursar.broker.backends.base import PlaceFailed, PoolBackend, apply_decision, placed_by
from bursar.broker.clock import Clock, as_clock
from bursar.broker.decisions import (
    Decision,
    Expired,
    PoweredOff,
    PoweredOn,
    PreemptWarned,
    Released,
    Resized,
    Revoked,
)
from bursar.broker.events import Event, LeaseLost

__all__ = [
    "Actuator",
    "InlineActuator",
    "Placed",
    "Report",
    "ThreadedActuator",
    "actuator_for",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Call:
    """A decision for a lane: what it waits for first, and what it sets once carried out."""

    decision: Decision
    after: tuple[threading.Event, ...] = ()
    done: threading.Event | None = None


@dataclass(frozen=True, slots=True)
class Placed:
    """A lease's placement is done: its resources are usable (a Slurm allocation is ready)."""

    lease_id: str
    at: float


Report = Event | Placed
"""What an actuator reports: an engine event for the broker to submit, or a placement done."""


def _lost(lease_id: str, at: float, exc: BaseException) -> LeaseLost:
    cause = str(exc) if isinstance(exc, PlaceFailed) else f"placement failed: {exc}"
    return LeaseLost(at=at, lease_id=lease_id, cause=cause or type(exc).__name__)


class Actuator(abc.ABC):
    """Carries committed decisions out on ``backend`` and reports what came of them."""

    asynchronous: bool = False
    """True: ``actuate`` returns before the backend has acted, and reports arrive later,
    from another thread (``on_report`` says when)."""

    def __init__(self, backend: PoolBackend) -> None:
        self.backend = backend

    @abc.abstractmethod
    def actuate(self, decisions: Iterable[Decision]) -> None:
        """Carry out the backend side of committed decisions, in their order."""

    @abc.abstractmethod
    def due(self, now: float) -> list[Report]:
        """Reports that happened by ``now``, in time order; each once."""

    @abc.abstractmethod
    def next_report_time(self) -> float | None:
        """The earliest ``now`` at which ``due`` returns something, or None if nothing is
        expected (yet: an asynchronous actuator's reports may arrive at any time)."""

    def on_report(self, notify: Callable[[], None] | None) -> None:  # noqa: B027
        """Call ``notify()`` (from a worker thread) whenever a report arrives, so that the
        caller wakes up to take it. Only asynchronous actuators call it."""

    def close(self) -> None:  # noqa: B027
        """Stop; calls in flight finish first. Reports after this are dropped."""


class InlineActuator(Actuator):
    """Calls the backend at once, in the caller's thread, in decision order."""

    def __init__(self, backend: PoolBackend) -> None:
        super().__init__(backend)
        self._lost: list[LeaseLost] = []

    def actuate(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            try:
                apply_decision(self.backend, d)
            except PlaceFailed as exc:
                lease_id = placed_by(d)
                assert lease_id is not None, d
                self._lost.append(_lost(lease_id, d.at, exc))

    def due(self, now: float) -> list[Report]:
        out: list[Report] = [e for e in self._lost if e.at <= now]
        self._lost = [e for e in self._lost if e.at > now]
        t = self.backend.next_event_time()
        # Only when the backend has something: due_events must not be called with a time
        # before the backend's own clock, and a failed placement's report can be older.
        if t is not None and t <= now:
            out.extend(self.backend.due_events(now))
        out.sort(key=lambda r: r.at)
        return out

    def next_report_time(self) -> float | None:
        times = [e.at for e in self._lost]
        t = self.backend.next_event_time()
        if t is not None:
            times.append(t)
        return min(times, default=None)


_POOL_LANE = ""
"""The lane of node power calls (lease lanes are named by lease id, never empty)."""


def _lane(d: Decision) -> str | None:
    """Which lane a decision's backend call runs on; None if it needs none."""
    if isinstance(d, PoweredOn | PoweredOff):
        return _POOL_LANE
    if isinstance(d, Revoked | Expired | Released | PreemptWarned | Resized):
        return d.lease_id
    return placed_by(d)


class ThreadedActuator(Actuator):
    """Drives a slow backend from worker threads: one ordered lane per lease, each lane on a
    thread of its own while it has calls (so that a lane waiting for another never waits
    for a free worker), and a poller thread for the backend's events.

    Report times are read from ``clock`` when the backend has answered (never before the
    time of the decision acted on); the broker moves a report that is older than its
    engine's clock up to that clock.
    """

    asynchronous = True

    def __init__(
        self,
        backend: PoolBackend,
        clock: Clock | Callable[[], float] | None = None,
    ) -> None:
        super().__init__(backend)
        self._clock = as_clock(clock)
        self._lock = threading.Lock()
        self._lanes: dict[str, deque[_Call]] = {}
        # The event loop's own (actuate runs there only): each placed lease's nodes, and per
        # node the unplacings under way that a placement there must wait for.
        self._nodes: dict[str, tuple[str, ...]] = {}
        self._freeing: dict[str, list[threading.Event]] = {}
        self._outbox: list[Report] = []
        self._notify: Callable[[], None] | None = None
        self._last = -math.inf
        self._closed = False
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._threads: set[threading.Thread] = set()
        self._poller = threading.Thread(
            target=self._poll_loop, name="bursar-backend-poll", daemon=True
        )
        self._poller.start()

    # -- the broker's side --------------------------------------------------------------

    def actuate(self, decisions: Iterable[Decision]) -> None:
        for d in decisions:
            lane = _lane(d)
            if lane is None:
                continue
            call = self._call(d)
            with self._lock:
                if self._closed:
                    log.warning("actuator closed: %s %s not carried out", d.kind, lane or "")
                    continue
                queue = self._lanes.get(lane)
                if queue is not None:
                    queue.append(call)  # its lane's worker takes it after what is before it
                    continue
                self._lanes[lane] = deque([call])
                worker = threading.Thread(
                    target=self._run_lane,
                    args=(lane,),
                    name=f"bursar-lane-{lane or 'pool'}",
                    daemon=True,
                )
                self._threads.add(worker)
                worker.start()  # it takes the lock first: it starts once this is done

    def _call(self, d: Decision) -> _Call:
        lease_id = placed_by(d)
        if lease_id is not None:
            nodes: tuple[str, ...] = d.nodes  # type: ignore[attr-defined]
            self._nodes[lease_id] = nodes
            after = []
            for n in nodes:
                waits = [e for e in self._freeing.get(n, ()) if not e.is_set()]
                if waits:
                    self._freeing[n] = waits
                    after += waits
                else:
                    self._freeing.pop(n, None)
            return _Call(d, tuple(after))
        if isinstance(d, Revoked | Expired | Released):
            done = threading.Event()
            for n in self._nodes.pop(d.lease_id, ()):
                self._freeing.setdefault(n, []).append(done)
            return _Call(d, done=done)
        return _Call(d)

    def due(self, now: float) -> list[Report]:
        with self._lock:
            out = [r for r in self._outbox if r.at <= now]
            self._outbox = [r for r in self._outbox if r.at > now]
        out.sort(key=lambda r: r.at)
        return out

    def next_report_time(self) -> float | None:
        with self._lock:
            return min((r.at for r in self._outbox), default=None)

    def on_report(self, notify: Callable[[], None] | None) -> None:
        with self._lock:
            self._notify = notify
            pending = bool(self._outbox)
        if notify is not None and pending:
            notify()

    def busy(self) -> bool:
        """True while some lane has calls queued or running."""
        with self._lock:
            return bool(self._lanes)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every lane is empty (False if ``timeout`` passes first)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._lanes, timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers = list(self._threads)
        for worker in workers:
            worker.join()  # the calls under way finish, and those queued behind them
        self._stop.set()
        self._poke.set()
        self._poller.join()
        with self._lock:
            self._notify = None

    # -- the threads --------------------------------------------------------------------

    def _stamp(self, t: float) -> float:
        """``t``, or the latest time handed to the backend if that is later (a lane that
        runs behind acts at the time it acts, not at its decision's time)."""
        with self._lock:
            self._last = max(self._last, t)
            return self._last

    def _run_lane(self, lane: str) -> None:
        while True:
            with self._lock:
                queue = self._lanes[lane]
                if not queue:
                    del self._lanes[lane]
                    self._threads.discard(threading.current_thread())
                    self._idle.notify_all()
                    return
                call = queue[0]
            try:
                for e in call.after:
                    e.wait()  # another lane's unplace, which always sets it
                self._carry_out(call.decision)
            finally:
                if call.done is not None:
                    call.done.set()
                with self._lock:
                    queue.popleft()

    def _carry_out(self, d: Decision) -> None:
        lease_id = placed_by(d)
        try:
            apply_decision(self.backend, d, self._stamp(d.at))
        except Exception as exc:
            if lease_id is None:
                log.exception("%s: the backend failed to carry it out", d.kind)
                return
            if not isinstance(exc, PlaceFailed):
                log.exception("lease %s: placement failed", lease_id)
            self._report(_lost(lease_id, self._stamp(self._clock.now()), exc))
            return
        finally:
            # The backend may have events now (a start is ready at once on Slurm).
            self._poke.set()
        if lease_id is not None:
            self._report(Placed(lease_id, self._stamp(self._clock.now())))

    def _report(self, r: Report) -> None:
        with self._lock:
            if self._closed and self._stop.is_set():
                return
            self._outbox.append(r)
            notify = self._notify
        if notify is not None:
            notify()

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            self._poke.clear()
            try:
                t = self.backend.next_event_time()
            except Exception:
                log.exception("the backend's next event time failed")
                self._stop.wait(1.0)
                continue
            if t is None:
                self._poke.wait()
                continue
            if self._clock.now() < t:
                # Woken early by a poke (a call that may have made events) or the stop.
                self._clock.wait_until(t, self._poke)
                continue
            try:
                events = self.backend.due_events(self._stamp(self._clock.now()))
            except Exception:
                log.exception("the backend's events could not be read")
                self._stop.wait(1.0)
                continue
            for e in events:
                self._report(e)


def actuator_for(
    backend: PoolBackend, clock: Clock | Callable[[], float] | None = None
) -> Actuator:
    """The actuator a service uses for ``backend``: threaded if it declares itself slow."""
    return ThreadedActuator(backend, clock) if backend.slow else InlineActuator(backend)
