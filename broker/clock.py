"""One clock for everything that waits: the service's timers, its rate limiter, the
providers' lease renewal.

Code that reads the time or sleeps takes a :class:`Clock` instead of calling ``time.time``
or ``asyncio.sleep`` itself, so a test can hand it a :class:`ManualClock` and drive it to
exact times: ``advance(5)`` wakes precisely the sleepers due by then, and ``sleepers()``
tells the test when the code under test has gone to sleep (so it never has to guess with a
real sleep).

Times are seconds since the epoch (``time.time()`` scale) everywhere, for sleeping too:
``sleep_until(t)`` and ``wait_until(t)`` take an absolute time, so a wait computed from
``now()`` cannot drift by the time spent between reading the clock and going to sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar, runtime_checkable

__all__ = [
    "SYSTEM",
    "AutojumpClock",
    "Clock",
    "FuncClock",
    "ManualClock",
    "SystemClock",
    "as_clock",
    "wait_event_until",
    "wait_for",
]

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """Reads the time and sleeps until a given time."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep_until(self, t: float) -> None:
        """Return once ``now() >= t`` (at once if it already is)."""
        ...

    def wait_until(self, t: float, stop: threading.Event | None = None) -> bool:
        """Block the calling thread until ``now() >= t`` or ``stop`` is set.

        True if ``t`` was reached; False if ``stop`` is set (also when it was set before
        the call, or together with reaching ``t``), so ``while clock.wait_until(t, stop):``
        ends once ``stop`` is set even when the loop runs behind the clock.
        """
        ...


class SystemClock:
    """The wall clock: ``time.time()``, asyncio's timers and ``threading.Event.wait``."""

    def now(self) -> float:
        return time.time()

    async def sleep_until(self, t: float) -> None:
        # Loop: asyncio's timers run on the monotonic clock, so a wall-clock step during
        # the sleep can wake it early; sleep again for what is left.
        while (left := t - time.time()) > 0:
            await asyncio.sleep(left)

    def wait_until(self, t: float, stop: threading.Event | None = None) -> bool:
        return _wait_real(time.time, t, stop)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM = SystemClock()


def _wait_real(now: Callable[[], float], t: float, stop: threading.Event | None) -> bool:
    while (left := t - now()) > 0:
        if stop is None:
            time.sleep(left)
        elif stop.wait(left):
            return False
    return stop is None or not stop.is_set()


class FuncClock(SystemClock):
    """A bare ``() -> float`` (seconds since the epoch) as a :class:`Clock`.

    For callers that still pass a function: sleeping polls the function after sleeping the
    remaining time in real seconds, so a function that runs ahead of the wall clock wakes
    sleepers early, never late.
    """

    def __init__(self, func: Callable[[], float]) -> None:
        self._func = func

    def now(self) -> float:
        return self._func()

    async def sleep_until(self, t: float) -> None:
        while (left := t - self._func()) > 0:
            await asyncio.sleep(left)

    def wait_until(self, t: float, stop: threading.Event | None = None) -> bool:
        return _wait_real(self._func, t, stop)

    def __repr__(self) -> str:
        return f"FuncClock({self._func!r})"


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """A :class:`Clock` from a clock, a bare time function (wrapped), or None (the wall clock)."""
    if clock is None:
        return SYSTEM
    if isinstance(clock, Clock):
        return clock
    if callable(clock):
        return FuncClock(clock)
    raise TypeError(f"not a clock: {clock!r}")


async def wait_event_until(clock: Clock, event: asyncio.Event, t: float) -> bool:
    """Wait until ``event`` is set or ``clock`` reaches ``t``, whichever comes first.

    True if the event was set. ``t`` may be ``math.inf`` (wait for the event only).
    """
    if event.is_set():
        return True
    if type(clock) is SystemClock:
        # The wall clock: asyncio's own timeout, without the two tasks the general case
        # needs (this wait runs once per request in the service's timer task). Waking a
        # little early is harmless: callers check the time again.
        timeout = max(0.0, t - clock.now()) if math.isfinite(t) else None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        return event.is_set()
    waiter = asyncio.ensure_future(event.wait())
    tasks: set[asyncio.Future[object]] = {waiter}
    if math.isfinite(t):
        tasks.add(asyncio.ensure_future(clock.sleep_until(t)))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return event.is_set()


async def wait_for(clock: Clock, aw: Awaitable[T], t: float) -> T:
    """``asyncio.wait_for`` with a deadline on ``clock``: ``aw``'s result, or TimeoutError
    (``aw`` cancelled) if ``clock`` reaches ``t`` first. ``t`` may be ``math.inf``."""
    task = asyncio.ensure_future(aw)
    if not math.isfinite(t):
        return await task
    sleeper = asyncio.ensure_future(clock.sleep_until(t))
    try:
        await asyncio.wait({task, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        sleeper.cancel()
    if task.done():  # also when both finished together: the result wins
        return task.result()
    task.cancel()
    await asyncio.wait({task})  # let it finish cancelling (its own error is not ours)
    raise TimeoutError


class _ThreadWaiter:
    __slots__ = ("deadline", "event")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.event = threading.Event()


class ManualClock:
    """A clock that moves only when told to, for tests.

    ``advance(dt)`` / ``set(t)`` move it forward (never back) and wake, from any thread,
    every async sleeper (on the event loop it awaits from) and every thread waiter whose
    time has come. ``sleepers()`` counts those still waiting.
    """

    # How often a thread waiter with a ``stop`` event looks at it (real seconds): a
    # threading.Event cannot be waited on together with another, and ``stop`` is set by
    # code that knows nothing of this clock. Only the reaction to ``stop`` is polled; the
    # clock's own wake-ups are immediate.
    STOP_POLL_S = 0.01

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._async: list[tuple[float, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._threads: list[_ThreadWaiter] = []

    def now(self) -> float:
        return self._now

    def advance(self, dt: float) -> None:
        """Move the clock ``dt`` seconds forward (``dt >= 0``)."""
        if not dt >= 0:
            raise ValueError(f"ManualClock cannot go backwards (advance by {dt})")
        with self._lock:
            self._move(self._now + dt)

    def set(self, t: float) -> None:
        """Move the clock to ``t`` (``t >= now()``)."""
        with self._lock:
            if not t >= self._now:
                raise ValueError(f"ManualClock cannot go backwards ({t} < {self._now})")
            self._move(float(t))

    def sleepers(self) -> int:
        """How many async sleepers and thread waiters are waiting now."""
        with self._lock:
            return len(self._async) + len(self._threads)

    def deadlines(self) -> list[float]:
        """The times the sleepers wait for, earliest first (one entry per sleeper)."""
        with self._lock:
            return sorted([d for d, _, _ in self._async] + [w.deadline for w in self._threads])

    def next_deadline(self) -> float | None:
        """The earliest time a sleeper waits for (None: nobody waits)."""
        return min(self.deadlines(), default=None)

    def _move(self, t: float) -> None:
        # Caller holds the lock.
        self._now = t
        due = [s for s in self._async if s[0] <= t]
        self._async = [s for s in self._async if s[0] > t]
        for _, loop, fut in due:
            # RuntimeError: the sleeper's loop is closed, nobody is left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, fut)
        for w in self._threads:
            if w.deadline <= t:
                w.event.set()
        self._threads = [w for w in self._threads if w.deadline > t]

    async def sleep_until(self, t: float) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._now >= t:
                return
            fut: asyncio.Future[None] = loop.create_future()
            entry = (t, loop, fut)
            self._async.append(entry)
        try:
            await fut
        finally:
            # Cancelled (or woken): make sure it no longer counts as a sleeper.
            with self._lock:
                if entry in self._async:
                    self._async.remove(entry)

    def wait_until(self, t: float, stop: threading.Event | None = None) -> bool:
        with self._lock:
            if self._now >= t or (stop is not None and stop.is_set()):
                return stop is None or not stop.is_set()
            waiter = _ThreadWaiter(t)
            self._threads.append(waiter)
        try:
            if stop is None:
                waiter.event.wait()
                return True
            while not waiter.event.wait(self.STOP_POLL_S):
                if stop.is_set():
                    return False
            return not stop.is_set()
        finally:
            with self._lock:
                if waiter in self._threads:
                    self._threads.remove(waiter)

    def __repr__(self) -> str:
        return f"ManualClock({self._now!r})"


class AutojumpClock(ManualClock):
    """A :class:`ManualClock` that moves itself: once the event loops that sleep on it have
    nothing else to do, it jumps to the earliest time one of their sleepers waits for (as
    trio's ``MockClock(autojump_threshold=0)``). A test then runs timers of minutes in
    milliseconds, in the order of their deadlines, without calling ``advance``.

    "Nothing else to do" is seen from the loop: the clock goes unused (no sleeper added,
    woken or cancelled, no move) for ``idle_passes`` turns of the loop in a row and then,
    with ``threshold_s`` > 0, for that many real seconds more. Work done elsewhere (a
    gRPC reply on its way, a thread) is not seen: give a threshold that covers it (0.05 s
    for loopback gRPC) when a sleeper races such work. Thread waiters (``wait_until``)
    are woken by the jumps but do not cause one. ``advance`` and ``set`` still work.
    """

    def __init__(self, start: float = 0.0, threshold_s: float = 0.0, idle_passes: int = 3) -> None:
        if not threshold_s >= 0 or idle_passes < 1:
            raise ValueError(f"threshold_s must be >= 0 ({threshold_s}), idle_passes >= 1")
        super().__init__(start)
        self.threshold_s = threshold_s
        self.idle_passes = idle_passes
        self._activity = 0
        self._watched: set[asyncio.AbstractEventLoop] = set()

    def _move(self, t: float) -> None:
        self._activity += 1
        super()._move(t)

    async def sleep_until(self, t: float) -> None:
        loop = asyncio.get_running_loop()
        self._activity += 1
        if loop not in self._watched:
            self._watched.add(loop)
            loop.call_soon(self._look, loop, self._activity, self.idle_passes, False)
        try:
            await super().sleep_until(t)
        finally:
            self._activity += 1

    def _look(self, loop: asyncio.AbstractEventLoop, seen: int, passes: int, waited: bool) -> None:
        # One turn of the loop: anything touching the clock since the last look starts the
        # count again; a quiet count (and threshold) ends in a jump to the next deadline.
        with self._lock:
            mine = [d for d, lp, _ in self._async if lp is loop]
        if not mine:
            self._watched.discard(loop)  # the next sleeper looks again
            return
        if self._activity != seen:
            seen, passes, waited = self._activity, self.idle_passes, False
        elif passes > 0:
            passes -= 1
        elif self.threshold_s > 0 and not waited:
            loop.call_later(self.threshold_s, self._look, loop, seen, 0, True)
            return
        else:
            with self._lock:
                if min(mine) > self._now:
                    self._move(min(mine))
            seen, passes, waited = self._activity, self.idle_passes, False
        loop.call_soon(self._look, loop, seen, passes, waited)

    def __repr__(self) -> str:
        return f"AutojumpClock({self._now!r}, threshold_s={self.threshold_s!r})"


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
