"""An availability profile: free capacity over future time, as a sorted step function.

``times[k]`` is where step k starts; it lasts until ``times[k + 1]`` (the last step lasts
forever) with ``free[k]`` units free. Running jobs and reservations are carved out of it.
Two parallel Python lists with ``bisect`` are the fastest structure here: the searches
walk a few neighbouring steps, and inserting a breakpoint is one C-level memmove.
"""

from __future__ import annotations

import bisect

import numpy as np


class Profile:
    def __init__(self, capacity: int, origin: float = 0.0) -> None:
        self.capacity = capacity
        self.times: list[float] = [origin]
        self.free: list[int] = [capacity]
        # The same step function as numpy arrays for long searches, built when one needs
        # them and dropped at every change (most changes come with no long search).
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def _split(self, t: float) -> int:
        """Index of the step starting exactly at ``t`` (creating it)."""
        times = self.times
        k = bisect.bisect_left(times, t)
        if k < len(times) and times[k] == t:
            return k
        times.insert(k, t)
        self.free.insert(k, self.free[k - 1])
        self._arrays = None
        return k

    def take(self, start: float, end: float, units: int) -> None:
        """Carve ``units`` out of [start, end)."""
        if end <= start or units == 0:
            return
        a = self._split(start)
        b = self._split(end)
        free = self.free
        for k in range(a, b):
            free[k] -= units
        self._arrays = None

    def give(self, start: float, end: float, units: int) -> None:
        """Return ``units`` over [start, end) and merge steps left equal to their neighbour."""
        if end <= start or units == 0:
            return
        a = self._split(start)
        b = self._split(end)
        free, times = self.free, self.times
        for k in range(a, b):
            free[k] += units
        self._arrays = None
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
            self._arrays = None

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
        the job's own reservation covers it. Short spans are walked in Python; long ones
        (a long queue, where most jobs are looked at and few move) run in numpy.
        """
        times, free = self.times, self.free
        k0 = max(0, bisect.bisect_right(times, now) - 1)
        kh = bisect.bisect_left(times, held)
        if kh - k0 > 48:
            return self._earlier_np(now, units, length, k0, kh)
        k = k0
        while True:
            while k < kh and free[k] < units:
                k += 1
            if k >= kh:
                return None
            start = times[k] if times[k] > now else now
            end = start + length
            m = k + 1
            while m < kh and times[m] < end and free[m] >= units:
                m += 1
            if m >= kh or times[m] >= end:
                return start
            k = m

    def _earlier_np(self, now: float, units: int, length: float, k0: int, kh: int) -> float | None:
        if self._arrays is None:
            self._arrays = (np.array(self.times), np.array(self.free))
        T, F = self._arrays
        ok = F[k0:kh] >= units
        if not ok.any():
            return None
        idx = np.arange(k0, kh)
        # bad[i]: the first step at or after i (up to kh) without ``units`` free.
        bad = np.minimum.accumulate(np.where(ok, kh, idx)[::-1])[::-1]
        begin = T[k0:kh].copy()
        begin[0] = max(begin[0], now)
        # The window from step i must stay free up to its end (or up to held, step kh).
        need = np.minimum(np.searchsorted(T, begin + length, "left"), kh)
        good = ok & (bad >= need)
        first = int(np.argmax(good))
        if not good[first]:
            return None
        return float(begin[first])

    def max_free(self, start: float, end: float) -> int:
        """The most units free at any instant of [start, end)."""
        times = self.times
        a = max(0, bisect.bisect_right(times, start) - 1)
        b = bisect.bisect_left(times, end)
        return max(self.free[a : max(b, a + 1)])
