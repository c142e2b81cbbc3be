"""The simulator's clock: a heap of ``(time, priority, seq, callback)``, SimPy-sized.

``schedule(at, fn)`` puts a callback on the heap; ``run(until)`` pops them in order. The
sequence number makes same-time, same-priority callbacks run first in, first out, so a
run is a deterministic function of what was scheduled. Nothing here reads a clock.

A *process* is a coroutine (``async def``) that awaits only ``Command`` objects (see
``Sleep``, ``Wait``); the kernel drives it with ``coro.send(value)`` and resumes it at the
virtual time the command asks for. No asyncio is involved in virtual time.

A *source* is something outside the heap with its own timers (the broker: its engine's
expiries and the simulated pool's boots): before each callback the kernel asks every
source for its next time and lets it fire first if that comes no later.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "NORMAL",
    "URGENT",
    "Command",
    "Kernel",
    "Process",
    "Signal",
    "Sleep",
    "Source",
    "Wait",
]

URGENT = 0
"""Runs before NORMAL callbacks at the same time (a process resumed by a broker decision)."""
NORMAL = 1


class Source(Protocol):
    def next_time(self) -> float | None: ...

    def fire(self, t: float) -> None: ...


class Command:
    """Something a process awaits; the kernel interprets it."""

    def __await__(self) -> Generator[Command, Any, Any]:
        return (yield self)


@dataclass(frozen=True, slots=True)
class Sleep(Command):
    seconds: float


@dataclass(slots=True)
class Signal:
    """A one-shot event a process can wait on: ``succeed(value)`` resumes every waiter."""

    value: Any = None
    fired: bool = False
    _waiters: list[Process] = field(default_factory=list)

    def succeed(self, kernel: Kernel, value: Any = None) -> None:
        if self.fired:
            raise RuntimeError("a Signal fires once")
        self.fired, self.value = True, value
        for p in self._waiters:
            kernel.resume(p, value, URGENT)
        self._waiters.clear()


@dataclass(frozen=True, slots=True)
class Wait(Command):
    """Wait for ``signal``; resumes with its value, or with ``None`` after ``timeout``."""

    signal: Signal
    timeout: float | None = None


class Process:
    """A coroutine the kernel drives. ``done`` fires with its return value."""

    __slots__ = ("_token", "coro", "done", "error", "name")

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self.coro = coro
        self.name = name
        self.done = Signal()
        self.error: BaseException | None = None
        self._token = 0  # bumped on every resume: a stale wake-up (timeout) is ignored


class Kernel:
    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._sources: list[Source] = []
        self.steps = 0

    # -- the heap ----------------------------------------------------------------------

    def schedule(self, at: float, fn: Callable[[], None], priority: int = NORMAL) -> None:
        if at < self.now:
            raise ValueError(f"cannot schedule at {at}, before now ({self.now})")
        heapq.heappush(self._queue, (at, priority, next(self._seq), fn))

    def peek(self) -> float | None:
        return self._queue[0][0] if self._queue else None

    def add_source(self, source: Source) -> None:
        self._sources.append(source)

    def step(self) -> None:
        at, _, _, fn = heapq.heappop(self._queue)
        self.now = at
        self.steps += 1
        fn()

    def run(self, until: float) -> None:
        """Run every callback due by ``until`` (sources first at equal times); end at ``until``."""
        while True:
            t_heap = self.peek()
            t_src, src = self._next_source()
            if t_src is not None and t_src <= until and (t_heap is None or t_src <= t_heap):
                self.now = max(self.now, t_src)
                src.fire(t_src)  # type: ignore[union-attr]
                continue
            if t_heap is None or t_heap > until:
                break
            self.step()
        self.now = max(self.now, until)

    def _next_source(self) -> tuple[float | None, Source | None]:
        best: tuple[float | None, Source | None] = (None, None)
        for s in self._sources:
            t = s.next_time()
            if t is not None and (best[0] is None or t < best[0]):
                best = (t, s)
        return best

    # -- processes ---------------------------------------------------------------------

    def spawn(
        self, coro: Coroutine[Any, Any, Any], name: str = "", at: float | None = None
    ) -> Process:
        p = Process(coro, name or getattr(coro, "__name__", "process"))
        self.schedule(self.now if at is None else at, lambda: self._drive(p, None))
        return p

    def resume(self, p: Process, value: Any = None, priority: int = NORMAL) -> None:
        token = p._token
        self.schedule(self.now, lambda: self._drive(p, value, token), priority)

    def _drive(self, p: Process, value: Any, token: int | None = None) -> None:
        if token is not None and token != p._token:
            return  # superseded (a timeout that lost to its signal, or vice versa)
        p._token += 1
        try:
            cmd = p.coro.send(value)
        except StopIteration as stop:
            p.done.succeed(self, stop.value)
            return
        except BaseException as exc:
            p.error = exc
            raise
        if isinstance(cmd, Sleep):
            token = p._token
            self.schedule(self.now + max(0.0, cmd.seconds), lambda: self._drive(p, None, token))
        elif isinstance(cmd, Wait):
            sig = cmd.signal
            if sig.fired:
                self.resume(p, sig.value, URGENT)
                return
            sig._waiters.append(p)
            if cmd.timeout is not None:
                token = p._token

                def timed_out() -> None:
                    if p in sig._waiters:
                        sig._waiters.remove(p)
                        self._drive(p, None, token)

                self.schedule(self.now + max(0.0, cmd.timeout), timed_out)
        else:
            raise TypeError(f"process {p.name} awaited {cmd!r}; await only kernel commands")
