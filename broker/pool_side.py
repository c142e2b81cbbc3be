"""The pool side of an admission try: the plan (warm, reclaim, cold) a request of a
campaign could be placed on now under the isolation rule and, where power is capped,
under the facility's cap with the nodes the plan boots, with its start delay; or why not
(the guarantee reserve, or a full pool, in nodes or in watts).

What a campaign may use (``capacity_for``: the warm limit and the cold capacity, after
the reserve that other campaigns' guarantees keep warm and the headroom), whether a
reclaim leaves the lent reserve reclaimable by its owners (``keeps_lent``), and when a
plan's lease can start (``start_delay``). Functions of the engine's pool and ledger, the
campaign's preemptibility, class and unmet guarantee, and the request's demand: an
admission pass asks them once per such group between grants (``pool_side``'s memo).
Part of the engine's fold; it reads the engine's state and changes none of it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bursar.broker import admission, dims, isolation, paths
from bursar.broker.decisions import LeasePath
from bursar.broker.envelope import LeaseClass
from bursar.broker.reasons import Reason

if TYPE_CHECKING:
    from bursar.broker.engine import Engine
    from bursar.broker.ledger import CampaignState
    from bursar.broker.pending import Pending


def pool_side(
    eng: Engine, p: Pending, c: CampaignState, memo: dict[Any, Any] | None = None
) -> tuple[paths.Plan, float] | tuple[admission.Refusal, None]:
    """``place_check``, asked once per campaign group and demand between grants in an
    admission pass: it depends on the pool, the ledger and the power drawn (unchanged
    until the next grant), the campaign's group (as its requests' pool key says it) and
    the demand with its declared watts only, and a long queue asks it for the same few
    demands again and again."""
    if memo is None:
        return place_check(eng, p, c)
    key = (
        c.spec.preemptible,
        c.spec.lease_class,
        eng.queue.unmet_key(c),
        p.size if p.demand is None else p.demand.ident,
        p.watts,
    )
    placed = memo.get(key)
    if placed is None:
        placed = memo[key] = place_check(eng, p, c)
    return placed  # type: ignore[no-any-return]


def place_check(
    eng: Engine, p: Pending, c: CampaignState
) -> tuple[paths.Plan, float] | tuple[admission.Refusal, None]:
    """The pool side of ``Engine._try``: a plan whose pieces can be placed now under the
    isolation rule and the power cap, with its start delay; else why not (reserved or
    full). A function of the pool, the ledger and the power drawn, the campaign's
    preemptibility, class and unmet guarantees (its power one included), and the
    request's demand with its declared watts."""
    size = p.size
    preemptible = c.spec.preemptible
    on_free, _, _, _ = eng.pool.totals()
    limit, cold_avail = capacity_for(eng, c)
    reclaimable = eng.ledger.reclaimable_for(c)
    # A batch campaign whose own reserve is lent takes it back before booting more.
    reclaim_first = (
        not preemptible
        and c.spec.lease_class is not LeaseClass.INTERACTIVE
        and not dims.is_zero(dims.vmin(c.unmet, eng.ledger.lent()))
    )
    plan = eng.placement.plan(p, limit, cold_avail, preemptible, reclaimable, reclaim_first)
    if (
        preemptible
        and plan is not None
        and plan.path is not LeasePath.WARM
        and not dims.is_zero(eng.ledger.batch_reserve)
    ):
        # Only a lease active at once is reclaimable: one that waits for a boot may not
        # hold any of the batch reserve meanwhile.
        limit, cold_avail = capacity_for(eng, c, borrow=False)
        plan = eng.placement.plan(p, limit, cold_avail, preemptible, reclaimable)
    if plan is not None and not preemptible and not keeps_lent(eng, c, plan):
        plan = None
    if (
        plan is None
        and not preemptible
        and c.spec.lease_class is not LeaseClass.INTERACTIVE
        and isolation.within_own_guarantee(size, c.unmet)
        and not dims.is_zero(dims.vmin(c.unmet, eng.ledger.lent()))
    ):
        # Its own reserve is lent and the lease backing it already drains for another
        # request: it takes its part of what that lease returns (the isolation bound
        # for a batch guarantee, when no node is left to boot).
        plan = eng.placement.plan_draining(p)
    if plan is None:
        unreserved = dims.sub(on_free, eng.headroom) if preemptible else on_free
        everything = dims.add(
            dims.add(dims.vmax0(unreserved), cold_avail),
            dims.ZERO if preemptible else reclaimable,
        )
        # Reserved only if the pieces could be placed without the reserve: a request
        # that no node shape fits is blocked by the pool, whatever the aggregates say.
        reserved = dims.fits(size, everything) and (
            eng.placement.plan(p, unreserved, cold_avail, preemptible) is not None
        )
        reason = Reason.GUARANTEE_RESERVED if reserved else Reason.POOL_FULL
        return admission.Refusal(reason, {}, admission.Side.POOL), None
    budget = eng.watts
    if budget.cap is not None:
        # The facility cap, on the lease's watts and the idle draw of the nodes the plan
        # boots: part of the pool's answer, so it holds for the request's whole pool group
        # until the next grant, as a full pool does.
        watts = budget.watts_of(p.watts, size, eng.pool.primary)
        boots = budget.boot_watts(eng.pool, eng.placement.boots(plan))
        victims = eng.placement.victims(plan)
        handed = budget.handed(victims) if victims else 0.0
        refused = budget.cap_refusal(eng.pool, p.campaign, watts, boots, handed)
        if refused is not None:
            more = (
                None if preemptible else watt_victims(eng, c, plan, watts, boots, victims, handed)
            )
            if more is None:
                return refused, None
            plan = more
    return plan, start_delay(eng, plan)


def watt_victims(
    eng: Engine,
    c: CampaignState,
    plan: paths.Plan,
    watts: float,
    boots: float,
    victims: tuple[str, ...],
    handed: float,
) -> paths.Plan | None:
    """``plan`` with preemptible leases warned for their watts, where the cap is what
    refuses it: taken in the reclaim order (lowest class, youngest first, as for nodes)
    until their watts, with those of the plan's own victims, make up what the lease is
    short under the cap (a victim is not passed over to spare it, as for nodes); None if
    all of them would not, or if warning them would leave the lent reserve unreclaimable
    by its owners. The lease then starts when they end (a grace period). ``victims`` and
    ``handed``: the plan's own victims and the watts they hand over already."""
    budget = eng.watts
    short = budget.short_of(eng.pool, c.spec.name, watts, boots)
    have = handed  # what the plan's own victims hand over already
    chosen: list[str] = []
    for v in eng.placement.watt_victims(victims):
        if have + 1e-9 >= short:
            break
        w = budget.counted(v.id)
        if w > 0:
            chosen.append(v.id)
            have += w
    if not chosen or have + 1e-9 < short:
        return None
    path = LeasePath.RECLAIM if plan.path is LeasePath.WARM else plan.path
    more = dataclasses.replace(plan, path=path, watt_victims=tuple(chosen))
    return more if keeps_lent(eng, c, more) else None


def capacity_for(eng: Engine, c: CampaignState, borrow: bool = True) -> tuple[dims.Vec, dims.Vec]:
    """(warm limit, cold capacity) a request of ``c`` may use under the isolation rule.
    ``borrow=False``: a preemptible request that may not fill the batch reserve (one that
    also waits for a boot); it keeps off the reserve that must stay warm, less what
    active preemptible leases already hold of it."""
    on_free, boot_free, cold, _ = eng.pool.totals()
    ledger = eng.ledger
    if c.spec.preemptible and not borrow:
        limit = isolation.warm_limit(on_free, ledger.warm_reserve(), c.unmet, eng.headroom, True)
    elif c.spec.preemptible:
        limit = isolation.warm_limit(
            on_free, ledger.reserve, c.unmet, eng.headroom, True, ledger.batch_reserve
        )
    else:
        # What preemptible leases hold of the batch reserve is not free warm capacity
        # to set aside; of this campaign's own part, only what is not lent is warm.
        lent = ledger.lent()
        own = c.unmet
        if not dims.is_zero(lent) and c.spec.lease_class is not LeaseClass.INTERACTIVE:
            own = dims.vmax0(dims.sub(own, lent))
        limit = isolation.warm_limit(
            on_free, dims.vmax0(dims.sub(ledger.reserve, lent)), own, eng.headroom, False
        )
    # A negative limit is reserve (or headroom) not yet warm: it is booting, kept warm
    # by PowerControl.keep_warm, so the cold path may not hand it out either.
    cold_avail = dims.vmax0(dims.add(dims.add(boot_free, cold), dims.vmin(limit, dims.ZERO)))
    return limit, cold_avail


def keeps_lent(eng: Engine, c: CampaignState, plan: paths.Plan) -> bool:
    """Does a reclaim leave enough reclaimable capacity behind for the owners of the
    lent reserve to reclaim it within a grace period? Victims are warned whole, so a
    reclaim can take more than it needs; what a warned lease drains back by its deadline
    still backs the reserve's accounting (``Ledger.lent``), but its owner cannot be
    granted it until then. Its owner itself may take its own part."""
    if dims.is_zero(plan.reclaim) and not plan.watt_victims:
        return True
    ledger = eng.ledger
    lent = ledger.lent()
    if dims.is_zero(lent):
        return True
    if c.spec.lease_class is not LeaseClass.INTERACTIVE:
        lent = dims.vmax0(dims.sub(lent, c.unmet))
    left = dims.vmax0(dims.sub(ledger.reclaimable, eng.placement.warned(plan)))
    return dims.fits(lent, left)


def start_delay(eng: Engine, plan: paths.Plan) -> float:
    delay = 0.0
    if not dims.is_zero(plan.reclaim) or plan.watt_victims:
        delay = eng.policy.grace_s
    if not dims.is_zero(plan.cold):
        delay = max(delay, eng.pool_spec.boot_latency_s)
    return delay
