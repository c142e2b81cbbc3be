"""The availability profile answers every query as a brute-force walk over its steps
would, whatever sequence of takes, gives and drops came before (its run tables are kept
up to date in place, so a stale one would show here)."""

from __future__ import annotations

import bisect

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursar.sim.replay.profile import Profile

CAPACITY = 12


class _Steps:
    """The oracle: the same step function, every query answered by trying each start."""

    def __init__(self, capacity: int, origin: float) -> None:
        self.times = [origin]
        self.free = [capacity]

    def _split(self, t: float) -> int:
        k = bisect.bisect_left(self.times, t)
        if k < len(self.times) and self.times[k] == t:
            return k
        self.times.insert(k, t)
        self.free.insert(k, self.free[k - 1])
        return k

    def add(self, start: float, end: float, units: int) -> None:
        a, b = self._split(start), self._split(end)
        for k in range(a, b):
            self.free[k] += units

    def drop_before(self, now: float) -> None:
        k = bisect.bisect_right(self.times, now) - 1
        if k > 0:
            del self.times[:k]
            del self.free[:k]

    def free_at(self, t: float) -> int:
        return self.free[max(0, bisect.bisect_right(self.times, t) - 1)]

    def fits(self, start: float, end: float, units: int) -> bool:
        """``units`` free at every instant of [start, end)."""
        if self.free_at(start) < units:
            return False
        return all(
            f >= units for t, f in zip(self.times, self.free, strict=True) if start < t < end
        )

    def candidates(self, now: float) -> list[float]:
        return [now] + [t for t in self.times if t > now]

    def earliest(self, now: float, units: int, length: float) -> float:
        return next(t for t in self.candidates(now) if self.fits(t, t + length, units))

    def earlier_slot(self, now: float, units: int, length: float, held: float) -> float | None:
        for t in self.candidates(now):
            if t >= held:
                return None
            if self.fits(t, min(t + length, held), units):
                return t
        return None

    def max_free(self, start: float, end: float) -> int:
        return max(
            [self.free_at(start)]
            + [f for t, f in zip(self.times, self.free, strict=True) if start < t < end]
        )


# One operation: (kind, a, b, units, c). Times are whole numbers: the profile compares
# run lengths (end - start >= length) where a walk compares end >= start + length, the
# same on whole numbers.
_op = st.tuples(
    st.sampled_from(["take", "give", "move", "drop", "earliest", "slot", "slot_after", "max"]),
    st.integers(0, 40),
    st.integers(1, 30),
    st.integers(1, CAPACITY),
    st.integers(0, 40),
)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=1, max_size=80))
def test_profile_answers_as_a_walk_over_its_steps(
    ops: list[tuple[str, int, int, int, int]],
) -> None:
    p = Profile(CAPACITY, 0.0)
    ref = _Steps(CAPACITY, 0.0)
    # Steps far ahead make the profile long, so that the tables are brought up to date
    # in place rather than rebuilt (a table a few changes behind a short one is rebuilt).
    for k in range(40):
        p.take(1000.0 + 3 * k, 1001.0 + 3 * k, 1)
        ref.add(1000.0 + 3 * k, 1001.0 + 3 * k, -1)
    now = 0.0
    held: list[tuple[float, float, int]] = []  # what was taken, so gives return it
    for kind, a, b, units, c in ops:
        start = now + a
        if kind == "take":
            p.take(start, start + b, units)
            ref.add(start, start + b, -units)
            held.append((start, start + b, units))
        elif kind == "give" and held:
            s, e, u = held.pop(c % len(held))
            s = max(s, now)  # a slot partly past gives back what is left of it
            if s < e:
                p.give(s, e, u)
                ref.add(s, e, u)
        elif kind == "move" and held:
            s, e, u = held.pop(c % len(held))
            if s >= now:  # as a reservation moves: its slot starts inside the profile
                new = max(now, s + a - 20)
                back_free = p.move(s, new, e - s, u)
                ref.add(s, e, u)
                ref.add(new, new + e - s, -u)
                if new < s:  # it says what is free on the part it gave back
                    assert back_free == ref.max_free(max(s, new + e - s), e)
                s, e = new, new + e - s
            held.append((s, e, u))
        elif kind == "drop":
            now += c % 7
            p.drop_before(now)
            ref.drop_before(now)
        elif kind == "earliest":
            assert p.earliest(now, units, b) == ref.earliest(now, units, b)
        elif kind == "slot":
            assert p.earlier_slot(now, units, b, start) == ref.earlier_slot(now, units, b, start)
        elif kind == "slot_after":
            # A query whose ``now`` is past the profile's first steps (the policy's
            # lower bound on where a job could go).
            later = now + c % 11
            got = p.earlier_slot(later, units, b, later + a)
            assert got == ref.earlier_slot(later, units, b, later + a)
        elif kind == "max":
            assert p.max_free(start, start + b) == ref.max_free(start, start + b)
        assert (p.times, p.free) == (ref.times, ref.free) or _same_function(p, ref, now)


def _same_function(p: Profile, ref: _Steps, now: float) -> bool:
    """The same step function from ``now`` on, though the profile may merge equal
    neighbours the walk keeps (so the step holding ``now`` may start elsewhere)."""
    ts = sorted({now} | {t for t in p.times + ref.times if t > now})
    return all(p.free[max(0, bisect.bisect_right(p.times, t) - 1)] == ref.free_at(t) for t in ts)
