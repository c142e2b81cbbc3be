"""Choosing the path that serves a grant: warm, then reclaim, then cold.

``plan`` is pure: it splits a request into the part served from warm capacity, the part
taken over from preemptible leases after the grace period, and the part placed on
booting or cold nodes, on pool-wide aggregates only. Aggregate fit is necessary for a
placement, not sufficient: ``placement.Placement.plan`` runs this as the cheap first
filter, then chooses the node pieces of each part (the ``Plan``'s piece fields), and the
engine commits that plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bursar.broker import dims
from bursar.broker.decisions import LeasePath
from bursar.broker.shape import Demand


@dataclass(frozen=True, slots=True)
class Plan:
    path: LeasePath
    warm: dims.Vec
    reclaim: dims.Vec
    cold: dims.Vec
    warm_pieces: dict[int, dims.Vec] = field(default_factory=dict)
    """Node index → the warm piece there (empty on an aggregate-only plan)."""
    claims: tuple[tuple[str, int, dims.Vec], ...] = ()
    """(victim lease, node index, the part of the victim's piece there taken over)."""
    cold_pieces: dict[int, dims.Vec] = field(default_factory=dict)
    """Node index → the piece on a booting node, or on a cold node booted for it."""
    later: Demand | None = None
    """Set on a plan whose aggregate split is already exact (a one-dimensional request,
    which any split serves): its pieces are chosen when it is placed, for this demand."""
    watt_victims: tuple[str, ...] = ()
    """Preemptible leases warned for their watts alone, where the facility's power cap
    binds: none of their pieces is taken over, but the lease starts only once they end."""


def plan(
    size: dims.Vec,
    warm_limit: dims.Vec,
    reclaimable: dims.Vec,
    cold_avail: dims.Vec,
    preemptible: bool,
    reclaim_first: bool = False,
) -> Plan | None:
    """The cheapest path that can serve ``size``, or None. Preemptible requests never reclaim.
    ``reclaim_first``: the requester's own reserve is lent to preemptible leases, so it
    takes that back (reclaim, then cold for the rest) rather than booting around it."""
    warm_avail = dims.vmax0(warm_limit)
    if dims.fits(size, warm_avail):
        return Plan(LeasePath.WARM, size, dims.ZERO, dims.ZERO)
    warm = dims.vmin(size, warm_avail)
    need = dims.vmax0(dims.sub(size, warm))
    if not preemptible and dims.fits(need, reclaimable):
        return Plan(LeasePath.RECLAIM, warm, need, dims.ZERO)
    if dims.fits(need, cold_avail) and not (reclaim_first and not dims.is_zero(reclaimable)):
        return Plan(LeasePath.COLD, warm, dims.ZERO, need)
    if not preemptible and dims.fits(need, dims.add(reclaimable, cold_avail)):
        reclaim = dims.vmin(need, reclaimable)
        return Plan(LeasePath.COLD, warm, reclaim, dims.vmax0(dims.sub(need, reclaim)))
    return None
