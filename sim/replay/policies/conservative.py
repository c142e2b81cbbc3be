"""Conservative backfill: every queued job holds a reservation; a job may start early
only where it delays no reservation.

A job gets, on arrival, the earliest slot in the availability profile where it fits for
its requested duration. When a job ends before its requested duration, the freed part
of the profile is returned and the queue is *compressed*: in reservation order (which is
submit order at arrival), each job gives up its reservation and takes the earliest slot
again, which is never later than before; jobs whose slot is now start now.

A reservation may fall due at an instant when nothing else happens (the job it waited
for was itself moved earlier), so the policy is ``timed``: the kernel wakes it at the
earliest reserved start.

Jobs hold their processors for their recorded runtime; the profile knows only their
requested durations (the estimate). A running job past its estimate is assumed to end
at any moment: the profile holds it until its estimated end and no longer, so from then
on the profile has room that the machine has not. A job whose slot comes due when the
machine's free processors (the kernel's, never the profile's) cannot take it is
*blocked*: its reservation slips, one instant at a time. At every later instant it
moves its slot to start then and is due again, ahead of the jobs that come due after
it; it starts at the first instant the machine has room. A reservation its moving slot
runs into may slip in turn when it comes due. So capacity is never exceeded, the order
of reservations is kept, and without an overrun nothing is ever blocked (the profile is
then exact).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from itertools import accumulate
from math import inf
from typing import ClassVar

from mypy_extensions import mypyc_attr

from bursar.sim.replay.mapping import ReplayConfig, Workload
from bursar.sim.replay.profile import Profile

REBUILD = 4
"""A compression pass that moves at least 1/REBUILD of the reservations rebuilds the
wake-up heap from them instead of pushing each move."""


# Compiled by the optional accelerated build (bursar.broker.accel), it stays a class that
# plug-ins and tests may subclass.
@mypyc_attr(allow_interpreted_subclasses=True)
class Conservative:
    name: ClassVar[str] = "conservative"
    timed: ClassVar[bool] = True
    kills: ClassVar[bool] = False

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        self.size = w.size
        self.dur = w.duration
        self.profile = Profile(w.capacity, w.submit[0] if len(w) else 0.0)
        self.reserved: dict[int, float] = {}  # queued job -> reserved start (submit order)
        self.started: dict[int, float] = {}  # running job -> start
        self.due: list[int] = []
        self.compress = False
        self.wakeups: list[tuple[float, int]] = []  # (reserved start, job); stale ones skipped
        self.blocked: dict[int, float] = {}  # due job the machine had no room for -> slot start

    def submit(self, j: int, now: float) -> None:
        p = self.profile
        s = p.earliest(now, self.size[j], self.dur[j])
        p.take(s, s + self.dur[j], self.size[j])
        if s == now:
            self.due.append(j)
        else:
            self._reserve(j, s)

    def _reserve(self, j: int, s: float) -> None:
        self.reserved[j] = s
        heapq.heappush(self.wakeups, (s, j))

    def finish(self, j: int, now: float) -> None:
        s = self.started.pop(j)
        planned_end = s + self.dur[j]
        if now < planned_end:
            self.profile.give(now, planned_end, self.size[j])
            self.compress = True

    def extend(self, j: int, end: float, now: float) -> None:
        """Running job ``j`` outlived its estimate: the profile holds it to ``end`` (a
        runtime estimate's correction, ``estimate.Estimated``, which then makes its
        duration ``end`` - start). The reservations this may overlap are placed again,
        in their order, each at its earliest slot from ``now``: some move later, as a
        correction's extra time must go somewhere."""
        p = self.profile
        size, dur = self.size, self.dur
        held = self.started[j] + dur[j]
        order = list(self.reserved.items())
        for k, r in order:
            p.give(r, r + dur[k], size[k])
        # The profile held j to its old estimate (now or before): from there on it is new.
        p.take(max(held, now), end, size[j])
        self.reserved = {}
        for k, _ in order:
            at = p.earliest(now, size[k], dur[k])
            p.take(at, at + dur[k], size[k])
            if at <= now:
                self.due.append(k)
            else:
                self.reserved[k] = at
        w = self.wakeups
        w[:] = [(r, k) for k, r in self.reserved.items()]
        heapq.heapify(w)

    def killed(self) -> list[tuple[int, float]]:
        return []

    def wakeup(self) -> float | None:
        w, reserved = self.wakeups, self.reserved
        while w:
            s, j = w[0]
            if reserved.get(j) == s:
                return s
            heapq.heappop(w)
        return None

    def _compress(self, now: float) -> None:
        p = self.profile
        size, dur, reserved = self.size, self.dur, self.reserved
        # A job can move earlier only if some step before its slot has room for it. The
        # prefix maximum of free units, taken once per pass, answers that for most jobs
        # in O(log n); moves during the pass only give back capacity at or after
        # ``boost_from``, by at most ``boost`` units free, which keeps the bound safe.
        # A job whose every window from now on reaches its old slot needs room in the
        # step just before that slot, on the profile as it is: one bisection tells it
        # stays (on HPC2N a quarter of the jobs the bound lets through). Any other job
        # costs one run-table query (O(log r) once the table has caught up with the
        # changes since it was last asked, see Profile), a job that moves one
        # Profile.move, which changes only the ends of the slot that moved. The wake-up
        # heap gets the moves at the end of the pass: pushed, or rebuilt from the
        # reservations when many moved.
        times = list(p.times)
        most = list(accumulate(p.free, max))
        live_times, live_free = p.times, p.free
        boost_from, boost = inf, 0
        moved: list[tuple[float, int]] = []
        for j, old in list(reserved.items()):
            if old == now:
                del reserved[j]
                self.due.append(j)
                continue
            d, s = dur[j], size[j]
            if most[bisect_left(times, old) - 1] < s and (old <= boost_from or boost < s):
                continue
            if now + d >= old and live_free[bisect_left(live_times, old) - 1] < s:
                # A window [t, t + d) with t >= now reaches ``old``, so it needs s free
                # just before it; the step there (the live profile's) has less.
                continue
            new = p.earlier_slot(now, s, d, old)
            if new is None:
                continue
            # Given back: the end of the old slot that the new one does not cover.
            back_free = p.move(old, new, d, s)
            back = max(old, new + d)
            if back < boost_from:
                boost_from = back
            if back_free > boost:
                boost = back_free
            if new == now:
                del reserved[j]
                self.due.append(j)
            else:
                reserved[j] = new
                moved.append((new, j))
        if moved:
            w = self.wakeups
            if REBUILD * len(moved) >= len(reserved):
                # A quarter or more moved: one heapify of the live ones beats a push per
                # move, and it drops the stale entries that wakeup would pop one by one.
                w[:] = [(s, j) for j, s in reserved.items()]
                heapq.heapify(w)
            else:
                push = heapq.heappush
                for entry in moved:
                    push(w, entry)

    def _unblock(self, now: float) -> None:
        """Move each blocked job's slot to start now: it is due again, first in line."""
        p = self.profile
        size, dur = self.size, self.dur
        for j, old in self.blocked.items():
            d, s = dur[j], size[j]
            # Before drop_before: the old slot still starts inside the profile.
            p.move(old, now, d, s)
            self.due.append(j)
        self.blocked = {}

    def schedule(self, now: float, free: int) -> list[int]:
        p = self.profile
        if self.blocked:
            self._unblock(now)
        p.drop_before(now)
        if self.compress and self.reserved:
            self._compress(now)
        elif self.reserved:
            # Reservations that come due with no early end: their slot is now.
            for j in [j for j, s in self.reserved.items() if s <= now]:
                del self.reserved[j]
                self.due.append(j)
        self.compress = False
        due = self.due
        self.due = []
        out = []
        size = self.size
        for j in due:
            # Only a job past its estimate makes the profile promise more than is free.
            if size[j] <= free:
                free -= size[j]
                self.started[j] = now
                out.append(j)
            else:
                self.blocked[j] = now
        return out
