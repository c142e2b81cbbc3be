"""Reservations: when capacity returns, and who may start before it does (backfill).

Every firm lease has an expiry, so the broker knows when capacity comes back better than a
batch scheduler, which only has estimates. ``Profile`` is that knowledge as a step
function: the capacity a pool request could take at each future instant, beyond what the
campaigns' unmet guarantees keep aside,

* now: the warm capacity left after the guarantee reserve;
* after the grace period: what active preemptible leases hold (the reclaim path);
* after the boot latency: booting and cold nodes (the cold path);
* at each firm lease's expiry: its size, less what its campaign's unmet guarantee grows
  by when it ends (that part returns to the campaign's own reserve).

The aged requests (their head-of-line patience ran out) at the front, up to
``PolicySpec.reservations`` of them, each get a reservation: the earliest instant at which
their size fits for their whole span (start delay plus duration), taken out of the profile
in order. One reservation is EASY backfill; more is conservative backfill for the first N.

Any other request behind them (lower class, or the same class and younger) may start now
only if it leaves every reservation whole: it ends, by its expiry, before the reservations
it overlaps begin, or it fits in what they leave. What it takes is then taken out of the
profile too, so the next candidate sees it. A renewal is the same question about the
lease's extension (its capacity was counted as returning at its old expiry): one that would
push a reservation later is refused. Requests and renewals within their campaign's own
unmet guarantee are exempt: they draw on their own reserve, which the profile never counts.

The profile is pure arithmetic over vectors the engine hands in (``cut``: the pool as it
is now, ``Capacity``, and the firm leases' ends); it is rebuilt by the engine whenever a
reservation holder is granted, and lazily once per admission pass.
Approximations, each erring towards later reservations rather than broken ones: booting
nodes count from the full boot latency; a preemptible lease that ends on its own before
the grace period is counted at the grace period; the own-guarantee reserve of a holder's
campaign is taken at its value now.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from bursar.broker import dims

if TYPE_CHECKING:
    from bursar.broker.ledger import CampaignState

Step = tuple[float, dims.Vec]
"""An instant and the capacity that returns then."""


@dataclass(frozen=True, slots=True)
class Reservation:
    request_id: str
    at: float
    """When the request's size fits (its lease would be granted then)."""
    until: float
    """The end of its span: ``at`` plus its start delay and duration."""
    size: dims.Vec


@dataclass(slots=True)
class _Window:
    start: float
    end: float
    size: dims.Vec
    reserved: bool
    """A reservation's window (checked against); else a backfilled lease's (only taken)."""
    rank: int = 0
    """A reservation's place in the order they were made."""


class Profile:
    """Future free capacity as a step function, with reservations and backfills taken out.

    ``steps`` must come in time order; they are read lazily, only as far as a question
    needs (a reservation's end, a candidate's expiry).
    """

    __slots__ = ("_avail", "_next", "_steps", "_times", "_windows", "reservations")

    def __init__(self, now: float, base: dims.Vec, steps: Iterator[Step]) -> None:
        self._times: list[float] = [now]
        self._avail: list[dims.Vec] = [base]
        """Capacity returned by each breakpoint, before windows are taken out (non-decreasing
        in every dimension: capacity only returns)."""
        self._steps = steps
        self._next: Step | None = next(steps, None)
        self._windows: list[_Window] = []
        self.reservations: dict[str, Reservation] = {}

    # ------------------------------------------------------------------ reading

    def _extend(self, t: float) -> None:
        """Read steps up to and including ``t``."""
        times, avail = self._times, self._avail
        while self._next is not None and self._next[0] <= t:
            at, gain = self._next
            if at <= times[-1]:
                avail[-1] = dims.add(avail[-1], gain)
            else:
                times.append(at)
                avail.append(dims.add(avail[-1], gain))
            self._next = next(self._steps, None)

    def _raw(self, t: float) -> dims.Vec:
        self._extend(t)
        return self._avail[bisect.bisect_right(self._times, t) - 1]

    def _taken(self, t: float, upto: int | None = None) -> dims.Vec:
        out = dims.ZERO
        for w in self._windows:
            if w.start <= t < w.end and (upto is None or not w.reserved or w.rank < upto):
                out = dims.add(out, w.size)
        return out

    def free_at(self, t: float, upto: int | None = None) -> dims.Vec:
        """What is left at ``t`` once every window is taken out (may be negative where a
        backfilled lease uses capacity no reservation needed); with ``upto``, only the
        reservations made before the ``upto``-th count."""
        return dims.sub(self._raw(t), self._taken(t, upto))

    def _drops(self, start: float, end: float) -> list[float]:
        """The instants in [start, end) at which free capacity can fall: ``start`` and the
        windows' starts (returned capacity only grows, so nothing else lowers it)."""
        return [start, *sorted({w.start for w in self._windows if start < w.start < end})]

    # ------------------------------------------------------------------ reserving

    def reserve(
        self, request_id: str, size: dims.Vec, span: float, own: dims.Vec, earliest: float
    ) -> Reservation:
        """Give ``request_id`` the earliest start at or after ``earliest`` at which ``size``
        fits for ``span`` seconds, with ``own`` (its campaign's unmet guarantee) added to
        what it may use, and take its window out of the profile."""
        t = earliest if self._windows else self._first_fit(size, own, earliest)
        while True:
            bad = self._first_short(size, t, t + span, own)
            if bad is None:
                break
            t = self._after(bad)
            if math.isinf(t):
                break
        r = Reservation(request_id, t, t + span, size)
        self._windows.append(_Window(t, t + span, size, True, len(self.reservations)))
        self.reservations[request_id] = r
        return r

    def earliest(self, size: dims.Vec, span: float, own: dims.Vec, earliest: float) -> float:
        """When ``size`` could start for ``span`` seconds after the reservations, without
        reserving it (a refused request's estimated wait); +inf if never in this profile."""
        t = earliest
        while True:
            bad = self._first_short(size, t, t + span, own)
            if bad is None:
                return t
            t = self._after(bad)
            if math.isinf(t):
                return t

    def _first_fit(self, size: dims.Vec, own: dims.Vec, earliest: float) -> float:
        """With no window taken yet capacity only grows: the first breakpoint at which
        ``size`` fits is the answer (read straight down the steps)."""
        times, avail = self._times, self._avail
        i = max(0, bisect.bisect_right(times, earliest) - 1)
        while True:
            if dims.fits(size, dims.add(avail[i], own)):
                return max(times[i], earliest)
            if i + 1 < len(times):
                i += 1
                continue
            if self._next is None:
                return math.inf
            # Read the next instant's steps (into the last breakpoint if at the same time).
            before = len(times)
            self._extend(self._next[0])
            if len(times) > before:
                i += 1

    def _first_short(self, size: dims.Vec, start: float, end: float, own: dims.Vec) -> float | None:
        """The first instant in [start, end) at which ``size`` does not fit; None if it fits
        throughout."""
        for t in self._drops(start, end):
            if not dims.fits(size, dims.add(self.free_at(t), own)):
                return t
        return None

    def _after(self, t: float) -> float:
        """The next instant after ``t`` at which free capacity grows (a step or a window's
        end); +inf if none is left."""
        self._extend(t)
        i = bisect.bisect_right(self._times, t)
        if i == len(self._times) and self._next is not None:
            self._extend(self._next[0])
        cands = [self._times[i]] if i < len(self._times) else []
        cands.extend(w.end for w in self._windows if w.end > t)
        return min(cands) if cands else math.inf

    # ------------------------------------------------------------------ backfill

    def admits(
        self, size: dims.Vec, start: float, end: float, request_id: str | None = None
    ) -> bool:
        """Would holding ``size`` over [start, end) leave every reservation whole? Only the
        instants inside a reservation's window matter: elsewhere the caller has checked
        capacity now, and nothing is promised later. A holder (``request_id``) only has to
        leave the reservations made before its own whole; its own window does not count."""
        own = self.reservations.get(request_id or "")
        upto = len(self.reservations) if own is None else self._rank(request_id or "")
        for w in self._windows:
            if not w.reserved or w.rank >= upto or w.end <= start or w.start >= end:
                continue
            lo, hi = max(start, w.start), min(end, w.end)
            for t in self._drops(lo, hi):
                if not dims.fits(size, self.free_at(t, upto)):
                    return False
        return True

    def admits_until(self, size: dims.Vec, start: float) -> float:
        """The latest end up to which holding ``size`` from ``start`` leaves every
        reservation whole, for a request that holds none: ``admits(size, start, end)`` is
        true exactly when ``end <= admits_until(size, start)`` (+inf: whatever the end).

        ``admits`` looks at more instants the later the span ends: a reservation's first
        instant in the span once the span reaches into the reservation, and each window's
        start inside it once the span passes that start. So the answer is the earliest
        such threshold among the instants where ``size`` does not fit. One call answers a
        candidate of any duration (a long queue asks the same size over and over)."""
        upto = len(self.reservations)
        windows = self._windows
        until = math.inf
        for w in windows:
            if not w.reserved or w.rank >= upto or w.end <= start:
                continue
            lo = max(start, w.start)
            # (instant, the end past which the span's check includes it)
            checks = [(lo, w.start)]
            checks.extend((x.start, x.start) for x in windows if lo < x.start < w.end)
            for t, threshold in checks:
                if threshold < until and not dims.fits(size, self.free_at(t, upto)):
                    until = threshold
        return until

    def _rank(self, request_id: str) -> int:
        return list(self.reservations).index(request_id)

    def take(self, size: dims.Vec, start: float, end: float) -> None:
        """A lease was granted over [start, end) past the reservations: later candidates
        must see what it holds."""
        if end > start and not dims.is_zero(size):
            self._windows.append(_Window(start, end, size, False))


class HeldOf(Protocol):
    """(guarantee, held now) of a campaign with a guarantee, None for any other."""

    def get(self, name: str, /) -> tuple[dims.Vec, dims.Vec] | None: ...


def firm_steps(
    ends: Iterable[tuple[float, str, dims.Vec]],
    unmet_growth: HeldOf,
) -> Iterator[Step]:
    """Capacity returned by firm leases at their expiry, in time order.

    ``ends`` is (expiry, campaign, size) in time order; ``unmet_growth`` maps each
    campaign with a guarantee to (guarantee, held now), read only for the campaigns whose
    leases the walk reaches: as its leases end, its unmet guarantee grows back and that
    part of the returned capacity goes to its own reserve, not the pool.
    """
    held: dict[str, dims.Vec] = {}
    for at, campaign, size in ends:
        g_h = unmet_growth.get(campaign)
        if g_h is None:
            yield at, size
            continue
        guarantee = g_h[0]
        before = held.get(campaign, g_h[1])
        after = dims.vmax0(dims.sub(before, size))
        held[campaign] = after
        grown = dims.sub(
            dims.vmax0(dims.sub(guarantee, after)), dims.vmax0(dims.sub(guarantee, before))
        )
        yield at, dims.vmax0(dims.sub(size, grown))


@dataclass(frozen=True, slots=True)
class Capacity:
    """What a profile is cut from besides the firm leases' ends: the pool as it is now."""

    now: float
    on_free: dims.Vec
    """Free capacity on powered-on nodes."""
    cold: dims.Vec
    """Free capacity on booting and powered-off nodes."""
    warm_reserve: dims.Vec
    """The guarantee reserve (and headroom) that must stay warm."""
    reclaim: dims.Vec
    """What the reclaim path could take back within a grace period."""
    grace_s: float
    boot_latency_s: float


def cut(
    cap: Capacity,
    ends: Iterator[tuple[float, str, dims.Vec]],
    guaranteed: HeldOf,
    holders: Iterable[tuple[str, dims.Vec, float, dims.Vec]],
) -> Profile:
    """The profile of the pool's future free capacity and the reservations of
    ``holders`` (id, size, duration, its campaign's unmet guarantee), in their order, cut
    from it. ``ends`` are the firm leases' (expiry, campaign, size) in time order, read
    lazily (see ``firm_ends_as_built``)."""
    now = cap.now
    base = dims.vmax0(dims.sub(cap.on_free, cap.warm_reserve))
    # Reserve not yet warm is booting: the cold path cannot hand it out.
    short = dims.vmax0(dims.sub(cap.warm_reserve, cap.on_free))
    cold_avail = dims.vmax0(dims.sub(cap.cold, short))
    early: list[Step] = []
    if not dims.is_zero(cap.reclaim):
        early.append((now + cap.grace_s, cap.reclaim))
    if not dims.is_zero(cold_avail):
        early.append((now + cap.boot_latency_s, cold_avail))
    early.sort(key=lambda st: st[0])
    steps = heapq.merge(early, firm_steps(ends, guaranteed), key=lambda st: st[0])
    profile = Profile(now, base, steps)
    for rid, size, duration, own in holders:
        profile.reserve(rid, size, duration, own, now)
    return profile


def firm_ends_as_built(
    firm_ends: Any, added: set[tuple[Any, ...]]
) -> Iterator[tuple[float, str, dims.Vec]]:
    """(expiry, campaign, size) of the firm leases in time order, read lazily by a
    profile: by key, not by position (leases granted meanwhile are inserted into the list),
    leaving out those added since it was built."""
    last = None
    while True:
        k = 0 if last is None else firm_ends.bisect_right(last)
        if k >= len(firm_ends):
            return
        last = firm_ends[k]
        if last not in added:
            yield last[0], last[3], last[2]


class Current:
    """The engine's reservations as of its current admission pass: the profile (built
    lazily, at most once per pass and again after a holder is granted), whether it is
    still fresh, and what it reads lazily as it was when built (the firm ends added since,
    left out; the guaranteed campaigns' holdings, frozen before they change). A cache:
    every event rebuilds it before reading, and a snapshot keeps none of it."""

    __slots__ = ("added", "fresh", "guarantees", "profile")

    def __init__(self) -> None:
        self.profile: Profile | None = None
        self.fresh = False
        self.added: set[tuple[Any, ...]] = set()
        """Firm lease ends added since the profile was built."""
        self.guarantees: GuaranteeView | None = None
        """What the profile reads of the guaranteed campaigns."""

    def stale(self) -> None:
        """What the profile was cut from changed: the next read builds it again."""
        self.fresh = False

    def holding_changes(self, c: CampaignState) -> None:
        """``c``'s holding is about to change: the profile reads it as it was."""
        if self.guarantees is not None:
            self.guarantees.freeze(c)

    def firm_granted(self, end: tuple[Any, ...]) -> None:
        """A firm lease was granted (its end entry ``end``): the profile, which counts it
        with a window over its span, must not read it as capacity returning."""
        if self.guarantees is not None:
            self.added.add(end)


class GuaranteeView:
    """(guarantee, held) of the firm campaigns with a guarantee as they were when a profile
    was built, read on demand (``get``): a profile reads it only for the campaigns whose
    leases its walk reaches (the lazy steps may be read after a grant: ``freeze`` keeps
    what a campaign held before the engine changes it)."""

    __slots__ = ("_campaigns", "_frozen")

    def __init__(self, campaigns: Mapping[str, CampaignState]) -> None:
        self._campaigns = campaigns
        self._frozen: dict[str, tuple[dims.Vec, dims.Vec]] = {}

    def freeze(self, c: CampaignState) -> None:
        name = c.spec.name
        if name in self._campaigns and name not in self._frozen:
            self._frozen[name] = (c.guarantee, c.held)

    def get(self, name: str) -> tuple[dims.Vec, dims.Vec] | None:
        got = self._frozen.get(name)
        if got is not None:
            return got
        c = self._campaigns.get(name)
        return None if c is None else (c.guarantee, c.held)
