"""FIFO, EASY and conservative backfill under a facility power cap (``Workload.power``).

Power is a second capacity beside the processors: each running job draws its
``extra_w`` above the idle draw of its nodes, and the running jobs together may draw at
most the cap's budget (the cap less the whole machine's idle draw). A job starts only
if both its processors and its watts are free; a job whose own draw exceeds the budget
can never start under the cap: it is refused at its submission (stranded: listed in the
schedule's ``refused``) rather than left to block the queue for ever.

* FIFO: the head starts when both fit; nothing passes it.
* EASY: the head's reservation (the shadow time) is the earliest instant at which the
  running jobs' estimated ends free both enough processors and enough watts; the extra
  processors *and* the extra watts at that instant bound what may backfill past it. A
  job blocked by power only gets its reservation from the running jobs' ends as one
  blocked by processors does, so backfill never delays it, on either dimension.
* Conservative: every reservation is a slot in two availability profiles, processors
  and watts, at the earliest instant both have room for the job's estimated duration.

Without a cap (``Workload.power`` None) the plain policies run: their schedules are
unchanged.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import MutableSequence
from typing import ClassVar

from bursar.sim.replay.mapping import ReplayConfig, Workload
from bursar.sim.replay.policies.conservative import Conservative
from bursar.sim.replay.policies.easy import Easy
from bursar.sim.replay.policies.fifo import Fifo
from bursar.sim.replay.profile import Profile


def _power(w: Workload) -> tuple[MutableSequence[float], float]:
    if w.power is None:
        raise ValueError("a power-capped policy needs the workload's facility power cap")
    return w.power.extra_w, w.power.budget_w


class PowerFifo(Fifo):
    name: ClassVar[str] = "fifo"

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        super().__init__(w, config)
        self.watts, self.budget = _power(w)
        self.wfree = self.budget

    def submit(self, j: int, now: float) -> bool | None:  # type: ignore[override]
        if self.watts[j] > self.budget:
            return False
        self.queue.append(j)
        return None

    def finish(self, j: int, now: float) -> None:
        self.wfree += self.watts[j]

    def schedule(self, now: float, free: int) -> list[int]:
        q, size, watts = self.queue, self.size, self.watts
        out = []
        while q and size[q[0]] <= free and watts[q[0]] <= self.wfree:
            j = q.popleft()
            free -= size[j]
            self.wfree -= watts[j]
            out.append(j)
        return out


class PowerEasy(Easy):
    name: ClassVar[str] = "easy"

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        super().__init__(w, config)
        self.watts, self.budget = _power(w)
        self.wfree = self.budget
        self.wextra = 0.0

    def submit(self, j: int, now: float) -> bool | None:  # type: ignore[override]
        if self.watts[j] > self.budget:
            return False
        super().submit(j, now)
        return None

    def finish(self, j: int, now: float) -> None:
        super().finish(j, now)
        self.wfree += self.watts[j]

    def _start(self, j: int, now: float, out: list[int]) -> None:
        super()._start(j, now, out)
        self.wfree -= self.watts[j]

    def _full(self, now: float, free: int, out: list[int]) -> list[int]:
        q, size, dur, watts = self.queue, self.size, self.dur, self.watts
        k = 0
        while k < len(q) and size[q[k]] <= free and watts[q[k]] <= self.wfree:
            free -= size[q[k]]
            self._start(q[k], now, out)
            k += 1
        if k == len(q):
            self.queue = []
            return out
        head = q[k]
        need, wneed = size[head], watts[head]
        avail, wavail = free, self.wfree
        shadow = now
        for e, r in self.running:
            if avail >= need and wavail >= wneed and e > shadow:
                break
            avail += size[r]
            wavail += watts[r]
            if e > shadow:  # a job past its estimate ends at any moment: now
                shadow = e
        extra, wextra = avail - need, wavail - wneed
        rest = [head]
        for x in range(k + 1, len(q)):
            j = q[x]
            if free <= 0:
                rest.extend(q[x:])
                break
            s, wt = size[j], watts[j]
            if s <= free and wt <= self.wfree:
                ends_late = now + dur[j] > shadow
                if not ends_late or (s <= extra and wt <= wextra):
                    free -= s
                    if ends_late:
                        extra -= s
                        wextra -= wt
                    self._start(j, now, out)
                    continue
            rest.append(j)
        self.queue = rest
        self.shadow, self.extra, self.wextra = shadow, extra, wextra
        return out

    def _new_only(self, now: float, free: int, out: list[int]) -> list[int]:
        size, dur, watts = self.size, self.dur, self.watts
        shadow = self.shadow if self.shadow > now else now
        for j in self.fresh:
            s, wt = size[j], watts[j]
            if s > free or wt > self.wfree:
                continue
            ends_late = now + dur[j] > shadow
            if not ends_late or (s <= self.extra and wt <= self.wextra):
                free -= s
                if ends_late:
                    self.extra -= s
                    self.wextra -= wt
                self.queue.remove(j)
                self._start(j, now, out)
        self.fresh.clear()
        return out


class _Watts:
    """The watts free over time: ``Profile``'s step function (``free[i]`` from ``times[i]``
    on; ``take``, ``give``, ``move`` and ``drop_before`` make the same steps with the same
    arithmetic) in float watts, without its run tables (``_fit`` scans the steps). Apart
    from ``Profile`` because that one counts whole units: compiled (``make accel``), it
    refuses watts."""

    __slots__ = ("free", "times")

    def __init__(self, budget: float, origin: float) -> None:
        self.times: list[float] = [origin]
        self.free: list[float] = [budget]

    def _split(self, t: float) -> int:
        times = self.times
        k = bisect_left(times, t)
        if k < len(times) and times[k] == t:
            return k
        times.insert(k, t)
        self.free.insert(k, self.free[k - 1])
        return k

    def take(self, start: float, end: float, watts: float) -> None:
        if end > start and watts != 0:
            a = self._split(start)
            b = self._split(end)
            self.free[a:b] = [f - watts for f in self.free[a:b]]

    def give(self, start: float, end: float, watts: float) -> None:
        if end > start and watts != 0:
            a = self._split(start)
            b = self._split(end)
            self.free[a:b] = [f + watts for f in self.free[a:b]]
            # From the right, so that the indices stay valid (as Profile.give).
            self._merge(b)
            self._merge(a)

    def move(self, old: float, new: float, length: float, watts: float) -> None:
        """As ``Profile.move``: only the parts that do not overlap change."""
        if new < old:
            self.take(new, min(new + length, old), watts)
            self.give(max(old, new + length), old + length, watts)
            self._merge(self._at(old))
        elif new > old:
            self.give(old, min(old + length, new), watts)
            self.take(max(new, old + length), new + length, watts)
            self._merge(self._at(old + length))

    def _at(self, t: float) -> int:
        k = bisect_left(self.times, t)
        return k if k < len(self.times) and self.times[k] == t else -1

    def _merge(self, k: int) -> None:
        """Drop breakpoint ``k`` if the steps either side have the same watts free."""
        times, free = self.times, self.free
        if 0 < k < len(times) and free[k] == free[k - 1]:
            del times[k]
            del free[k]

    def drop_before(self, now: float) -> None:
        k = bisect_right(self.times, now) - 1
        if k > 0:
            del self.times[:k]
            del self.free[:k]


def _fit(p: Profile | _Watts, t: float, units: float, length: float) -> float:
    """The earliest start >= ``t`` with ``units`` free on ``p`` for ``length`` seconds, by
    a scan of its steps (the watts profile has too many distinct sizes for the profile's
    per-size run tables; the last step has the whole capacity free)."""
    times, free = p.times, p.free
    n = len(times)
    k = max(bisect_right(times, t) - 1, 0)
    start = t if t > times[k] else times[k]
    while True:
        while free[k] < units:
            k += 1
            start = times[k]
        end = start + length
        m = k + 1
        while m < n and times[m] < end and free[m] >= units:
            m += 1
        if m >= n or times[m] >= end:
            return start
        k = m
        start = times[m]


class PowerConservative(Conservative):
    name: ClassVar[str] = "conservative"

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        super().__init__(w, config)
        self.watts, self.budget = _power(w)
        self.wprofile = _Watts(self.budget, w.submit[0] if len(w) else 0.0)
        self.wfree = self.budget

    def _slot(self, now: float, j: int) -> float:
        """The earliest start at which both profiles have room for ``j``."""
        s, e, d = self.size[j], self.watts[j], self.dur[j]
        t = now
        while True:
            a = _fit(self.profile, t, s, d)
            b = _fit(self.wprofile, a, e, d)
            if b == a:
                return a
            t = b

    def _take(self, at: float, j: int) -> None:
        d = self.dur[j]
        self.profile.take(at, at + d, self.size[j])
        self.wprofile.take(at, at + d, self.watts[j])

    def _give(self, at: float, j: int) -> None:
        d = self.dur[j]
        self.profile.give(at, at + d, self.size[j])
        self.wprofile.give(at, at + d, self.watts[j])

    def submit(self, j: int, now: float) -> bool | None:  # type: ignore[override]
        if self.watts[j] > self.budget:
            return False
        s = self._slot(now, j)
        self._take(s, j)
        if s == now:
            self.due.append(j)
        else:
            self._reserve(j, s)
        return None

    def finish(self, j: int, now: float) -> None:
        s = self.started.pop(j)
        self.wfree += self.watts[j]
        planned_end = s + self.dur[j]
        if now < planned_end:
            self.profile.give(now, planned_end, self.size[j])
            self.wprofile.give(now, planned_end, self.watts[j])
            self.compress = True

    def extend(self, j: int, end: float, now: float) -> None:
        raise ValueError("conservative backfill under a power cap takes the requested time only")

    def _compress(self, now: float) -> None:
        # Each reservation in order gives its slot back and takes the earliest joint one
        # again, never later (its old slot is still free for it).
        reserved = self.reserved
        for j, old in list(reserved.items()):
            self._give(old, j)
            new = self._slot(now, j)
            self._take(new, j)
            if new == now:
                del reserved[j]
                self.due.append(j)
            else:
                reserved[j] = new
        self.wakeups[:] = [(s, j) for j, s in reserved.items()]
        heapq.heapify(self.wakeups)

    def _unblock(self, now: float) -> None:
        for j, old in self.blocked.items():
            d = self.dur[j]
            self.profile.move(old, now, d, self.size[j])
            self.wprofile.move(old, now, d, self.watts[j])
            self.due.append(j)
        self.blocked = {}

    def schedule(self, now: float, free: int) -> list[int]:
        if self.blocked:
            self._unblock(now)
        self.profile.drop_before(now)
        self.wprofile.drop_before(now)
        if self.compress and self.reserved:
            self._compress(now)
        elif self.reserved:
            for j in [j for j, s in self.reserved.items() if s <= now]:
                del self.reserved[j]
                self.due.append(j)
        self.compress = False
        due = self.due
        self.due = []
        out = []
        size, watts = self.size, self.watts
        for j in due:
            # Only a job past its estimate makes a profile promise more than is free.
            if size[j] <= free and watts[j] <= self.wfree:
                free -= size[j]
                self.wfree -= watts[j]
                self.started[j] = now
                out.append(j)
            else:
                self.blocked[j] = now
        return out


POWER_POLICIES = {"fifo": PowerFifo, "easy": PowerEasy, "conservative": PowerConservative}
"""The policies that keep a facility power cap."""


def power_policy(name: str) -> type:
    """The power-capped class of policy ``name``; ValueError naming the allowed ones."""
    cls = POWER_POLICIES.get(name)
    if cls is None:
        raise ValueError(
            f"a power cap is kept by {', '.join(POWER_POLICIES)}; {name!r} cannot take one"
        )
    return cls
