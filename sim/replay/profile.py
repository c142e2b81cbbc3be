"""An availability profile: free capacity over future time, as a sorted step function.

``times[k]`` is where step k starts; it lasts until ``times[k + 1]`` (the last step lasts
forever) with ``free[k]`` units free. Running jobs and reservations are carved out of it.
The steps are two parallel Python lists searched with ``bisect``: inserting a breakpoint
is one C-level memmove, and a take or give rewrites the free units of the steps it spans
with one list comprehension. ``move`` shifts a holding and changes only the parts of the
old and new slot that do not overlap.

Where a job of ``u`` units fits is answered from a *run table* for ``u``: the maximal
stretches of steps with at least ``u`` free, in order, with a prefix maximum of their
lengths (see ``earlier_slot``). A table is kept for every size asked about and updated
in place, not rebuilt: every take and give is logged (its window and the free units it
found), and the next query for a size reads the log since that table was last true,
keeps the changes that crossed its threshold (a step whose free units went from at
least ``u`` to below it, or back), rescans the steps of the span they cover, and splices
the runs it finds into the table. The prefix maximum is redone from the first run that
changed, and only as far as the maximum differs from what it was.

Costs, for n steps, a take or give spanning w of them, a table of r runs and a log of l
changes since that table was last true: ``take``, ``give`` and ``move`` O(log n + w)
(``move`` with w the steps of the non-overlapping parts); ``max_free`` O(log n + w);
``earliest`` and ``earlier_slot`` O(log r) on a true table, plus O(l) to read the log
(each logged change is read once per table) and, if some change crossed, O(s) Python
steps for a span of s steps and up to O(r) at C level for the prefix maximum. A table
is built from scratch (O(n)) the first time its size is asked about, and when it is
n / 8 or more changes behind (reading them would cost about as much; the log itself is
cut by half once it holds 2n + 64 changes). Runs whose
steps ``drop_before`` forgot stay in a table until they are half of it, or until a
query needs the prefix maximum without them.
"""

from __future__ import annotations

import bisect
from itertools import accumulate
from math import inf
from operator import sub

from mypy_extensions import mypyc_attr


class _Runs:
    """The runs of steps with at least ``units`` free, for one size.

    ``starts[i]`` and ``ends[i]`` bound run i (the last may end at ``inf``); the first
    runs may be over already (see _forget_past). ``longest[i]`` is the longest of runs
    1..i (``longest[0]`` is ``-inf``): run 0 is left out because a query clamps its start
    to ``now``. The table is true for the profile as of log entry ``version``, except on
    [``lo``, ``hi``), a span where the profile crossed this threshold since (``lo > hi``:
    nowhere).
    """

    __slots__ = ("ends", "hi", "lo", "longest", "starts", "version")

    def __init__(self, version: int, starts: list[float], ends: list[float]) -> None:
        self.version = version
        self.starts = starts
        self.ends = ends
        self.longest = _longest(starts, ends)
        self.lo = inf
        self.hi = -inf


def _longest(starts: list[float], ends: list[float]) -> list[float]:
    if not starts:
        return []
    return list(accumulate(map(sub, ends[1:], starts[1:]), max, initial=-inf))


# Compiled by the optional accelerated build (bursar.broker.accel), it stays a class that
# plug-ins and tests may subclass.
@mypyc_attr(allow_interpreted_subclasses=True)
class Profile:
    def __init__(self, capacity: int, origin: float = 0.0) -> None:
        self.capacity = capacity
        self.times: list[float] = [origin]
        self.free: list[int] = [capacity]
        self._tables: dict[int, _Runs] = {}
        # The takes and gives from change number ``_base`` on, each with the band of sizes
        # whose threshold it may have crossed, its window, units and shift (0 for a
        # take), and the free units it found (see _trim and _sync).
        self._log: list[tuple[int, int, float, float, int, int, list[int]]] = []
        self._base = 0

    def _split(self, t: float) -> int:
        """Index of the step starting exactly at ``t`` (creating it)."""
        times = self.times
        k = bisect.bisect_left(times, t)
        if k < len(times) and times[k] == t:
            return k
        if k == 0 and self._tables:
            # A step before the origin: the tables know nothing of it.
            self._tables.clear()
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
        if self._tables:
            # Logged for the tables (see above _trim), inline: the hottest path.
            log = self._log
            if len(log) >= 2 * len(self.times) + 64:
                self._trim()
            log.append((min(before) - units + 1, max(before), start, end, units, 0, before))

    def give(self, start: float, end: float, units: int) -> None:
        """Return ``units`` over [start, end) and merge steps left equal to their neighbour."""
        self._give(start, end, units)

    def _give(self, start: float, end: float, units: int) -> int:
        """``give``; the most units free on [start, end) after it."""
        if end <= start or units == 0:
            return self.max_free(start, end) if end > start else 0
        a = self._split(start)
        b = self._split(end)
        free, times = self.free, self.times
        before = free[a:b]
        free[a:b] = [f + units for f in before]
        if self._tables:
            log = self._log
            if len(log) >= 2 * len(self.times) + 64:
                self._trim()
            log.append((min(before) + 1, max(before) + units, start, end, units, units, before))
        # Merge from the right so indices stay valid. A merge joins two steps on the same
        # side of every threshold, so it changes no run.
        for k in (b, a):
            if 0 < k < len(times) and free[k] == free[k - 1]:
                del times[k]
                del free[k]
        return max(before) + units

    def move(self, old: float, new: float, length: float, units: int) -> int:
        """Move ``units`` held over [old, old + length) to [new, new + length): the same
        step function as ``give`` of the one and ``take`` of the other, but only the parts
        that do not overlap change (a reservation that moves earlier mostly moves a
        little, and the overlap spans most of the steps of either). For a move earlier,
        the most units then free on the part given back, [max(old, new + length), old +
        length) (what ``max_free`` would say of it); else 0."""
        if new < old:
            self.take(new, min(new + length, old), units)
            most = self._give(max(old, new + length), old + length, units)
            self._merge_at(old)
            return most
        if new > old:
            self.give(old, min(old + length, new), units)
            self.take(max(new, old + length), new + length, units)
            self._merge_at(old + length)
        return 0

    def _merge_at(self, t: float) -> None:
        """Drop the breakpoint at ``t`` if the steps either side have the same free units
        (where the slot that moved began or ended; ``give`` merges its own ends)."""
        times = self.times
        k = bisect.bisect_left(times, t)
        if 0 < k < len(times) and times[k] == t and self.free[k] == self.free[k - 1]:
            del times[k]
            del self.free[k]

    # A change logged by take or give: a step of f free units (one of ``before``) went
    # to f - units (a take, shift 0) or f + units (a give, shift = units), which crosses
    # the threshold of size u when u - shift <= f < u - shift + units; so only sizes in
    # [min f - units + 1 + shift, max f + shift] can have been crossed.

    def _trim(self) -> None:
        """Cut the log by half: a table further behind is rebuilt (O(n)) rather than
        caught up."""
        half = len(self._log) // 2
        del self._log[:half]
        self._base += half

    def drop_before(self, now: float) -> None:
        """Forget steps that ended before ``now`` (the step containing ``now`` stays)."""
        k = bisect.bisect_right(self.times, now) - 1
        if k > 0:
            del self.times[:k]
            del self.free[:k]

    def earliest(self, now: float, units: int, length: float) -> float:
        """The earliest start >= now with ``units`` free for ``length`` seconds.

        The start of the first run (clamped to ``now``) at least ``length`` long: the
        last step has the whole capacity free, so the last run lasts forever."""
        t = self._table(units)
        starts, ends = t.starts, t.ends
        i = bisect.bisect_right(ends, now)  # the first run not over by ``now``
        s = starts[i]
        if s < now:
            s = now
        if ends[i] - s >= length:
            return s
        if i and t.longest[i] >= length:
            i = self._forget_past(t, i)
        return starts[_first_long(t, i, len(starts), length)]

    def earlier_slot(self, now: float, units: int, length: float, held: float) -> float | None:
        """The earliest start in [now, held) for a job that already holds [held, held +
        length): its own reservation counts as free. None if there is none (the job stays).

        The same answer ``earliest`` would give after ``give`` of the job's own slot, but
        without changing the profile. A window [t, t + length) with t < held is feasible
        exactly when ``units`` are free on [t, min(t + length, held)): from ``held`` on,
        the job's own reservation covers it. So the answer is the start of the first
        *run* (maximal stretch of steps with ``units`` free, the first clamped to start
        at ``now``) that begins before ``held`` and either lasts ``length`` from its start
        or reaches ``held`` (only the last run before ``held`` can). With the table true
        that is a few bisections: in a long queue most jobs are looked at and few move.
        """
        t = self._tables.get(units)
        if t is None or t.version != self._base + len(self._log):
            t = self._table(units)  # a table up to date with the log is true as it is
        starts, ends = t.starts, t.ends
        i = bisect.bisect_right(ends, now)
        if i >= len(starts):
            return None
        s = starts[i]
        if s < now:
            s = now
        if s >= held:
            return None
        if ends[i] - s >= length:
            return s
        if i and t.longest[i] >= length:
            i = self._forget_past(t, i)
        hi = bisect.bisect_left(starts, held, i + 1)
        best = _first_long(t, i, hi, length)
        if ends[hi - 1] >= held and hi - 1 < best:
            best = hi - 1
        if best >= hi:
            return None
        return s if best == i else starts[best]

    def _table(self, units: int) -> _Runs:
        """The run table for ``units``, true for the profile as it is now."""
        t = self._tables.get(units)
        version = self._base + len(self._log)
        n = len(self.times)
        # Reading a logged change costs about what rescanning eight steps does: a table
        # that far behind on a short profile is rebuilt instead.
        if t is None or t.version < self._base or 8 * (version - t.version) >= n:
            t = _Runs(version, *self._scan(0, n, units))
            self._tables[units] = t
            return t
        if t.version != version:
            self._sync(t, units, version)
        if t.lo < t.hi:
            self._rescan(t, units)
        return t

    def _forget_past(self, t: _Runs, i: int) -> int:
        """Drop the runs whose steps drop_before forgot (they spoil the prefix maximum
        for a query past them); the index that run i has then."""
        k = bisect.bisect_right(t.ends, self.times[0])
        if k:
            del t.starts[:k]
            del t.ends[:k]
            t.longest = _longest(t.starts, t.ends)
        return i - k

    def _sync(self, t: _Runs, u: int, version: int) -> None:
        """Widen ``t``'s dirty span by the logged changes since it was last made true that
        crossed its threshold (a change inside the span already is not looked at)."""
        lo, hi = t.lo, t.hi
        for low, high, start, end, units, shift, before in self._log[t.version - self._base :]:
            if (
                low <= u <= high
                and (start < lo or end > hi)
                and any(map(range(u - shift, u - shift + units).__contains__, before))
            ):
                if start < lo:
                    lo = start
                if end > hi:
                    hi = end
        t.lo, t.hi = lo, hi
        t.version = version

    def _scan(self, a: int, b: int, units: int) -> tuple[list[float], list[float]]:
        """The runs within steps [a, b), the last ending at step b (``inf`` past the end)."""
        times, free = self.times, self.free
        starts: list[float] = []
        ends: list[float] = []
        inside = False
        for k in range(a, b):
            if free[k] >= units:
                if not inside:
                    inside = True
                    starts.append(times[k])
            elif inside:
                inside = False
                ends.append(times[k])
        if inside:
            ends.append(times[b] if b < len(times) else inf)
        return starts, ends

    def _rescan(self, t: _Runs, units: int) -> None:
        """Redo ``t``'s runs over its dirty span; outside it no step crossed ``units``,
        so the table is true there and gives the runs that reach into the span."""
        times, free = self.times, self.free
        n = len(times)
        a = max(0, bisect.bisect_right(times, t.lo) - 1)
        b = bisect.bisect_left(times, t.hi, a + 1)
        t.lo, t.hi = inf, -inf
        starts, ends = t.starts, t.ends
        t0 = times[a]
        t1 = times[b] if b < n else inf
        # The runs touching [t0, t1]: the one holding step a - 1 (if any) ends at t0 or
        # later, the one holding step b (if any) starts at t1.
        lo = bisect.bisect_left(ends, t0)
        hi = bisect.bisect_right(starts, t1) if b < n else len(starts)
        new_s, new_e = self._scan(a, b, units)
        if a > 0 and free[a - 1] >= units:
            if new_s and new_s[0] == t0:
                new_s[0] = starts[lo]
            else:
                new_s.insert(0, starts[lo])
                new_e.insert(0, t0)
        if b < n and free[b] >= units:
            if new_e and new_e[-1] == t1:
                new_e[-1] = ends[hi - 1]
            else:
                new_s.append(t1)
                new_e.append(ends[hi - 1])
        longest = t.longest
        old_last = longest[hi - 1] if hi and longest else -inf
        starts[lo:hi] = new_s
        ends[lo:hi] = new_e
        m = len(new_s)
        if not longest or (lo == 0 and (m == 0 or hi == 0)):
            # Run 0 (left out of the prefix maximum) is another run now.
            t.longest = _longest(starts, ends)
            return
        # Runs before ``lo`` are unchanged, and so is the prefix maximum up to lo - 1.
        base = longest[lo - 1] if lo else -inf
        seg: list[float] = []
        most = base
        for k in range(0 if lo else 1, m):  # a few runs: a loop beats accumulate's setup
            d = new_e[k] - new_s[k]
            if d > most:
                most = d
            seg.append(most)
        if not lo:
            seg.insert(0, -inf)
        if not lo and most != old_last:
            t.longest = _longest(starts, ends)
        else:
            longest[lo:hi] = seg
            if most != old_last:
                # The runs after the new ones: the old entry there is the maximum of
                # old_last and their own lengths D, the new one of most and D. Both are
                # the same from the first run whose D passes both; only the stretch
                # before it is redone, the rest of the table is left as it is.
                b = lo + m
                if most > old_last:
                    # Up to the first old entry of at least ``most``, the new one is most.
                    e = bisect.bisect_left(longest, most, b)
                    longest[b:e] = [most] * (e - b)
                else:
                    # Where the old entry is old_last, D is at most old_last, and the new
                    # entry is max(most, D); past there the old entry is D already.
                    e = bisect.bisect_right(longest, old_last, b)
                    seg = list(accumulate(map(sub, ends[b:e], starts[b:e]), max, initial=most))
                    del seg[0]
                    longest[b:e] = seg
        k = bisect.bisect_right(ends, times[0])
        if 2 * k > len(ends):
            # Runs whose steps drop_before forgot: dropped once they are half the table.
            del starts[:k]
            del ends[:k]
            t.longest = _longest(starts, ends)

    def max_free(self, start: float, end: float) -> int:
        """The most units free at any instant of [start, end)."""
        times = self.times
        a = max(0, bisect.bisect_right(times, start) - 1)
        b = bisect.bisect_left(times, end)
        return max(self.free[a : max(b, a + 1)])


def _first_long(t: _Runs, i: int, hi: int, length: float) -> int:
    """The first run after run i and before run ``hi`` at least ``length`` long, else
    ``hi``. The prefix maximum answers unless one of runs 1..i is that long already (a
    ``now`` past the table's first runs, see _forget_past); then the runs are walked."""
    longest = t.longest
    if i == 0 or longest[i] < length:
        return bisect.bisect_left(longest, length, i + 1, hi)
    starts, ends = t.starts, t.ends
    for k in range(i + 1, hi):
        if ends[k] - starts[k] >= length:
            return k
    return hi
