"""EASY backfill: the head of the queue gets a reservation; others may jump ahead if they
do not delay it.

At each pass the jobs at the front start while they fit. The first that does not (the
head) gets the *shadow time*, the earliest instant enough running jobs will have ended
(by their requested durations) for it to start, and the *extra* processors left over at
that instant. A later job may start now if it fits and either ends by the shadow time or
uses no more than the extra processors (which it then takes from the extra).

Jobs hold their processors for their recorded runtime; the requested duration is only
the estimate. A running job past its estimate is assumed to end at any moment: its
estimated end counts as now. So the head's reservation slips (the shadow moves with
time) until the job really ends, and a job started because it would end by the shadow
may overrun and delay the head further: EASY keeps no promise an estimate cannot back,
and capacity is the kernel's free processors, never the estimate.

A pass without any end since the last one changes nothing for the jobs already looked
at (free processors and the shadow can only have shrunk), so only newly submitted jobs
are checked; a full pass runs after an end, when the head changes, or when a running
job's estimated end has passed without its ending (the shadow and the extra processors
change then). The order of the queue is a key: submit order here, shortest duration
first in ``sjf``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from math import inf
from typing import Any, ClassVar

from sortedcontainers import SortedList

from bursar.sim.replay.mapping import ReplayConfig, Workload


class Easy:
    name: ClassVar[str] = "easy"
    timed: ClassVar[bool] = False
    kills: ClassVar[bool] = False

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        self.size = w.size
        self.dur = w.duration
        self.queue: list[int] = []
        self.running = SortedList()  # (expected end, job)
        self.expected: dict[int, float] = {}
        self.fresh: list[int] = []
        self.dirty = True
        self.shadow = 0.0
        self.extra = 0
        self.recheck_at = inf
        """The first estimated end after the last full pass: a full pass is due from then."""

    def order(self) -> Callable[[int], Any] | None:
        """Sort key of the queue; None keeps submit order."""
        return None

    def submit(self, j: int, now: float) -> None:
        key = self.order()
        if key is None:
            self.queue.append(j)
        else:
            bisect.insort(self.queue, j, key=key)
        if self.queue[0] == j:
            self.dirty = True
        self.fresh.append(j)

    def finish(self, j: int, now: float) -> None:
        self.running.remove((self.expected.pop(j), j))
        self.dirty = True

    def extend(self, j: int, end: float, now: float) -> None:
        """Running job ``j`` outlived its estimate: it is now expected to end at ``end``
        (a runtime estimate's correction, ``estimate.Estimated``); a full pass follows."""
        self.running.remove((self.expected[j], j))
        self.expected[j] = end
        self.running.add((end, j))
        self.dirty = True

    def killed(self) -> list[tuple[int, float]]:
        return []

    def wakeup(self) -> float | None:
        return None

    def _start(self, j: int, now: float, out: list[int]) -> None:
        e = now + self.dur[j]
        self.expected[j] = e
        self.running.add((e, j))
        if e < self.recheck_at:
            self.recheck_at = e
        out.append(j)

    def schedule(self, now: float, free: int) -> list[int]:
        out: list[int] = []
        if not self.queue:
            self.fresh.clear()
            return out
        if not self.dirty and self.recheck_at > now:
            return self._new_only(now, free, out)
        self.dirty = False
        self.fresh.clear()
        running = self.running
        i = running.bisect_right((now, inf))
        self.recheck_at = running[i][0] if i < len(running) else inf
        return self._full(now, free, out)

    def _full(self, now: float, free: int, out: list[int]) -> list[int]:
        """A full pass: the front starts while it fits, the head gets its shadow time and
        the rest backfill (``PowerEasy`` counts watts too)."""
        q, size, dur = self.queue, self.size, self.dur
        k = 0
        while k < len(q) and size[q[k]] <= free:
            free -= size[q[k]]
            self._start(q[k], now, out)
            k += 1
        if k == len(q):
            self.queue = []
            return out
        head = q[k]
        need = size[head]
        avail = free
        shadow = now
        it = iter(self.running)
        for e, r in it:
            if avail >= need and e > shadow:
                break
            avail += size[r]
            if e > shadow:  # a job past its estimate ends at any moment: now
                shadow = e
        extra = avail - need
        rest = [head]
        for x in range(k + 1, len(q)):
            j = q[x]
            if free <= 0:
                rest.extend(q[x:])
                break
            s = size[j]
            if s <= free:
                ends_late = now + dur[j] > shadow
                if not ends_late or s <= extra:
                    free -= s
                    if ends_late:
                        extra -= s
                    self._start(j, now, out)
                    continue
            rest.append(j)
        self.queue = rest
        self.shadow, self.extra = shadow, extra
        return out

    def _new_only(self, now: float, free: int, out: list[int]) -> list[int]:
        size, dur = self.size, self.dur
        fresh = self.fresh
        key = self.order()
        if key is not None and len(fresh) > 1:
            fresh.sort(key=key)
        # The shadow is never in the past: a job past its estimate ends at any moment.
        shadow = self.shadow if self.shadow > now else now
        for j in fresh:
            s = size[j]
            if s > free:
                continue
            ends_late = now + dur[j] > shadow
            if not ends_late or s <= self.extra:
                free -= s
                if ends_late:
                    self.extra -= s
                self.queue.remove(j)
                self._start(j, now, out)
        fresh.clear()
        return out
