"""The queue: requests waiting for a grant, and the indexes the admission pass reads.

Requests wait first come, first served within a (campaign, class) queue while its head
waits on the campaign's own limits (burst, bucket): the requests behind it are not tried.
A head blocked only by the pool does not hold its campaign's later requests back: they
are tried like any other (a pool-blocked request may be passed, within its campaign as
across campaigns; the reservations keep that from starving it). Beside the queues
``Queues`` keeps, incrementally:

* the requests blocked for a pool reason, by pool key (``PoolKey``: what the pool's answer
  depends on, plus the request's class and duration band), each key's requests in admission order
  and by duration, with its size in the primary dimension; a pass walks them in admission
  order key by key (``PoolScan``), and which of them lie within their campaign's
  unmet guarantee (exempt from the reservations);
* the aged requests (their head-of-line patience ran out) and, by (-class rank, arrival),
  those still blocked for a pool reason: the top is the head-of-line barrier;
* the wake-up set per bucket-blocked campaign, and what the next pass must look at (the
  campaigns whose holding, bucket or envelope changed; whether capacity was freed).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedList

from bursar.broker import admission, dims, isolation
from bursar.broker.admission import pool_group
from bursar.broker.envelope import LeaseClass
from bursar.broker.reasons import Reason
from bursar.broker.shape import Demand
from bursar.broker.timers import TimerKind

if TYPE_CHECKING:
    from bursar.broker.ledger import CampaignState
    from bursar.broker.policy import PolicySpec
    from bursar.broker.reservations import Profile

HeadEntry = tuple[int, float, int, str]
"""A pool-blocked head's place: its admission order key, then its id."""

PoolKey = tuple[bool, LeaseClass, dims.Vec, object, LeaseClass, int]


class _Unordered(tuple):  # type: ignore[type-arg]
    """A pool key as the walk's heap holds it, beside its entry: equal to the key, and
    never less than another. Two heap items tie on their entry only where one of them is
    stale (a request whose key changed is pushed again under its new key; the old item is
    dropped when it comes up), and which of the two comes first changes nothing. Keys of
    different shapes cannot be ordered (a demand beside a size), so they must not be."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return False


"""What the pool side of an admission try depends on besides the pool (see
``pool_side.place_check``): the campaign's preemptibility, class and unmet guarantee, and
the request's demand (its ``Demand.ident``, or its size; with the watts it declared, if
any: the power checks read them); then the request's own class
(which reservations bind it) and its duration's band (``_band``: how long it would hold
what it gets). Every request of the first five gets the same answer from the pool; the
reservations' answer only gets harder with the duration."""


@dataclass(slots=True)
class Pending:
    id: str
    campaign: str
    size: dims.Vec
    duration_s: float
    lease_class: LeaseClass
    blocking: bool
    seq: int
    queued_at: float
    labels: dict[str, str]
    key: str = ""
    """The client's idempotency key ("" for none)."""
    watts: float | None = None
    """The watts the request declared (``size["power"]``, its power limit); None: the
    default for its size (``power_budget.py``)."""
    demand: Demand | None = None
    """The request's shape resolved against the pool (None: any split of ``size``)."""
    reason: Reason | None = None
    counted: bool = False
    """Its size is in the ledger's queued demand (it waits for the pool, not for its
    campaign's own envelope)."""
    aging: bool = False
    """An age timer (head-of-line patience) is set for it."""
    head_entry: HeadEntry | None = None
    """Its entry in the pool-blocked index while it is blocked for a pool reason; None
    otherwise."""
    pool_key: PoolKey | None = None
    """The pool-blocked key it is in (with ``head_entry``)."""


class Queues:
    """The waiting requests of every campaign, and the indexes kept over them."""

    __slots__ = (
        "_aged_heap",
        "_by_campaign",
        "_by_key",
        "_campaigns",
        "_durations",
        "_indexed",
        "_limited",
        "_patience_s",
        "_power_unmet",
        "_primary",
        "_push_timer",
        "_queues",
        "_sizes",
        "aged",
        "dirty",
        "guarantee_heads",
        "pending",
        "pool_dirty",
        "touched",
        "wake_at",
    )

    def __init__(
        self,
        campaigns: Mapping[str, CampaignState],
        primary: int,
        patience_s: float,
        push_timer: Callable[[float, TimerKind, str], None],
        power_unmet: Callable[[str], float],
    ) -> None:
        self._campaigns = campaigns
        self._power_unmet = power_unmet
        self._primary = primary
        self._patience_s = patience_s
        self._push_timer = push_timer
        self.pending: dict[str, Pending] = {}
        """Every waiting request by id."""
        self._queues: dict[tuple[str, LeaseClass], deque[str]] = {}
        self._by_campaign: dict[str, dict[LeaseClass, None]] = {}
        """The classes each campaign has a queue in, in the order they were opened."""
        self.aged: set[str] = set()
        self._aged_heap: SortedList = SortedList()
        """(-class rank, arrival, id) of the aged requests blocked for a pool reason, with
        stale entries (gone, or blocked for their own reasons now) dropped when met."""
        self._by_key: dict[PoolKey, SortedList] = {}
        """The pool-blocked requests by key, each in admission order."""
        self._sizes = KeySizes()
        """Each key's size in the primary dimension (its demand's), and the keys by size."""
        self._durations: dict[PoolKey, SortedList] = {}
        """Each key's requests by duration: (duration, arrival, id)."""
        """The durations of each key's requests."""
        self.guarantee_heads: dict[str, None] = {}
        self._indexed: dict[str, dict[str, None]] = {}
        self._limited: dict[tuple[str, LeaseClass], set[str]] = {}
        """Per queue, the requests waiting on their campaign's own limits (burst, bucket):
        in no pool index, so only a change of their campaign looks at them again."""
        """Each campaign's requests in the pool-blocked index."""
        self.wake_at: dict[str, float] = {}
        """When each bucket-blocked campaign's queue is looked at again (the earliest asked)."""
        self.dirty: set[str] = set()
        """Campaigns whose queue heads the next admission pass must try."""
        self.pool_dirty = False
        """Capacity was freed: the next pass scans the pool-blocked heads."""
        self.touched: set[PoolKey] = set()
        """The keys whose requests changed (added, removed, moved) since the pass's
        scan last looked at every key (``PoolScan.restart`` looks at these only)."""

    def __getstate__(self) -> tuple[None, dict[str, object]]:
        # ``touched`` is the current pass's scratch (empty between events): not state.
        return None, {k: getattr(self, k) for k in self.__slots__ if k != "touched"}

    def __setstate__(self, state: tuple[None, dict[str, object]]) -> None:
        self.touched = set()
        for k, v in state[1].items():
            setattr(self, k, v)
        if isinstance(self._sizes, dict):
            # Written before the keys were kept in size order: put them in order now.
            sizes = KeySizes()
            for key, size in self._sizes.items():
                sizes.add(key, size)
            self._sizes = sizes

    def retune(self, policy: PolicySpec) -> None:
        """A new policy is in force: requests that start waiting on the pool from now on
        age after its patience (age timers already set keep their times)."""
        self._patience_s = policy.hol_patience_s

    # ------------------------------------------------------------------ reading

    def key(self, p: Pending) -> tuple[int, float, int]:
        """``p``'s place in admission order (class, fair-share usage, arrival)."""
        return admission.order_key(p.lease_class.rank, self._campaigns[p.campaign].fair, p.seq)

    def head(self, campaign: str, lease_class: LeaseClass) -> Pending | None:
        q = self._queues.get((campaign, lease_class))
        return self.pending[q[0]] if q else None

    def is_head(self, p: Pending) -> bool:
        return self._queues[(p.campaign, p.lease_class)][0] == p.id

    def may_try(self, p: Pending) -> bool:
        """``p`` heads its queue, or the head waits only for the pool (see the module doc)."""
        head = self.pending[self._queues[(p.campaign, p.lease_class)][0]]
        return head is p or head.reason in admission.POOL_REASONS

    def behind(self, p: Pending) -> list[str]:
        """The ids of the requests queued behind ``p`` in its (campaign, class) queue."""
        return [rid for rid in self._queues[(p.campaign, p.lease_class)] if rid != p.id]

    def holds_back(self, campaign: str, lease_class: LeaseClass) -> Pending | None:
        """The head a new request of this queue must wait behind (one blocked by its
        campaign's own limits), or None when it may be tried itself."""
        head = self.head(campaign, lease_class)
        if head is None or head.reason in admission.POOL_REASONS:
            return None
        return head

    def ordered(self) -> list[Pending]:
        """Every waiting request in admission order."""
        return sorted(self.pending.values(), key=self.key)

    def ageing(self, request_id: str) -> bool:
        """Still waiting, and its patience has not run out yet."""
        return request_id in self.pending and request_id not in self.aged

    # ------------------------------------------------------------------ changing

    def add(self, p: Pending) -> None:
        """Queue ``p`` at the back of its (campaign, class) queue."""
        self.pending[p.id] = p
        self._queues.setdefault((p.campaign, p.lease_class), deque()).append(p.id)
        self._limited.setdefault((p.campaign, p.lease_class), set())
        self._by_campaign.setdefault(p.campaign, {})[p.lease_class] = None

    def remove(self, p: Pending) -> None:
        """Take ``p`` out of its queue (granted or cancelled); the next one heads it."""
        del self.pending[p.id]
        qk = (p.campaign, p.lease_class)
        q = self._queues[qk]
        if q[0] == p.id:
            q.popleft()
        else:
            q.remove(p.id)
        self._index_head(p, False)
        self._limited[qk].discard(p.id)
        if not q:
            del self._queues[qk]
            del self._limited[qk]
            del self._by_campaign[p.campaign][p.lease_class]
            if not self._by_campaign[p.campaign]:
                del self._by_campaign[p.campaign]
        self.aged.discard(p.id)
        # The new head has not been looked at as a head yet.
        self.dirty.add(p.campaign)

    def set_reason(self, p: Pending, reason: Reason, now: float) -> None:
        """Record why ``p`` waits, keeping the pool-blocked head index and aged heap current."""
        was_pool = p.reason in admission.POOL_REASONS
        p.reason = reason
        pool = reason in admission.POOL_REASONS
        if pool and not p.aging:
            # Patience counts from arrival, whatever the request first waited for.
            p.aging = True
            self._push_timer(max(now, p.queued_at + self._patience_s), TimerKind.AGE, p.id)
        if pool != (p.head_entry is not None):
            self._index_head(p, pool)
        limited = self._limited[(p.campaign, p.lease_class)]
        if pool:
            limited.discard(p.id)
        else:
            limited.add(p.id)
        if pool and not was_pool and p.id in self.aged:
            # Once per spell of pool-blocked waiting: the entry stays valid while it lasts.
            self._aged_heap.add((-p.lease_class.rank, p.seq, p.id))

    def rekey(self, campaign: str) -> None:
        """A campaign's holding or usage changed: move its indexed requests to their new
        place in the order, and refresh which lie within its unmet guarantee."""
        ids = self._indexed.get(campaign)
        if not ids:
            return
        c = self._campaigns[campaign]
        pending = self.pending
        first = pending[next(iter(ids))]
        entry, key = first.head_entry, first.pool_key
        if entry is None or key is None:
            return
        if key[:3] != (c.spec.preemptible, c.spec.lease_class, self.unmet_key(c)):
            for rid in list(ids):
                self._index_head(pending[rid], True)
        elif entry[1] != c.fair:
            # Only its place in the order moved (the fair-share usage of every grant): each
            # entry moves within its key.
            fair = c.fair
            keys = self._by_key
            for rid in ids:
                p = pending[rid]
                old = p.head_entry
                assert old is not None and p.pool_key is not None
                new = (old[0], fair, old[2], old[3])
                self.touched.add(p.pool_key)
                entries = keys[p.pool_key]
                entries.remove(old)
                entries.add(new)
                p.head_entry = new
        elif not dims.is_zero(c.guarantee):
            for rid in ids:
                if isolation.within_own_guarantee(self.pending[rid].size, c.unmet):
                    self.guarantee_heads[rid] = None
                else:
                    self.guarantee_heads.pop(rid, None)

    def unmet_key(self, c: CampaignState) -> object:
        """The unmet guarantee part of a pool key: the campaign's unmet guarantee, with its
        own unmet power guarantee where it has one (under a power cap the pool's answer
        depends on it: those watts are kept for it alone)."""
        watts = self._power_unmet(c.spec.name)
        return c.unmet if watts == 0.0 else (c.unmet, watts)

    def age(self, request_id: str) -> None:
        """``request_id``'s patience ran out: it may become the head-of-line barrier."""
        self.aged.add(request_id)
        p = self.pending[request_id]
        if p.reason in admission.POOL_REASONS:
            self._aged_heap.add((-p.lease_class.rank, p.seq, p.id))

    def wake_by(self, campaign: str, at: float) -> None:
        """Look at ``campaign``'s queue again at ``at``, unless an earlier look is set."""
        if at < self.wake_at.get(campaign, math.inf):
            self.wake_at[campaign] = at
            self._push_timer(at, TimerKind.WAKE, campaign)

    def wake(self, campaign: str) -> None:
        """The wake-up came: the next pass tries the campaign's heads."""
        del self.wake_at[campaign]
        self.dirty.add(campaign)

    def _index_head(self, p: Pending, on: bool) -> None:
        if p.head_entry is not None:
            assert p.pool_key is not None
            self.touched.add(p.pool_key)
            entries = self._by_key[p.pool_key]
            entries.remove(p.head_entry)
            self._durations[p.pool_key].remove((p.duration_s, p.seq, p.id))
            if not entries:
                del self._by_key[p.pool_key]
                del self._durations[p.pool_key]
                self._sizes.remove(p.pool_key)
            p.head_entry = None
            p.pool_key = None
            ids = self._indexed[p.campaign]
            del ids[p.id]
            if not ids:
                del self._indexed[p.campaign]
        self.guarantee_heads.pop(p.id, None)
        if on:
            c = self._campaigns[p.campaign]
            p.head_entry = (*self.key(p), p.id)
            p.pool_key = (
                c.spec.preemptible,
                c.spec.lease_class,
                self.unmet_key(c),
                (p.size if p.demand is None else p.demand.ident)
                if p.watts is None
                else (p.size if p.demand is None else p.demand.ident, p.watts),
                p.lease_class,
                _band(p.duration_s),
            )
            self.touched.add(p.pool_key)
            entries = self._by_key.get(p.pool_key)
            if entries is None:
                entries = self._by_key[p.pool_key] = SortedList()
                self._durations[p.pool_key] = SortedList()
                self._sizes.add(p.pool_key, p.size[self._primary])
            entries.add(p.head_entry)
            self._durations[p.pool_key].add((p.duration_s, p.seq, p.id))
            self._indexed.setdefault(p.campaign, {})[p.id] = None
            if isolation.within_own_guarantee(p.size, self._campaigns[p.campaign].unmet):
                self.guarantee_heads[p.id] = None

    # ------------------------------------------------------------------ the pass

    def barrier(self) -> tuple[int, int] | None:
        """(-rank, seq) of the head-of-line request: the highest-class, oldest aged request
        still blocked for a pool reason; None if there is none."""
        heap = self._aged_heap
        while heap:
            first = heap[0]
            if self._aged_live(first[2]):
                return first[0], first[1]
            # Gone, granted, or blocked for its own reasons now; re-pushed if that changes.
            del heap[0]
        return None

    def _aged_live(self, rid: str) -> bool:
        p = self.pending.get(rid)
        return p is not None and rid in self.aged and p.reason in admission.POOL_REASONS

    def aged_front(self, n: int) -> list[Pending]:
        """The first ``n`` aged requests still blocked for a pool reason, by (-class rank,
        arrival), skipping preemptible campaigns' (they yield to everyone and hold no
        reservation)."""
        if self.barrier() is None:
            return []
        out: list[Pending] = []
        seen: set[str] = set()
        stale = []
        for entry in self._aged_heap:
            rid = entry[2]
            if rid in seen or not self._aged_live(rid):
                stale.append(entry)
                continue
            seen.add(rid)
            p = self.pending[rid]
            if self._campaigns[p.campaign].spec.preemptible:
                continue
            out.append(p)
            if len(out) == n:
                break
        for entry in stale:
            self._aged_heap.remove(entry)
        return out

    def barrier_head(self) -> str:
        """The id of the head-of-line request (call right after ``barrier`` found one)."""
        return self._aged_heap[0][2]

    def barrier_before(self, p: Pending) -> bool:
        """True when the head-of-line request's reservation binds ``p`` (same or higher
        class)."""
        if not self._aged_heap:
            return False
        barrier = self.barrier()
        return barrier is not None and barrier[0] <= -p.lease_class.rank

    def dirty_heads(self) -> list[tuple[tuple[int, float, int], str]]:
        """(order key, id) of the heads of every queue of the dirty campaigns, and, behind a
        head that waits only for the pool, the requests waiting on their campaign's own limits."""
        out = []
        for name in sorted(self.dirty):
            for lc in self._by_campaign.get(name, ()):
                rid = self._queues[(name, lc)][0]
                head = self.pending[rid]
                out.append((self.key(head), rid))
                if head.reason in admission.POOL_REASONS:
                    # Behind a head that waits only for the pool every request may be
                    # tried (``may_try``); those waiting on their campaign's own limits
                    # are in no pool index, so they are looked at here, when it changes.
                    for other in self._limited[(name, lc)]:
                        out.append((self.key(self.pending[other]), other))
        return out

    def pool_scan(self, bound: float) -> PoolScan:
        """The pool-blocked requests no bigger than ``bound`` in the primary dimension, in
        admission order, key by key (see ``PoolScan``)."""
        return PoolScan(
            self._by_key, self._durations, self._sizes, self.pending, bound, self.touched
        )


class KeySizes:
    """Each pool key's size in the primary dimension, and the keys in size order: a pass
    reads only the keys no bigger than what the pool could give (its bound), however
    many larger ones wait."""

    __slots__ = ("_key", "_next", "_no", "_order", "of")

    def __init__(self) -> None:
        self.of: dict[PoolKey, float] = {}
        """Each key's size (read directly where every look-up counts)."""
        self._no: dict[PoolKey, int] = {}
        """A number per key, so that the order never compares keys."""
        self._key: dict[int, PoolKey] = {}
        self._order: SortedList = SortedList()
        """(size, number) of every key."""
        self._next = 0

    def add(self, key: PoolKey, size: float) -> None:
        self.of[key] = size
        self._no[key] = no = self._next
        self._next += 1
        self._key[no] = key
        self._order.add((size, no))

    def remove(self, key: PoolKey) -> None:
        size = self.of.pop(key)
        no = self._no.pop(key)
        del self._key[no]
        self._order.remove((size, no))

    def upto(self, bound: float) -> Iterator[PoolKey]:
        """The keys of size at most ``bound``, smallest first."""
        key = self._key
        for _, no in self._order.irange(maximum=(bound, math.inf)):
            yield key[no]

    def between(self, low: float, high: float) -> Iterator[PoolKey]:
        """The keys of size above ``low`` and at most ``high``."""
        key = self._key
        for _, no in self._order.irange((low, math.inf), (high, math.inf), (False, True)):
            yield key[no]


def _band(duration: float) -> int:
    """A duration's band: half a binary order of magnitude (two sub-bands of equal width
    within each octave), so that a refusal of one duration leaves out most longer
    requests of its group without a look at each. Narrower bands make more keys for a
    pass to walk past; wider ones more requests to look through in the band a refusal
    cuts (half an octave measured 1.13-1.23x a quarter with 10,000 waiting requests, in
    benchmarks/bench_engine.py)."""
    m, e = math.frexp(duration)
    return e * 2 + (m >= 0.75) if duration > 0 else -(1 << 30)


class PoolScan:
    """An admission pass's walk over the pool-blocked requests in admission order.

    The requests come from their keys (``PoolKey``), merged by admission order. Once the
    pool has said no to one request of a key, it says no to every other one until the
    next grant: ``drop`` leaves the rest of that key out of the walk, so that a pass over
    a long queue looks at a few requests per key rather than every one. Once the
    reservations refused a request of some duration, they refuse every longer one of its
    group while they stay as they are: after ``refuse_from``, the walk goes from a key's
    request straight to its next one that is shorter than that (by the key's duration
    index), and leaves out a key none of whose requests is; all of it comes back when
    the reservations change. ``restart`` (after a grant) brings every key back from a
    cursor on: it walks as a fresh scan from the cursor would, but re-reads only the
    keys that left the walk or were moved past since, and those whose requests changed
    (``Queues.touched``); the others' places are still right. O(B log B) for the first
    fill over B keys, O(k log B) per restart for k such keys, O(log n) per request
    looked at, and a pass over a key's shorter requests per jump.
    """

    __slots__ = (
        "_at",
        "_bound",
        "_by_key",
        "_cursor",
        "_dropped",
        "_durations",
        "_heap",
        "_index",
        "_moved",
        "_pending",
        "_refused",
        "_refused_by",
        "_sizes",
        "_skipped",
        "_touched",
    )

    def __init__(
        self,
        keys: dict[PoolKey, SortedList],
        durations: dict[PoolKey, SortedList],
        sizes: KeySizes,
        pending: Mapping[str, Pending],
        bound: float,
        touched: set[PoolKey],
    ) -> None:
        self._by_key = keys
        self._durations = durations
        self._index = sizes
        self._sizes = sizes.of
        self._pending = pending
        self._bound = bound
        self._touched = touched
        """The queue's record of changed keys (``Queues.touched``), emptied at each fill
        and restart."""
        self._heap: list[tuple[HeadEntry, PoolKey]] = []
        """(entry, key) for the keys in the walk, with stale pairs (whose key has
        another place in ``_at`` now, or none) dropped when met."""
        self._at: dict[PoolKey, HeadEntry] = {}
        """Each key in the walk: its place (the entry the heap holds for it)."""
        self._moved: set[PoolKey] = set()
        """Buckets that left the walk or jumped ahead since the last fill or restart."""
        self._cursor: HeadEntry | None = None
        self._dropped: set[tuple[Any, ...]] = set()
        self._refused: dict[tuple[Any, ...], tuple[float, set[PoolKey]]] = {}
        self._refused_by: object = None
        """The reservations (profile) the refusals came from."""
        self._skipped = False
        """Some request was passed over for a refusal (it comes back with the next
        reservations)."""
        self._fill()

    def restart(self, cursor: HeadEntry | None, bound: float) -> None:
        """Every key again (those small enough for ``bound``), from after ``cursor``:
        the walk a fresh fill from ``cursor`` would make. A key still in the walk and
        unchanged is at its first request after ``cursor`` already, but for requests the
        walk skipped as seen (which it skips again); every other key is placed afresh."""
        old = self._bound
        self._reset(cursor, bound)
        again = self._moved
        again |= self._touched
        self._touched.clear()
        if bound > old:
            # The keys the old bound left out (or would have): back in the walk.
            again.update(self._index.between(old, bound))
        self._moved = set()
        for key in again:
            self._place(key)

    def _reset(self, cursor: HeadEntry | None, bound: float) -> None:
        """A new walk from after ``cursor`` under ``bound``: nothing dropped or refused."""
        self._bound = bound
        self._cursor = cursor
        self._dropped = set()
        self._refused = {}
        self._refused_by = None
        self._skipped = False

    def _place(self, key: PoolKey) -> None:
        """Put key ``key`` back in the walk at its first request after the cursor (or
        out of it: empty from there, or too large for the bound)."""
        at = self._at
        size = self._sizes.get(key)
        entries = self._by_key.get(key)
        if size is None or not entries:
            at.pop(key, None)
            return
        if size > self._bound:
            at.pop(key, None)  # back when a restart raises the bound past its size
            return
        cursor = self._cursor
        k = 0 if cursor is None else entries.bisect_right(cursor)
        if k >= len(entries):
            at.pop(key, None)
            return
        entry = entries[k]
        if at.get(key) != entry:
            at[key] = entry
            heapq.heappush(self._heap, (entry, _Unordered(key)))

    def _fill(self) -> None:
        heap = []
        at: dict[PoolKey, HeadEntry] = {}
        bound, cursor = self._bound, self._cursor
        by_key = self._by_key
        # Every key no bigger than the bound once, kept to a look-up or two each, read in
        # size order so that the keys above the bound cost nothing (``restart`` re-reads
        # only what moved; a refusal's revival comes here).
        for key in self._index.upto(bound):
            entries = by_key[key]
            if cursor is None:
                entry = entries[0]
            else:
                k = entries.bisect_right(cursor)
                if k >= len(entries):
                    continue
                entry = entries[k]
            heap.append((entry, _Unordered(key)))
            at[key] = entry
        heapq.heapify(heap)
        self._heap = heap
        self._at = at
        self._moved = set()
        self._touched.clear()

    def drop(self, key: PoolKey | None) -> None:
        """The pool refused a request of key ``key``: leave out the rest of it and of
        every key that differs from it only in duration."""
        if key is not None:
            self._dropped.add(pool_group(key))

    def refuse_from(self, key: PoolKey, duration: float, profile: Profile) -> None:
        """The reservations ``profile`` refused a request of ``key`` lasting ``duration``:
        while they stay as they are, pass over the requests of its group that last at
        least that long, except in the keys of the reservation holders (each is asked on
        its own)."""
        if profile is not self._refused_by:
            self._revive()
            self._refused_by = profile
        pending = self._pending
        keep = {
            k
            for h in profile.reservations
            if h in pending and (k := pending[h].pool_key) is not None
        }
        self._refused[pool_group(key)] = (duration, keep)

    def _revive(self) -> None:
        """The reservations changed: what was passed over for them comes back, from after
        the cursor."""
        if self._skipped:
            self._fill()
        self._refused = {}
        self._refused_by = None
        self._skipped = False

    def _shorter(self, key: PoolKey, after: HeadEntry, limit: float) -> HeadEntry | None:
        """The first request of key ``key`` after ``after`` in admission order that
        lasts less than ``limit``, or None."""
        pending = self._pending
        best: HeadEntry | None = None
        for duration, _, rid in self._durations.get(key, ()):
            if duration >= limit:
                break
            entry = pending[rid].head_entry
            if entry is not None and entry > after and (best is None or entry < best):
                best = entry
        return best

    def peek(self, seen: set[str], profile: object) -> HeadEntry | None:
        """The next request in admission order that is not in ``seen``, or None when the
        walk is over; ``advance`` moves past it. ``profile``: the reservations as they are
        now (None: to be built afresh), which the refusals must have come from."""
        if self._refused_by is not None and profile is not self._refused_by:
            self._revive()
        heap = self._heap
        at, sizes, bound = self._at, self._sizes, self._bound
        dropped, refusals = self._dropped, self._refused
        while heap:
            entry, key = heap[0]
            if at.get(key) != entry:
                heapq.heappop(heap)  # stale: its key has another place, or left
                continue
            size = sizes.get(key)
            if size is not None and size > bound:
                # Too large since a restart lowered the bound: back when it rises again.
                heapq.heappop(heap)
                del at[key]
                continue
            group = pool_group(key)
            if group in dropped:
                heapq.heappop(heap)
                del at[key]
                self._moved.add(key)
                continue
            refused = refusals.get(group) if refusals else None
            if (
                refused is not None
                and key not in refused[1]
                and self._pending[entry[3]].duration_s >= refused[0]
            ):
                # Refused like every request of its group this long: on to the next
                # shorter one of its key.
                self._skipped = True
                self._moved.add(key)
                nxt = self._shorter(key, entry, refused[0])
                if nxt is None:
                    heapq.heappop(heap)
                    del at[key]
                else:
                    heapq.heapreplace(heap, (nxt, key))
                    at[key] = nxt
                continue
            if entry[3] in seen:
                self.advance()
                continue
            return entry
        return None

    def pass_to(self, entry: HeadEntry) -> None:
        """The pass has reached ``entry`` by another way (a changed campaign's head, tried
        in its turn): a later restart or revival walks on from after it, not from before.
        Every request still in the walk comes after it already (the pass takes whichever
        comes first)."""
        if self._cursor is None or entry > self._cursor:
            self._cursor = entry

    def advance(self) -> None:
        """Move past the entry ``peek`` returned: the next one of its key takes its place."""
        heap = self._heap
        entry, key = heap[0]
        self._cursor = entry
        entries = self._by_key.get(key)
        k = entries.bisect_right(entry) if entries is not None else 0
        if entries is not None and k < len(entries):
            nxt = entries[k]
            heapq.heapreplace(heap, (nxt, key))
            self._at[key] = nxt
        else:
            heapq.heappop(heap)
            del self._at[key]
