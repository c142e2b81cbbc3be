"""The queue: requests waiting for a grant, and the indexes the admission pass reads.

Requests wait first come, first served within a (campaign, class) queue while its head
waits on the campaign's own limits (burst, bucket): the requests behind it are not tried.
A head blocked only by the pool does not hold its campaign's later requests back: they
are tried like any other (a pool-blocked request may be passed, within its campaign as
across campaigns; the reservations keep that from starving it). Beside the queues
``Queues`` keeps, incrementally:

* the requests blocked for a pool reason, in admission order, with their sizes in the
  primary dimension (a pass walks them in order, skips those too big for what is free,
  and stops once nothing left could fit), and which of them lie within their campaign's
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
from typing import TYPE_CHECKING

from sortedcontainers import SortedList

from bursar.broker import admission, dims, isolation
from bursar.broker.envelope import LeaseClass
from bursar.broker.reasons import Reason
from bursar.broker.shape import Demand
from bursar.broker.timers import TimerKind

if TYPE_CHECKING:
    from bursar.broker.ledger import CampaignState

HeadEntry = tuple[int, float, int, str]
"""A pool-blocked head's place: its admission order key, then its id."""


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


class Queues:
    """The waiting requests of every campaign, and the indexes kept over them."""

    __slots__ = (
        "_aged_heap",
        "_by_campaign",
        "_campaigns",
        "_indexed",
        "_patience_s",
        "_pool_sizes",
        "_primary",
        "_push_timer",
        "_queues",
        "aged",
        "dirty",
        "guarantee_heads",
        "pending",
        "pool_dirty",
        "pool_heads",
        "wake_at",
    )

    def __init__(
        self,
        campaigns: Mapping[str, CampaignState],
        primary: int,
        patience_s: float,
        push_timer: Callable[[float, TimerKind, str], None],
    ) -> None:
        self._campaigns = campaigns
        self._primary = primary
        self._patience_s = patience_s
        self._push_timer = push_timer
        self.pending: dict[str, Pending] = {}
        """Every waiting request by id."""
        self._queues: dict[tuple[str, LeaseClass], deque[str]] = {}
        self._by_campaign: dict[str, dict[LeaseClass, None]] = {}
        """The classes each campaign has a queue in, in the order they were opened."""
        self.aged: set[str] = set()
        self._aged_heap: list[tuple[int, int, str]] = []
        self.pool_heads: SortedList = SortedList()
        self._pool_sizes: SortedList = SortedList()
        self.guarantee_heads: dict[str, None] = {}
        self._indexed: dict[str, dict[str, None]] = {}
        """Each campaign's requests in the pool-blocked index."""
        self.wake_at: dict[str, float] = {}
        """When each bucket-blocked campaign's queue is looked at again (the earliest asked)."""
        self.dirty: set[str] = set()
        """Campaigns whose queue heads the next admission pass must try."""
        self.pool_dirty = False
        """Capacity was freed: the next pass scans the pool-blocked heads."""

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
        if not q:
            del self._queues[qk]
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
        if pool and not was_pool and p.id in self.aged:
            # Once per spell of pool-blocked waiting: the entry stays valid while it lasts.
            heapq.heappush(self._aged_heap, (-p.lease_class.rank, p.seq, p.id))

    def rekey(self, campaign: str) -> None:
        """A campaign's holding or usage changed: move its indexed requests to their new
        place in the order, and refresh which lie within its unmet guarantee."""
        ids = self._indexed.get(campaign)
        if not ids:
            return
        c = self._campaigns[campaign]
        first = self.pending[next(iter(ids))]
        if first.head_entry is not None and first.head_entry[1] != c.fair:
            for rid in list(ids):
                self._index_head(self.pending[rid], True)
        elif not dims.is_zero(c.guarantee):
            for rid in ids:
                if isolation.within_own_guarantee(self.pending[rid].size, c.unmet):
                    self.guarantee_heads[rid] = None
                else:
                    self.guarantee_heads.pop(rid, None)

    def age(self, request_id: str) -> None:
        """``request_id``'s patience ran out: it may become the head-of-line barrier."""
        self.aged.add(request_id)
        p = self.pending[request_id]
        if p.reason in admission.POOL_REASONS:
            heapq.heappush(self._aged_heap, (-p.lease_class.rank, p.seq, p.id))

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
            self.pool_heads.remove(p.head_entry)
            self._pool_sizes.remove(p.size[self._primary])
            p.head_entry = None
            ids = self._indexed[p.campaign]
            del ids[p.id]
            if not ids:
                del self._indexed[p.campaign]
        self.guarantee_heads.pop(p.id, None)
        if on:
            p.head_entry = (*self.key(p), p.id)
            self.pool_heads.add(p.head_entry)
            self._pool_sizes.add(p.size[self._primary])
            self._indexed.setdefault(p.campaign, {})[p.id] = None
            if isolation.within_own_guarantee(p.size, self._campaigns[p.campaign].unmet):
                self.guarantee_heads[p.id] = None

    # ------------------------------------------------------------------ the pass

    def barrier(self) -> tuple[int, int] | None:
        """(-rank, seq) of the head-of-line request: the highest-class, oldest aged request
        still blocked for a pool reason; None if there is none."""
        heap = self._aged_heap
        while heap:
            _, _, rid = heap[0]
            p = self.pending.get(rid)
            if p is not None and rid in self.aged and p.reason in admission.POOL_REASONS:
                return heap[0][0], heap[0][1]
            # Gone, granted, or blocked for its own reasons now; re-pushed if that changes.
            heapq.heappop(heap)
        return None

    def aged_front(self, n: int) -> list[Pending]:
        """The first ``n`` aged requests still blocked for a pool reason, by (-class rank,
        arrival), skipping preemptible campaigns' (they yield to everyone and hold no
        reservation)."""
        if self.barrier() is None:
            return []
        out: list[Pending] = []
        k = n
        while True:
            entries = heapq.nsmallest(k, self._aged_heap)
            out = []
            seen: set[str] = set()
            for _, _, rid in entries:
                p = self.pending.get(rid)
                if (
                    p is None
                    or rid in seen
                    or rid not in self.aged
                    or p.reason not in admission.POOL_REASONS
                    or self._campaigns[p.campaign].spec.preemptible
                ):
                    continue
                seen.add(rid)
                out.append(p)
                if len(out) == n:
                    return out
            if k >= len(self._aged_heap):
                return out
            k *= 4

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
        """(order key, id) of the heads of every queue of the dirty campaigns."""
        out = []
        for name in sorted(self.dirty):
            for lc in self._by_campaign.get(name, ()):
                rid = self._queues[(name, lc)][0]
                out.append((self.key(self.pending[rid]), rid))
        return out

    def next_pool_head(
        self,
        cursor: HeadEntry | None,
        barrier: tuple[int, int] | None,
        seen: set[str],
        bound: float,
    ) -> HeadEntry | None:
        """The first pool-blocked head after ``cursor`` in admission order that is not in
        ``seen`` and no bigger than ``bound`` in the primary dimension; None once none is
        left before the barrier's class (everything from there down waits behind it)."""
        if not self._pool_sizes or self._pool_sizes[0] > bound:
            return None
        it: Iterator[HeadEntry] = (
            self.pool_heads.irange(minimum=cursor, inclusive=(False, True))
            if cursor is not None
            else iter(self.pool_heads)
        )
        primary = self._primary
        for entry in it:
            if barrier is not None and entry[0] >= barrier[0]:
                return None
            if entry[3] in seen:
                continue
            if self.pending[entry[3]].size[primary] <= bound:
                return entry
        return None
