"""The ledger: what each campaign holds, what the pool owes and reserves, what is charged.

``CampaignState`` is one campaign's account: what it holds, its buckets and credits, and
the cached quantities every decision reads (unmet guarantee, fair-share usage).
``Ledger`` keeps the pool-wide sums incrementally: the guarantee reserve (unmet
guarantees), what is reclaimable (active preemptible leases), what firm campaigns hold and
wait for (the price's pressure), and firm leases by end time (what frees capacity, and
when); it charges and refunds tokens and credits, and estimates how long a refused request
would wait.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from bursar.broker import admission, dims, isolation
from bursar.broker import price as pricing
from bursar.broker.bucket import Bucket
from bursar.broker.envelope import CampaignSpec, LeaseClass
from bursar.broker.lease import Lease
from bursar.broker.policy import Enforcement, PolicySpec
from bursar.broker.pool import PoolState
from bursar.broker.reasons import Reason

EPS = 1e-9
LN2 = math.log(2.0)
REBASE_HALF_LIVES = 64.0
"""Rebase scaled usage once it is 2^64 times its decayed value (far from overflow)."""


def id_order(lease_id: str) -> int:
    """A lease's (or request's) number: the order leases were asked for."""
    return int(lease_id[1:])


@dataclass(slots=True)
class CampaignState:
    spec: CampaignSpec
    held: dims.Vec = dims.ZERO
    buckets: dict[str, Bucket] = field(default_factory=dict)
    rate_buckets: dict[str, Bucket] = field(default_factory=dict)
    credits: float = 0.0
    leases: set[str] = field(default_factory=set)
    guarantee: dims.Vec = dims.ZERO
    sustained: dims.Vec = dims.ZERO
    burst: dims.Vec = dims.ZERO
    burst_bound: dims.Vec = dims.ZERO
    """The burst where it binds: +inf in a dimension whose burst is at least the pool's
    capacity there. Such a burst binds nothing the pool does not: whatever the pool can
    give the campaign beside everything it holds fits under the pool's capacity, so a
    request above it is blocked by the pool, waits as pool-blocked (it ages and may hold
    a reservation) and keeps its turn, rather than waiting on its own campaign's limits."""
    unmet: dims.Vec = dims.ZERO
    """max(0, guarantee - held); zero for a preemptible campaign. Cached: read per decision."""
    usage: float = 0.0
    """Decayed fair-share usage, scaled to the ledger's reference time (``Ledger.usage``)."""
    fair: float = 0.0
    """Its place in the fair-share order (``admission.order_key``): ``usage`` over the
    campaign's rates, +inf for a campaign with no sustained rate, 0 with fair share off.
    Cached: read per decision."""

    def set_spec(self, spec: CampaignSpec, now: float, capacity: dims.Vec) -> None:
        """Take ``spec`` at ``now`` in a pool of ``capacity`` (placed dimensions)."""
        self.spec = spec
        self.guarantee = spec.placed("guarantee")
        self.sustained = spec.placed("sustained")
        self.burst = spec.placed("burst")
        self.burst_bound = tuple(
            b if b < cap else math.inf for b, cap in zip(self.burst, capacity, strict=True)
        )
        for d, env in spec.envelopes.items():
            if d == dims.POWER:
                continue  # watts are the power budget's (``power_budget.py``)
            target = self.buckets if d in dims.PLACED else self.rate_buckets
            old = target.get(d)
            if old is None or old.capacity != env.bucket:
                target[d] = Bucket.full(env.bucket, env.sustained, now)
            else:
                old.rate = env.sustained
        for target, names in ((self.buckets, dims.PLACED), (self.rate_buckets, dims.RATE)):
            for d in [d for d in target if d not in spec.envelopes and d in names]:
                del target[d]
        self.refresh()

    def refresh(self) -> None:
        self.unmet = (
            dims.ZERO if self.spec.preemptible else isolation.unmet(self.guarantee, self.held)
        )

    def refresh_fair(self, on: bool) -> None:
        if not on:
            self.fair = 0.0
        elif admission.has_share(self.sustained):
            self.fair = self.usage
        else:
            self.fair = float("inf")


def _batch_class(c: CampaignState) -> bool:
    return not c.spec.preemptible and c.spec.lease_class is not LeaseClass.INTERACTIVE


def _victim_entry(ls: Lease) -> tuple[int, float, int, str]:
    return (ls.lease_class.rank, -ls.granted_at, -id_order(ls.id), ls.id)


def end_entry(ls: Lease, end: float) -> tuple[float, int, dims.Vec, str]:
    return (end, id_order(ls.id), ls.size, ls.campaign)


class Ledger:
    """The pool-wide sums over the campaigns' accounts, kept as holdings change."""

    __slots__ = (
        "_draining_of",
        "_kept",
        "_leases",
        "_lent",
        "_policy",
        "_pool",
        "_primary",
        "batch_reserve",
        "draining",
        "firm_ends",
        "firm_held",
        "guaranteed",
        "headroom",
        "max_guarantee",
        "queued_demand",
        "reclaimable",
        "reserve",
        "usage_ref",
        "victims",
    )

    def __init__(
        self, policy: PolicySpec, pool: PoolState, primary: int, leases: Mapping[str, Lease]
    ) -> None:
        self._policy = policy
        self._pool = pool
        self._primary = primary
        self._leases = leases
        self.reserve: dims.Vec = dims.ZERO
        """The guarantee reserve: the sum of the campaigns' unmet guarantees."""
        self.reclaimable: dims.Vec = dims.ZERO
        """What active preemptible leases hold (a starting one sits on booting nodes or on
        capacity still being handed over)."""
        self.victims: SortedList = SortedList()
        """The active preemptible leases in the order a reclaim takes them: lowest class,
        youngest first, as (class rank, -granted at, -number, id)."""
        self.firm_held: dims.Vec = dims.ZERO
        """What non-preemptible campaigns hold."""
        self.queued_demand: dims.Vec = dims.ZERO
        """What non-preemptible requests wait for."""
        self.firm_ends: SortedList = SortedList()
        """Firm (non-preemptible) leases by (end time, number, size, campaign): what frees
        capacity, and when."""
        self.max_guarantee = 0.0
        """The largest guarantee in the primary dimension."""
        self.draining: dims.Vec = dims.ZERO
        """What warned preemptible leases return to the pool (not to their claimants) by
        their deadline: with what is reclaimable, it backs the lent reserve."""
        self._draining_of: dict[str, dims.Vec] = {}
        self.batch_reserve: dims.Vec = dims.ZERO
        """The part of the reserve owed to batch-class (not interactive) campaigns: a batch
        request may wait out a grace period, so preemptible leases may fill it."""
        self.headroom: dims.Vec = dims.vec(policy.warm_headroom)
        """The warm headroom preemptible leases leave idle (``PolicySpec.warm_headroom``)."""
        self._lent: tuple[object, ...] = ()
        """``lent()`` with the vectors it was computed from (compared by identity: every
        change replaces a vector)."""
        self.guaranteed: dict[str, CampaignState] = {}
        """The firm campaigns with a guarantee (their unmet part returns to their reserve)."""
        self._kept: tuple[dims.Vec, dims.Vec] | None = None
        """``isolation.kept`` over ``guaranteed`` (None: to be summed again)."""
        self.usage_ref: float | None = None
        """The reference time of the campaigns' scaled usage (set at the first charge): a
        usage is stored multiplied by ``2^((now - usage_ref)/h)``, so that it need not be
        decayed as time passes: every campaign's decays by the same factor, and order is
        kept."""

    def __getstate__(self) -> tuple[None, dict[str, object]]:
        # A snapshot leaves the cache out: whether it is filled depends on who read it.
        state = {k: getattr(self, k) for k in self.__slots__}
        state["_lent"] = ()
        state["_kept"] = None
        return None, state

    def __setstate__(self, state: tuple[None, dict[str, object]]) -> None:
        self._kept = None
        for k, v in state[1].items():
            setattr(self, k, v)

    def retune(self, policy: PolicySpec) -> None:
        """A new policy is in force (``broker/retune.py``)."""
        self._policy = policy
        self.headroom = dims.vec(policy.warm_headroom)
        self._lent = ()  # computed with the old headroom

    # ------------------------------------------------------------------ holding

    def set_held(self, c: CampaignState, held: dims.Vec, now: float) -> None:
        """``c`` now holds ``held``: its buckets are brought to ``now`` at the old holding."""
        enforcement = self._policy.enforcement
        for i, d in enumerate(dims.PLACED):
            b = c.buckets.get(d)
            if b is not None:
                b.advance(now, c.held[i], enforcement)
        before = c.unmet
        old = c.held
        c.held = held
        c.refresh()
        self.reserve = dims.vmax0(dims.add(dims.sub(self.reserve, before), c.unmet))
        self._batch(c, before)
        if not c.spec.preemptible:
            self.firm_held = dims.vmax0(dims.add(dims.sub(self.firm_held, old), held))

    def open(self, c: CampaignState) -> None:
        """A new campaign: its guarantee joins the reserve."""
        self.reserve = dims.add(self.reserve, c.unmet)
        c.refresh_fair(self.fairshare)
        self._classify(c)
        self._batch(c, dims.ZERO)
        self.max_guarantee = max(self.max_guarantee, c.guarantee[self._primary])

    def respec(
        self, c: CampaignState, spec: CampaignSpec, now: float, every: Iterable[CampaignState]
    ) -> None:
        """``c`` takes a new spec (its buckets already brought to ``now``); ``every`` is
        every campaign, ``c`` included."""
        before = c.unmet
        c.set_spec(spec, now, self._pool.capacity)
        c.refresh_fair(self.fairshare)
        self._classify(c)
        self.reserve = dims.vmax0(dims.add(dims.sub(self.reserve, before), c.unmet))
        campaigns = list(every)
        # The class may have changed: the batch part is summed afresh.
        self.batch_reserve = dims.ZERO
        for other in campaigns:
            if _batch_class(other):
                self.batch_reserve = dims.add(self.batch_reserve, other.unmet)
        # Preemptibility may have changed: firm holdings are summed afresh.
        self.firm_held = dims.ZERO
        for other in campaigns:
            if not other.spec.preemptible:
                self.firm_held = dims.add(self.firm_held, other.held)
        self.max_guarantee = max(x.guarantee[self._primary] for x in campaigns)

    def _batch(self, c: CampaignState, before: dims.Vec) -> None:
        if _batch_class(c):
            self.batch_reserve = dims.vmax0(dims.add(dims.sub(self.batch_reserve, before), c.unmet))

    def lent(self) -> dims.Vec:
        """The part of the batch reserve that preemptible leases hold: the reserve not
        covered by free warm capacity, as far as the batch part and what backs it go
        (active preemptible leases, reclaimable within a grace period, and what warned ones
        return by their deadline)."""
        # Read several times per decision: computed again only when an input changed.
        on_free = self._pool.totals()[0]
        k = self._lent
        if (
            k
            and k[1] is self.reclaimable
            and k[2] is self.draining
            and k[3] is self.batch_reserve
            and k[4] is self.reserve
            and k[5] is on_free
        ):
            return k[0]  # type: ignore[return-value]
        backing = dims.add(self.reclaimable, self.draining)
        if dims.is_zero(self.batch_reserve) or dims.is_zero(backing):
            lent = dims.ZERO
        else:
            # Preemptible leases leave the headroom idle too: what free warm capacity does
            # not cover of reserve + headroom is what they hold of the reserve.
            uncovered = dims.vmax0(dims.sub(dims.add(self.reserve, self.headroom), on_free))
            lent = dims.vmin(uncovered, dims.vmin(self.batch_reserve, backing))
        self._lent = (
            lent,
            self.reclaimable,
            self.draining,
            self.batch_reserve,
            self.reserve,
            on_free,
        )
        return lent

    def warm_reserve(self) -> dims.Vec:
        """The reserve that must stay warm and free: all of it, less what is lent."""
        return dims.vmax0(dims.sub(self.reserve, self.lent()))

    def reclaimable_for(self, c: CampaignState) -> dims.Vec:
        """What a firm request of ``c`` may reclaim: the lent part backs the batch reserve
        and is not the pool's, except for the campaign it is owed to (up to its own unmet
        guarantee)."""
        lent = self.lent()
        if dims.is_zero(lent):
            return self.reclaimable
        if _batch_class(c):
            lent = dims.vmax0(dims.sub(lent, c.unmet))
        return dims.vmax0(dims.sub(self.reclaimable, lent))

    def ceiling(self, spec: CampaignSpec, capacity: dims.Vec) -> dims.Vec:
        """``isolation.ceiling`` for a request of the campaign of ``spec``. Validation asks
        it for every request; the guarantees' sums change only with a guarantee, so they
        are kept until then instead of summed over every guaranteed campaign (a replay has
        one per user) per request."""
        if self._kept is None:
            self._kept = isolation.kept(x.spec for x in self.guaranteed.values())
        return isolation.ceiling(spec, self._kept, capacity)

    def _classify(self, c: CampaignState) -> None:
        # Called whenever a campaign opens or takes a new spec: a guarantee may have moved.
        self._kept = None
        if not c.spec.preemptible and not dims.is_zero(c.guarantee):
            self.guaranteed[c.spec.name] = c
        else:
            self.guaranteed.pop(c.spec.name, None)

    # ------------------------------------------------------------------ fair share

    @property
    def fairshare(self) -> bool:
        return self._policy.fairshare_half_life_s is not None

    def charge_usage(
        self, c: CampaignState, size: dims.Vec, start: float, end: float, sign: int = 1
    ) -> None:
        """Count (+1) or give back (-1) ``size`` held over [start, end] in ``c``'s usage."""
        h = self._policy.fairshare_half_life_s
        if h is None or end <= start:
            return
        w = admission.usage_weight(size, c.sustained)
        if w <= 0:
            return
        if self.usage_ref is None:
            self.usage_ref = start
        ref = self.usage_ref
        amount = w * h / LN2 * (2.0 ** ((end - ref) / h) - 2.0 ** ((start - ref) / h))
        c.usage = max(0.0, c.usage + sign * amount)
        c.refresh_fair(True)

    def rebase_usage(self, now: float, every: Iterable[CampaignState]) -> bool:
        """Move the reference time to ``now`` once the scale grows large (a uniform rescale:
        the order is unchanged, the stored numbers stay small); True if it moved."""
        h = self._policy.fairshare_half_life_s
        if h is None or self.usage_ref is None or (now - self.usage_ref) / h < REBASE_HALF_LIVES:
            return False
        factor = 2.0 ** (-(now - self.usage_ref) / h)
        for c in every:
            c.usage *= factor
            c.refresh_fair(True)
        self.usage_ref = now
        return True

    def decayed_usage(self, c: CampaignState, now: float) -> float:
        """``c``'s usage decayed to ``now``: seconds at its sustained rate."""
        h = self._policy.fairshare_half_life_s
        if h is None or self.usage_ref is None:
            return 0.0
        return c.usage * 2.0 ** (-(now - self.usage_ref) / h)

    def add_demand(self, c: CampaignState, size: dims.Vec, sign: int) -> None:
        """A request of ``c`` joins (+1) or leaves (-1) the queue."""
        # Preemptible demand yields to everyone, so it is not scarcity and does not raise
        # the price.
        if c.spec.preemptible:
            return
        self.queued_demand = dims.vmax0(dims.add(self.queued_demand, tuple(sign * x for x in size)))

    # ------------------------------------------------------------------ reclaimable

    def activated(self, ls: Lease) -> None:
        if ls.preemptible:
            self.reclaimable = dims.add(self.reclaimable, ls.size)
            self.victims.add(_victim_entry(ls))

    def not_reclaimable(self, ls: Lease) -> None:
        """An active preemptible lease ended: it is reclaimable no more."""
        self.reclaimable = dims.vmax0(dims.sub(self.reclaimable, ls.size))
        self.victims.discard(_victim_entry(ls))

    def warned(self, ls: Lease, claimed: dims.Vec) -> None:
        """An active preemptible lease was warned, ``claimed`` of it for its claimant: it is
        reclaimable no more, and the rest returns to the pool by its deadline (draining)."""
        self.not_reclaimable(ls)
        rest = dims.vmax0(dims.sub(ls.size, claimed))
        self._draining_of[ls.id] = rest
        self.draining = dims.add(self.draining, rest)

    def claimed_draining(self, ls: Lease, claimed: dims.Vec) -> None:
        """Part of a warned lease's remainder was claimed: it goes to a claimant at the
        deadline, not back to the pool."""
        rest = dims.vmax0(dims.sub(self._draining_of.get(ls.id, dims.ZERO), claimed))
        gone = dims.sub(self._draining_of.get(ls.id, dims.ZERO), rest)
        self._draining_of[ls.id] = rest
        self.draining = dims.vmax0(dims.sub(self.draining, gone))

    def drained(self, ls: Lease) -> None:
        """A warned lease ended: what it was returning is back (free, or its claimants')."""
        rest = self._draining_of.pop(ls.id, dims.ZERO)
        self.draining = dims.vmax0(dims.sub(self.draining, rest))

    # ------------------------------------------------------------------ firm ends

    def firm_started(self, ls: Lease) -> None:
        if not ls.preemptible:
            self.firm_ends.add(end_entry(ls, ls.expires_at))

    def firm_renewed(self, ls: Lease, new_end: float) -> None:
        """Call before ``ls.expires_at`` moves to ``new_end``."""
        if not ls.preemptible:
            self.firm_ends.remove(end_entry(ls, ls.expires_at))
            self.firm_ends.add(end_entry(ls, new_end))

    def firm_ended(self, ls: Lease) -> None:
        if not ls.preemptible:
            self.firm_ends.remove(end_entry(ls, ls.expires_at))

    # ------------------------------------------------------------------ price and charges

    def pressure(self, demand: dims.Vec | None = None) -> float:
        """The price's pressure: firm holdings plus ``demand`` (default: all queued firm
        demand) over capacity."""
        if demand is None:
            demand = self.queued_demand
        return pricing.pressure(self.firm_held, demand, self._pool.capacity)

    def price(self, demand: dims.Vec | None = None) -> float:
        """The price per unit-hour at the current pressure (``demand`` as in ``pressure``)."""
        if demand is None:
            demand = self.queued_demand
        rho = pricing.pressure(self.firm_held, demand, self._pool.capacity)
        return pricing.price(self._policy.price_base, self._policy.price_k, rho)

    def credit_rate(self, price: float, size: dims.Vec) -> float:
        """Credits per second for holding ``size`` at ``price`` (per unit-hour)."""
        return price * pricing.charged_units(size, self._pool.capacity) / 3600.0

    def charge(
        self, c: CampaignState, rate: dims.Vec, credit_rate: float, span: float, now: float
    ) -> tuple[float, float]:
        """Charge ``c`` for ``span`` seconds: the prepaid tokens above the sustained rate
        (unit-seconds, all dimensions) and the credits; returns (tokens, credits)."""
        tokens = 0.0
        enforcement = self._policy.enforcement
        if enforcement is Enforcement.PREPAID:
            for i, d in enumerate(dims.PLACED):
                b = c.buckets.get(d)
                if b is None or rate[i] <= 0:
                    continue
                b.advance(now, c.held[i], enforcement)
                b.take(rate[i] * span)
                tokens += rate[i] * span
        credits = credit_rate * span
        c.credits += credits
        return tokens, credits

    def refund(self, c: CampaignState, tokens: dims.Vec, credits: float) -> None:
        """Give back what a lease ending early did not use."""
        for i, d in enumerate(dims.PLACED):
            b = c.buckets.get(d)
            if b is not None and tokens[i] > 0:
                b.give(tokens[i])
        c.credits -= credits

    # ------------------------------------------------------------------ waits

    def pool_bound(self) -> float:
        """An upper bound, in the primary dimension, on what any request could get now."""
        on_free, boot_free, cold, _ = self._pool.totals()
        i = self._primary
        # Warm: beyond the reserve, plus at most the largest guarantee (a campaign's own
        # unmet part), and never more than is free.
        warm = min(on_free[i], max(0.0, on_free[i] - self.reserve[i]) + self.max_guarantee)
        return warm + self.reclaimable[i] + boot_free[i] + cold[i] + EPS

    def bucket_wait(self, c: CampaignState, rate: dims.Vec, span: float, now: float) -> float:
        """How long until ``c``'s buckets cover ``rate`` for ``span`` seconds."""
        policy = self._policy
        enforcement = policy.enforcement
        worst = 0.0
        for i, d in enumerate(dims.PLACED):
            b = c.buckets.get(d)
            if b is None or rate[i] <= 0:
                continue
            b.advance(now, c.held[i], enforcement)
            need = rate[i] * span if enforcement is Enforcement.PREPAID else 1e-6
            t = b.time_until(need, c.held[i], enforcement)
            if t is None:
                t = self._own_first_expiry(c, now)
            worst = max(worst, t)
        return admission.retry_after(policy.min_retry_s, worst)

    def _own_first_expiry(self, c: CampaignState, now: float) -> float:
        ends = [self._leases[lid].expires_at for lid in c.leases]
        return (min(ends) - now) if ends else self._policy.max_lease_s

    def estimate_wait(
        self, c: CampaignState, size: dims.Vec, duration_s: float, reason: Reason, now: float
    ) -> float:
        """How long a request of ``c`` refused for ``reason`` would likely wait."""
        leases = self._leases
        policy = self._policy
        if reason is Reason.ABOVE_BURST:
            excess = dims.vmax0(dims.sub(dims.add(c.held, size), c.burst_bound))
            freed = dims.ZERO
            for t, lid in sorted((leases[lid].expires_at, lid) for lid in c.leases):
                freed = dims.add(freed, leases[lid].size)
                if dims.fits(excess, freed):
                    return max(0.0, t - now)
            return policy.max_lease_s
        if reason is Reason.BUCKET_EMPTY:
            rate = admission.token_need(c.held, size, c.sustained)
            return self.bucket_wait(c, rate, duration_s, now)
        # Pool reasons: when will enough firm capacity have ended to cover the shortfall?
        on_free, boot_free, cold, _ = self._pool.totals()
        have = dims.add(dims.add(dims.vmax0(dims.sub(on_free, self.reserve)), boot_free), cold)
        if not c.spec.preemptible:
            have = dims.add(have, self.reclaimable)
        short = dims.vmax0(dims.sub(size, have))
        freed = dims.ZERO
        for t, _, piece, _ in self.firm_ends:
            freed = dims.add(freed, piece)
            if dims.fits(short, freed):
                grace = policy.grace_s if not dims.is_zero(self.reclaimable) else 0.0
                return max(0.0, t - now) + grace
        return policy.max_lease_s
