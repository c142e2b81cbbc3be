"""The engine's reservations as of its current admission pass, cut from its state now.

``build`` hands ``reservations.cut`` what the profile is cut from: the pool's free,
booting and cold capacity, the warm reserve, what a reclaim could take back within a grace
period (and the elastic leases' extra steps, which come back so), the firm leases' ends as
the ledger keeps them in time order, the guaranteed campaigns' holdings, and the first aged
requests (``PolicySpec.reservations`` of them). It is built lazily, at most once per event
and pass and again after a holder is granted (``reservations.Current`` is the cache).
``granted`` keeps the profile true after a grant; ``crowds_own_holder`` is the one rule
about a campaign's own reservation that the profile cannot answer by itself. Part of the
engine's fold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bursar.broker import admission, dims, isolation, reservations

if TYPE_CHECKING:
    from bursar.broker.engine import Engine
    from bursar.broker.lease import Lease
    from bursar.broker.ledger import CampaignState
    from bursar.broker.pending import Pending


def build(eng: Engine) -> reservations.Profile | None:
    """The reservations of the first aged requests (``PolicySpec.reservations`` of them)
    and the capacity profile they were cut from; None when no request holds one. Built
    at most once per event and admission pass, and again after a holder is granted."""
    cut = eng._cut
    if cut.fresh:
        return cut.profile
    cut.fresh = True
    cut.profile = None
    holders = eng.queue.aged_front(eng.policy.reservations)
    if not holders:
        return None
    ledger = eng.ledger
    on_free, boot_free, cold, _ = eng.pool.totals()
    reclaim = dims.vmax0(dims.sub(ledger.reclaimable, ledger.lent()))
    if not dims.is_zero(eng.elastic.held):
        # Elastic leases' extra steps come back a grace period after a warning.
        reclaim = dims.add(reclaim, eng.elastic.held)
    cut.guarantees = reservations.GuaranteeView(ledger.guaranteed)
    cut.added = set()
    cut.profile = reservations.cut(
        reservations.Capacity(
            eng.now,
            on_free,
            dims.add(boot_free, cold),
            ledger.warm_reserve(),
            reclaim,
            eng.policy.grace_s,
            eng.pool_spec.boot_latency_s,
        ),
        reservations.firm_ends_as_built(ledger.firm_ends, cut.added),
        cut.guarantees,
        [(p.id, p.size, p.duration_s, eng.campaigns[p.campaign].unmet) for p in holders],
    )
    return cut.profile


def crowds_own_holder(
    eng: Engine, p: Pending, c: CampaignState, end: float, profile: reservations.Profile
) -> bool:
    """Would ``p``, still held when a reservation of its own campaign begins, push that
    request over the campaign's burst then (so that its reservation is lost)?"""
    for rid, r in profile.reservations.items():
        if rid == p.id or end <= r.at:
            continue
        holder = eng.queue.pending.get(rid)
        if (
            holder is not None
            and holder.campaign == p.campaign
            and admission.over_burst(dims.add(c.held, p.size), holder.size, c.burst_bound)
        ):
            return True
    return False


def granted(eng: Engine, p: Pending, ls: Lease, own: dims.Vec) -> None:
    """Keep this pass's reservations true after a grant: a holder's grant frees its
    reservation (the next aged request may take its place); any other grant past them
    holds its capacity over its span."""
    if not eng._cut.fresh or eng._cut.profile is None:
        return
    if p.id in eng._cut.profile.reservations:
        eng._cut.stale()
    elif not isolation.within_own_guarantee(p.size, own):
        eng._cut.profile.take(p.size, ls.starts_at, ls.expires_at)
