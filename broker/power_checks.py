"""The engine's power checks and charges, on its state (``power_budget.py`` holds the
rules' state and arithmetic): a request's own envelope in watts, the facility cap with
the boots its plan makes and the reservation holders' watts ahead of it, and a grant's
watts and joules. Part of the engine's fold, as ``renewal.py`` is: each function reads and
changes the engine's state as its own handlers do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bursar.broker import dims

if TYPE_CHECKING:
    from bursar.broker import paths, reservations
    from bursar.broker.admission import Refusal
    from bursar.broker.engine import Engine
    from bursar.broker.events import RequestLease
    from bursar.broker.lease import Lease
    from bursar.broker.pending import Pending, PoolScan


def declared(e: RequestLease) -> float | None:
    """The watts a request declares (``size["power"]``, its power limit); None: the
    default for its size. An elastic request's steps take the default."""
    if e.intent is None and isinstance(e.size, Mapping) and dims.POWER in e.size:
        return float(e.size[dims.POWER])
    return None


def own(eng: Engine, p: Pending, span: float) -> Refusal | None:
    """The campaign's power burst and its bucket of joules over ``span`` (None while
    power is not leased)."""
    budget = eng.watts
    if not budget.leased:
        return None
    watts = budget.watts_of(p.watts, p.size, eng.pool.primary)
    return budget.campaign_refusal(p.campaign, watts, span, eng.now, eng.policy.enforcement)


def holders(
    eng: Engine, p: Pending, plan: paths.Plan, delay: float, behind: reservations.Profile
) -> Refusal | None:
    """The watts of the reservation holders ahead of ``p``: its lease on ``plan`` (with the
    idle draw of the nodes the plan boots), started after ``delay``, must leave them
    whole. The cap itself is the pool side's check (``pool_side.place_check``)."""
    budget = eng.watts
    if budget.cap is None:
        return None
    watts = budget.watts_of(p.watts, p.size, eng.pool.primary)
    boots = budget.boot_watts(eng.pool, eng.placement.boots(plan))
    end = eng.now + delay + p.duration_s
    return budget.holders_refusal(
        eng.pool, p.campaign, watts + boots, eng.now, end, _holders(eng, behind, p.id)
    )


def backfills(eng: Engine, p: Pending, behind: reservations.Profile, scan: PoolScan | None) -> bool:
    """The admission pass's quick look before a full try: may ``p``, started now on the
    warm path, leave the reservation holders' watts whole? (A start delay or a boot only
    makes it harder, so a no here is the full try's no, at a fraction of its cost.)

    A no passes over the requests of ``p``'s pool group that last at least as long, as a
    no from the reservations of nodes does (``PoolScan.refuse_from``): the answer depends
    on the group (its declared watts and demand, the campaign's own unmet power
    guarantee) and the end only, and a later end only overlaps more of the holders'
    windows. A holder is asked on its own (only the holders before it count)."""
    budget = eng.watts
    watts = budget.watts_of(p.watts, p.size, eng.pool.primary)
    refused = budget.holders_refusal(
        eng.pool, p.campaign, watts, eng.now, eng.now + p.duration_s, _holders(eng, behind, p.id)
    )
    if refused is None:
        return True
    key = p.pool_key
    if scan is not None and key is not None and p.id not in behind.reservations:
        scan.refuse_from(key, p.duration_s, behind)
    return False


def renewal(eng: Engine, ls: Lease, new_end: float, behind: reservations.Profile) -> Refusal | None:
    """A renewal's extension in watts: the lease's watts from its old expiry to ``new_end``
    must leave the reservation holders' watts whole (as its nodes must)."""
    budget = eng.watts
    if budget.cap is None:
        return None
    return budget.holders_refusal(
        eng.pool,
        ls.campaign,
        budget.lease_watts(ls.id),
        ls.expires_at,
        new_end,
        _holders(eng, behind, ""),
        ls.id,
    )


def _holders(
    eng: Engine, behind: reservations.Profile, upto: str
) -> list[tuple[str, float, float, float]]:
    """(campaign, start, watts, span) of the reservation holders, in order, up to
    ``upto`` (a holder leaves only the reservations made before its own whole)."""
    out = []
    pending, budget = eng.queue.pending, eng.watts
    for rid, r in behind.reservations.items():
        if rid == upto:
            break
        h = pending.get(rid)
        if h is not None:
            w = budget.watts_of(h.watts, h.size, eng.pool.primary)
            out.append((h.campaign, r.at, w, r.until - r.at))
    return out


def granted(eng: Engine, p: Pending, ls: Lease, inputs: dict[str, Any]) -> None:
    """Count the new lease's watts and charge its joules; while power is leased, its
    decision's inputs say so (with the watts its victims handed over, if any)."""
    budget = eng.watts
    watts = budget.watts_of(p.watts, p.size, eng.pool.primary)
    # The victims it waits for (``ls.claims``: warned for its pieces or for their watts)
    # hand their watts over to it until they end.
    joules = budget.granted(
        ls.id, ls.campaign, watts, eng.now, ls.expires_at, eng.policy.enforcement, ls.claims
    )
    if budget.leased:
        inputs["power"] = {
            "watts": watts,
            "joules": joules,
            "draw_w": budget.draw(eng.pool),
            "cap_w": budget.cap,
        }
        handed = budget.handed_to(ls.id)
        if handed > 0:
            inputs["power"]["handed_w"] = handed
