"""An availability profile: free capacity over future time, as a sorted step function.

``times[k]`` is where step k starts; it lasts until ``times[k + 1]`` (the last step lasts
forever) with ``free[k]`` units free. Running jobs and reservations are carved out of it.
Two parallel Python lists with ``bisect`` are the fastest structure here: the searches
walk a few neighbouring steps, and inserting a breakpoint is one C-level memmove.
"""

from __future__ import annotations

import bisect
import math


class Profile:
    def __init__(self, capacity: int, origin: float = 0.0) -> None:
        self.capacity = capacity
        self.times: list[float] = [origin]
        self.free: list[int] = [capacity]
        # Run tables (see earlier_slot) by units, for one ``now``; a change drops the
        # tables whose runs it alters.
        self._runs: dict[int, tuple[float, list[float], list[float], list[float]]] = {}

    def _split(self, t: float) -> int:
        """Index of the step starting exactly at ``t`` (creating it)."""
        times = self.times
        k = bisect.bisect_left(times, t)
        if k < len(times) and times[k] == t:
            return k
        times.insert(k, t)
        self.free.insert(k, self.free[k - 1])
        return k

    def take(self, start: float, end: float, units: int) -> None:
        """Carve ``units`` out of [start, end)."""
        if end <= start or units == 0:
            return
        a = self._split(start)
        b = self._split(end)
        free = self.free
        before = free[a:b]
        free[a:b] = [f - units for f in before]
        # A run table for u changes only where a step's free units cross u: from at
        # least u to below it (u <= f < u + units).
        self._drop_crossed(before, units, 0)

    def _drop_crossed(self, before: list[int], units: int, shift: int) -> None:
        """Drop the run tables for the sizes u that some step crossed, its free units
        going from f (in ``before``) to f - units (a take, ``shift`` 0: u <= f < u +
        units) or to f + units (a give, ``shift`` = units: u - units <= f < u)."""
        runs = self._runs
        if not runs:
            return
        vals = sorted(set(before))
        n = len(vals)
        for u in list(runs):
            i = bisect.bisect_left(vals, u - shift)
            if i < n and vals[i] < u + units - shift:
                del runs[u]

    def give(self, start: float, end: float, units: int) -> None:
        """Return ``units`` over [start, end) and merge steps left equal to their neighbour."""
        if end <= start or units == 0:
            return
        a = self._split(start)
        b = self._split(end)
        free, times = self.free, self.times
        before = free[a:b]
        free[a:b] = [f + units for f in before]
        self._drop_crossed(before, units, units)
        # Merge from the right so indices stay valid.
        for k in (b, a):
            if 0 < k < len(times) and free[k] == free[k - 1]:
                del times[k]
                del free[k]

    def drop_before(self, now: float) -> None:
        """Forget steps that ended before ``now`` (the step containing ``now`` stays)."""
        k = bisect.bisect_right(self.times, now) - 1
        if k > 0:
            del self.times[:k]
            del self.free[:k]

    def earliest(self, now: float, units: int, length: float) -> float:
        """The earliest start >= now with ``units`` free for ``length`` seconds."""
        times, free = self.times, self.free
        n = len(times)
        k = bisect.bisect_right(times, now) - 1
        if k < 0:
            k = 0
        while True:
            while free[k] < units:
                k += 1  # the last step has the whole capacity free: this ends
            start = times[k] if times[k] > now else now
            end = start + length
            m = k + 1
            while m < n and times[m] < end and free[m] >= units:
                m += 1
            if m >= n or times[m] >= end:
                return start
            k = m

    def earlier_slot(self, now: float, units: int, length: float, held: float) -> float | None:
        """The earliest start in [now, held) for a job that already holds [held, held +
        length): its own reservation counts as free. None if there is none (the job stays).

        The same answer ``earliest`` would give after ``give`` of the job's own slot, but
        without changing the profile. A window [t, t + length) with t < held is feasible
        exactly when ``units`` are free on [t, min(t + length, held)): from ``held`` on,
        the job's own reservation covers it. So the answer is the start of the first
        *run* (maximal stretch of steps with ``units`` free) that begins before ``held``
        and either lasts ``length`` from its start or reaches ``held`` (only the last run
        before ``held`` can). The runs for ``units``, with a prefix maximum of their
        lengths, are kept until a change alters them and answer each job in O(log n):
        in a long queue most jobs are looked at and few move. A change drops only the
        tables it alters (where some step's free units cross their threshold).
        """
        _, starts, ends, longest = self._run_table(now, units)
        hi = bisect.bisect_left(starts, held)
        if hi == 0:
            return None
        best = bisect.bisect_left(longest, length)
        if best >= hi:
            best = hi
        if ends[hi - 1] >= held and hi - 1 < best:
            best = hi - 1
        if best >= hi:
            return None
        s = starts[best]
        return s if s > now else now

    def _run_table(
        self, now: float, units: int
    ) -> tuple[float, list[float], list[float], list[float]]:
        cached = self._runs.get(units)
        if cached is not None and cached[0] == now:
            return cached
        times, free = self.times, self.free
        k0 = max(0, bisect.bisect_right(times, now) - 1)
        starts: list[float] = []
        ends: list[float] = []
        longest: list[float] = []
        best = -1.0
        inside = False
        start = 0.0
        for k in range(k0, len(times)):
            if free[k] >= units:
                if not inside:
                    inside = True
                    start = times[k] if times[k] > now else now
            elif inside:
                inside = False
                starts.append(start)
                ends.append(times[k])
                if times[k] - start > best:
                    best = times[k] - start
                longest.append(best)
        if inside:  # the last step lasts forever
            starts.append(start)
            ends.append(math.inf)
            longest.append(math.inf)
        table = (now, starts, ends, longest)
        self._runs[units] = table
        return table

    def max_free(self, start: float, end: float) -> int:
        """The most units free at any instant of [start, end)."""
        times = self.times
        a = max(0, bisect.bisect_right(times, start) - 1)
        b = bisect.bisect_left(times, end)
        return max(self.free[a : max(b, a + 1)])
