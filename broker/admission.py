"""The admission rule: who is considered first, and what a campaign may take.

Order. Pending requests are considered by (class rank, highest first; fair-share usage,
lowest first; arrival sequence). The fair-share factor is Slurm's multifactor one,
``F = 2^(-U/S)``: ``U`` is the campaign's share of the pool's decayed usage and ``S`` its
share of the sustained rates. Usage decays with a half-life ``h``
(``PolicySpec.fairshare_half_life_s``, 7 days by default): a lease of size ``s`` held over
[t1, t2] adds ``integral of w(s) 2^(-(now - t)/h) dt`` with ``w(s) = max_d s_d / R_d``
over the dimensions with a sustained rate ``R_d > 0`` (the lease in multiples of the
campaign's own rate, in its dominant dimension). Since the pool-wide sums are common to
every campaign, ordering by F is ordering by ``u = U_c / R_c``, the campaign's decayed
usage in seconds at its sustained rate, lowest first; a campaign with no sustained rate
has share 0 and comes last. Usage is counted for a lease's whole term when it is granted
or renewed and given back for the part not used when it ends early (as tokens are), so
the order changes only at those events. With the half-life set to None the order is
(class, arrival).

Per-campaign checks, in this order (the first that fails is the reason):

1. burst: held + size <= burst in every dimension, else ``ABOVE_BURST``; a burst at least
   the pool's capacity in a dimension is not checked there (``CampaignState.burst_bound``):
   whatever the pool can give beside what the campaign holds is within it, so such a
   request waits for the pool, ages and keeps its turn among its campaign's requests;
2. bucket: under prepaid enforcement the above-R part of the lease times its whole span
   (duration plus any start delay) must be covered by the bucket level, else
   ``BUCKET_EMPTY``; under grant-instant enforcement the level must only be above 0.

Where power is leased, the campaign's power burst and joules come next
(``power_checks.own``). Pool checks (isolation, then path, then the facility's power cap
with the nodes the plan boots) are ``pool_side.place_check``, on ``isolation.py`` and
``paths.py``.

Head of line. A request that fails for pool reasons does not block the requests behind
it: they may be granted past it (skip-ahead). Once it has waited ``hol_patience_s``
(300 s by default) it becomes *aged*, and the first aged requests hold reservations
(``reservations.py``): a request behind them (lower class, or the same class and
younger) is granted only if it leaves every reservation whole, else it queues with
``HEAD_OF_LINE``; requests that fit entirely inside their own campaign's unmet guarantee
draw on their own reserve and are exempt. Leases have bounded durations and a renewal that
would push a reservation later is refused, so an aged request is served by its
reservation.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bursar.broker import dims, isolation, pool_side, power_checks, queueing, reservation_cut
from bursar.broker.bucket import Bucket, above_rate
from bursar.broker.decisions import Granted
from bursar.broker.policy import Enforcement
from bursar.broker.reasons import Reason

if TYPE_CHECKING:
    from bursar.broker import reservations
    from bursar.broker.engine import Engine
    from bursar.broker.pending import HeadEntry, Pending, PoolKey, PoolScan

POOL_REASONS = frozenset({Reason.POOL_FULL, Reason.GUARANTEE_RESERVED, Reason.HEAD_OF_LINE})


class Side(enum.Enum):
    """Which side of the checks refused: the campaign's own limits (burst, bucket), the
    pool (isolation, paths) or the reservations (head of line)."""

    CAMPAIGN = "campaign"
    POOL = "pool"
    RESERVATIONS = "reservations"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request or a renewal may not be granted now: the reason, the details that go
    into its decision's inputs, and which side refused (a pool refusal holds for every
    request of its pool group until the next grant; the others do not)."""

    reason: Reason
    details: dict[str, Any] = field(default_factory=dict)
    side: Side = Side.CAMPAIGN


def burst_refusal(held: dims.Vec, size: dims.Vec, burst: dims.Vec) -> Refusal | None:
    """Check 1 (burst) for a request, or a renewal (``held``: the campaign's other holdings)."""
    return Refusal(Reason.ABOVE_BURST) if over_burst(held, size, burst) else None


def reservations_refusal(starts: Iterable[float]) -> Refusal:
    """Refused for the reservations (``starts``: when each begins): wait for the first."""
    first = min(starts)
    return Refusal(Reason.HEAD_OF_LINE, {"reserved_from": first}, Side.RESERVATIONS)


def bucket_refusal(short: dict[str, dict[str, float]]) -> Refusal | None:
    """Check 2 (bucket), given ``bucket_short`` over the span checked: a request's whole
    span (with its start delay once its path is known), a renewal's extension."""
    return Refusal(Reason.BUCKET_EMPTY, {"bucket_short": short}) if short else None


def pool_group(key: PoolKey) -> tuple[Any, ...]:
    """The part of a pool key the pool's answer depends on (all but the duration band)."""
    return key[:5]


def retry_after(min_retry_s: float, wait: float) -> float:
    """The retry-after a refusal carries: the wait expected, never under the policy's
    ``min_retry_s`` (a client told to retry at once would spin). The one place the floor
    is applied."""
    return max(min_retry_s, wait)


def usage_weight(size: dims.Vec, sustained: dims.Vec) -> float:
    """A lease's weight in its campaign's fair-share usage: its size in multiples of the
    campaign's sustained rate, in the dominant dimension (0 where no rate is set)."""
    return max((s / r for s, r in zip(size, sustained, strict=True) if r > 0), default=0.0)


def has_share(sustained: dims.Vec) -> bool:
    return any(r > 0 for r in sustained)


def order_key(rank: int, usage: float, seq: int) -> tuple[int, float, int]:
    return (-rank, usage, seq)


def over_burst(held: dims.Vec, size: dims.Vec, burst: dims.Vec) -> bool:
    return not dims.fits(dims.add(held, size), burst)


def token_need(held: dims.Vec, size: dims.Vec, sustained: dims.Vec) -> dims.Vec:
    """Above-R units per dimension that this lease adds (the prepaid rate)."""
    return tuple(
        above_rate(h, s, r) if s > 0 else 0.0 for h, s, r in zip(held, size, sustained, strict=True)
    )


def bucket_short(
    buckets: Mapping[str, Bucket],
    held: dims.Vec,
    rate_need: dims.Vec,
    span: float,
    now: float,
    enforcement: Enforcement,
) -> dict[str, dict[str, float]]:
    """Dimensions whose bucket cannot cover the lease: dim → {level, tokens needed}."""
    short = {}
    for i, d in enumerate(dims.PLACED):
        above = rate_need[i]
        b = buckets.get(d)
        if above <= 0 or b is None or b.unlimited:
            continue
        level = b.level_at(now, held[i], enforcement)
        if enforcement is Enforcement.PREPAID:
            need = above * span
            if level + 1e-9 < need:
                short[d] = {"level": level, "need": need}
        elif level <= 1e-9:
            # Grant-instant: only an empty bucket refuses, however long the lease.
            short[d] = {"level": level, "need": 0.0}
    return short


class AdmissionPass:
    """One admission pass: built from what the pass reads (the engine's queue and its
    dirty heads, ``heap``; the head-of-line ``barrier``; whether capacity was freed, so
    that the pool-blocked requests are walked, ``scan_pool``), it considers them in
    admission order, grants through the engine's fold and records why the others wait.
    Its scratch (the walk, the requests seen, the pool side's answers between grants)
    lives here, for this pass only, never on the engine.

    The checks it asks of each request are the engine's ``_try`` (burst, bucket, pool,
    reservations, bucket over the start delay), answering with a ``Refusal`` whose
    ``side`` says whether the pool's answer holds for the rest of its pool group."""

    __slots__ = ("barrier", "eng", "heap", "memo", "scan_pool")

    def __init__(
        self,
        eng: Engine,
        heap: list[tuple[tuple[int, float, int], str]],
        barrier: tuple[int, int] | None,
        scan_pool: bool,
    ) -> None:
        self.eng = eng
        self.heap = heap
        self.barrier = barrier
        self.scan_pool = scan_pool
        self.memo: dict[Any, Any] = {}
        """The pool side's answers and the campaigns' reach by group, as of the last grant
        (nothing they read changes until the next one)."""

    def run(self) -> None:
        """Walk the heads and the pool-blocked requests in admission order, once."""
        eng = self.eng
        queue = eng.queue
        pending = queue.pending
        heap, barrier, scan_pool = self.heap, self.barrier, self.scan_pool
        memo = self.memo
        prune = self.prunes(eng)
        scan = queue.pool_scan(eng.ledger.pool_bound()) if scan_pool else None
        cursor: HeadEntry | None = None
        seen: set[str] = set()
        while True:
            # Every pool-blocked head is a candidate, behind the reservations or not: those
            # behind may still start if they leave the reservations whole (backfill).
            nxt = (
                scan.peek(seen, eng._cut.profile if eng._cut.fresh else None)
                if scan is not None
                else None
            )
            if heap and (nxt is None or heap[0][0] < nxt[:3]):
                key, rid = heapq.heappop(heap)
                if rid in seen or rid not in pending:
                    continue
                if scan is not None:
                    # The walk is at this head's turn now: what it passed over before it
                    # (left out for its bucket or for the reservations) does not come back
                    # later in this pass, after a grant, out of its turn.
                    entry = (*key, rid)
                    if cursor is None or entry > cursor:
                        cursor = entry
                        scan.pass_to(entry)
            elif nxt is not None and scan is not None:
                scan.advance()
                cursor = nxt
                rid = nxt[3]
                cand = pending[rid]
                cc = eng.campaigns[cand.campaign]
                group = (cc.spec.preemptible, cc.spec.lease_class, cc.unmet)
                reach = memo.get(group)
                if reach is None:
                    reach = memo[group] = self._reach(cand)
                # A request the walk passes over untried is not "seen": if it is also a
                # head whose campaign changed, it is still tried in full from the heap.
                if not dims.fits(cand.size, reach):
                    # More than any path could give its campaign now: still pool-blocked,
                    # for the reason it has (the scan's bound is for the whole pool).
                    if prune:
                        scan.drop(cand.pool_key)  # so is every request of its bucket
                    continue
                if queue.may_try(cand) and isinstance(
                    pool_side.pool_side(eng, cand, cc, memo)[0], Refusal
                ):
                    # No plan the pool could place: still pool-blocked, for the reason it
                    # has, and so is every other request of its bucket until the next grant
                    # (the answer depends on the bucket only).
                    if prune:
                        scan.drop(cand.pool_key)
                    continue
            else:
                break
            p = pending[rid]
            if not queue.may_try(p):
                continue
            # Every request of the holders' class or lower must leave the reservations
            # whole, older ones too (one that waited on its own campaign's limits has no
            # claim of its own on the capacity); a holder only those made before its own.
            behind = barrier is not None and barrier[0] <= -p.lease_class.rank
            profile = reservation_cut.build(eng) if behind else None
            if profile is not None and not isolation.within_own_guarantee(
                p.size, eng.campaigns[p.campaign].unmet
            ):
                admitted = self._backfills(p, profile, memo, scan)
                if admitted and eng.watts.cap is not None:
                    admitted = power_checks.backfills(eng, p, profile, scan if prune else None)
            else:
                admitted = True
            was_pool = p.reason in POOL_REASONS
            if not admitted:
                # Whichever path served it, the reservations say no: skip the full check
                # (the common case in a long queue, where most candidates stay blocked).
                queueing.set_reason(eng, p, Reason.HEAD_OF_LINE)
                if not was_pool:
                    barrier = self._unblocked_queue(p, barrier, heap, seen)
                continue
            seen.add(rid)
            result = eng._try(p, profile, memo)
            if isinstance(result, Granted):
                queueing.unqueue(eng, p)
                head = queue.head(p.campaign, p.lease_class)
                if head is not None:
                    heapq.heappush(heap, (queue.key(head), head.id))
                if barrier is not None and barrier[1] == p.seq:
                    barrier = queue.barrier()
                    if scan_pool and barrier is not None:
                        # The next aged head is the new barrier: try it in this pass too,
                        # or it waits with capacity free until the next release.
                        rid = queue.barrier_head()
                        heapq.heappush(heap, (queue.key(pending[rid]), rid))
                memo = self.memo = {}
                if scan is not None:
                    scan.restart(cursor, eng.ledger.pool_bound())
                continue
            reason = result.reason
            queueing.set_reason(eng, p, reason)
            if not was_pool and reason in POOL_REASONS:
                barrier = self._unblocked_queue(p, barrier, heap, seen)
            if result.side is Side.POOL and scan is not None and prune:
                # The pool's answer holds for every request of its bucket until a grant.
                scan.drop(p.pool_key)
            if reason is Reason.BUCKET_EMPTY:
                queueing.schedule_wake(eng, p)
            if barrier is None and reason in POOL_REASONS and p.id in queue.aged:
                barrier = queue.barrier()
                eng._cut.stale()
        # Heads that became heads during this pass were pushed and looked at already.
        queue.dirty.clear()
        queue.touched.clear()

    @staticmethod
    def prunes(eng: Engine) -> bool:
        """Whether the pass may pass over the rest of a group once one of its requests is
        refused: not for the reference pass (``Engine.exhaustive``), which asks each
        request on its own."""
        return not eng.exhaustive

    def _unblocked_queue(
        self,
        p: Pending,
        barrier: tuple[int, int] | None,
        heap: list[tuple[tuple[int, float, int], str]],
        seen: set[str],
    ) -> tuple[int, int] | None:
        """``p`` waited on its campaign's own limits and, tried in this pass, now waits
        only for the pool: the requests behind it in its queue, held back until now, may
        be tried, so they are, in their turn; and ``p``, aged, takes back its place among
        the reservations from the younger requests that held them meanwhile. Returns the
        head-of-line barrier as it now is.

        Without this a request of the same queue that took the reservation while ``p``
        waited on its bucket could keep ``p`` out for good: ``p`` is refused for that
        reservation, and the holder, behind ``p``, is tried only when capacity is freed
        again, which on an idle pool is never."""
        eng = self.eng
        queue = eng.queue
        pending = queue.pending
        if queue.is_head(p):
            for other in queue.behind(p):
                if other not in seen:
                    heapq.heappush(heap, (queue.key(pending[other]), other))
        if p.id not in queue.aged:
            return barrier
        now_barrier = queue.barrier()
        if now_barrier != barrier:
            # The reservations are cut again, ``p``'s among them, for the rest of the pass.
            eng._cut.stale()
            if p.reason is Reason.HEAD_OF_LINE and now_barrier == (-p.lease_class.rank, p.seq):
                # ``p`` was refused for a reservation it now holds itself: try it again.
                seen.discard(p.id)
                heapq.heappush(heap, (queue.key(p), p.id))
        return now_barrier

    def _backfills(
        self,
        p: Pending,
        profile: reservations.Profile,
        memo: dict[Any, Any],
        scan: PoolScan | None,
    ) -> bool:
        """May ``p`` start on some path now and leave the reservations whole? The answer
        depends on the size and the span only, so between grants the latest end admitted
        from each possible start, looked up once per group, answers every request of the
        group (a holder is asked on its own: its own reservation does not count)."""
        eng = self.eng
        starts = memo.get("starts")
        if starts is None:
            starts = memo["starts"] = self._possible_starts()
        d = p.duration_s
        bucket = p.pool_key
        if bucket is None or p.id in profile.reservations or not self.prunes(eng):
            return any(profile.admits(p.size, t, t + d, p.id) for t in starts)
        seen = memo.get("backfill")
        if seen is None or seen[0] is not profile:
            seen = memo["backfill"] = (profile, {})
        ends: dict[Any, tuple[tuple[float, float], ...]] = seen[1]
        group = pool_group(bucket)  # one size (the demand's) for the whole group
        until = ends.get(group)
        if until is None:
            # For each possible start, the latest end the reservations admit: every
            # request of the group is answered from it, exactly as ``admits`` would.
            until = ends[group] = tuple((t, profile.admits_until(p.size, t)) for t in starts)
        if any(t + d <= end for t, end in until):
            return True
        if scan is not None:
            # Refused from every start: so is anything of its group at least as long. Only
            # from this duration up, not from the cut: requests the walk passes over come
            # back when the reservations change later in the pass, out of their turn.
            scan.refuse_from(bucket, d, profile)
        return False

    def _reach(self, p: Pending) -> dims.Vec:
        """What ``p``'s campaign could get now on any path, per dimension, in aggregate: the
        warm limit, what it may reclaim, and the cold capacity (what ``paths.plan`` checks
        against; the scan's own bound is one for the whole pool)."""
        eng = self.eng
        c = eng.campaigns[p.campaign]
        limit, cold_avail = pool_side.capacity_for(eng, c)
        reach = dims.add(dims.vmax0(limit), cold_avail)
        if not c.spec.preemptible:
            reach = dims.add(reach, eng.ledger.reclaimable_for(c))
        return reach

    def _possible_starts(self) -> tuple[float, ...]:
        """When a lease granted now could start, by the paths open: warm now, reclaim after
        the grace period, cold after the boot latency."""
        eng = self.eng
        now = eng.now
        _, boot_free, cold, _ = eng.pool.totals()
        grace = eng.policy.grace_s if not dims.is_zero(eng.ledger.reclaimable) else None
        boot = (
            eng.pool_spec.boot_latency_s
            if not (dims.is_zero(boot_free) and dims.is_zero(cold))
            else None
        )
        delays = {0.0}
        if grace is not None:
            delays.add(grace)
        if boot is not None:
            delays.add(boot)
            if grace is not None:
                delays.add(max(grace, boot))
        return tuple(sorted(now + d for d in delays))
