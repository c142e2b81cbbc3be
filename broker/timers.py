"""The engine's timers: what is due when, and whether a timer still matters.

A timer is (due time, push order, kind, reference). Timers are never removed when what they
were set for changes (a renewal, a grant, a node put to use): a later check of liveness
drops them instead, when they come due or when ``next_due`` looks at the top of the heap.
So a timer's liveness must be a pure function of the state that can only go from live to
dead, never back: ``next_due`` (which a shell polls and a replay does not) drops dead
timers, and a replay must fire exactly the timers the original run fired.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from bursar.broker.lease import Lease, LeaseState

if TYPE_CHECKING:
    from bursar.broker.elastic import ElasticLeases
    from bursar.broker.pending import Queues
    from bursar.broker.power import PowerControl


class TimerKind(StrEnum):
    """What a timer is for; its reference names what it is for."""

    EXPIRE = "expire"
    """A lease's end (reference: the lease); live while that is still its end."""
    DEADLINE = "deadline"
    """A reclaimed lease's revocation (the lease); live while it is being preempted."""
    AGE = "age"
    """A queued request's head-of-line patience (the request); live while it waits unaged."""
    WAKE = "wake"
    """A bucket-blocked campaign's next look (the campaign); live while it is the one set."""
    IDLE = "idle"
    """An idle node's power-down check (the node); live for the idle spell it was set for."""
    RESIZE = "resize"
    """An elastic lease's announced shrink (the extent it ends); live while it is announced
    for that time."""


class TimerSources(Protocol):
    """What liveness reads: the engine's live leases, its queue and its power state."""

    @property
    def leases(self) -> Mapping[str, Lease]: ...

    @property
    def queue(self) -> Queues: ...

    @property
    def power(self) -> PowerControl: ...

    @property
    def elastic(self) -> ElasticLeases: ...


class Timers:
    """A heap of timers in (due time, push order): equal times fire in the order set."""

    __slots__ = ("_heap", "_seq", "_src")

    def __init__(self, src: TimerSources) -> None:
        self._heap: list[tuple[float, int, TimerKind, str]] = []
        self._seq = 0
        self._src = src

    def __len__(self) -> int:
        return len(self._heap)

    def __getstate__(self) -> tuple[None, dict[str, object]]:
        """The live timers only, in firing order (a sorted list is a heap). A shell's polls
        of ``next_due`` drop dead timers that a replay keeps: dropping them all here gives
        the polled engine and its replay the same state, and neither fires a dead one."""
        live = sorted(x for x in self._heap if self.live(x[0], x[2], x[3]))
        return None, {"_heap": live, "_seq": self._seq, "_src": self._src}

    def push(self, t: float, kind: TimerKind, ref: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, ref))

    def live(self, t: float, kind: TimerKind, ref: str) -> bool:
        src = self._src
        if kind is TimerKind.EXPIRE:
            ls = src.leases.get(ref)
            return ls is not None and ls.expires_at == t
        if kind is TimerKind.DEADLINE:
            ls = src.leases.get(ref)
            return ls is not None and ls.state is LeaseState.PREEMPTING
        if kind is TimerKind.AGE:
            return src.queue.ageing(ref)
        if kind is TimerKind.WAKE:
            # One wake-up per campaign at a time (the earliest asked for); a later or
            # superseded one is dead for good, so dropping it in next_due() is safe.
            return src.queue.wake_at.get(ref) == t
        if kind is TimerKind.IDLE:
            # Live only for the idle spell it was set for: once the node is used (or powered
            # off) the spell ends and this timer stays dead, even if the node idles again
            # later (that spell has its own timer).
            return src.power.idle_check_at(ref) == t
        if kind is TimerKind.RESIZE:
            # An extent ends once; its announcement is never moved, only dropped with it.
            return src.elastic.warned_at(ref) == t
        return False

    def next_due(self) -> float | None:
        """When the next live timer is due; drops the dead ones on top on the way."""
        heap = self._heap
        while heap:
            t, _, kind, ref = heap[0]
            if self.live(t, kind, ref):
                return t
            heapq.heappop(heap)
        return None

    def due(self, to: float) -> Iterator[tuple[float, TimerKind, str]]:
        """The live timers due by ``to``, in order, popped as they are yielded. What the
        caller does with one may set or kill others: the heap is read afresh each time."""
        heap = self._heap
        while heap and heap[0][0] <= to:
            t, _, kind, ref = heapq.heappop(heap)
            if self.live(t, kind, ref):
                yield t, kind, ref
