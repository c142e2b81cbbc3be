"""The isolation rule.

Capacity equal to the sum of all campaigns' unmet guarantees, max(0, guarantee - held)
summed, is kept warm. A request may use:

* its own unmet guarantee, always (that part of the reserve is its own);
* beyond that, only warm capacity left after the *other* campaigns' unmet guarantees
  are set aside, then reclaimable (preemptible) capacity, then cold nodes.

Preemptible requests never count toward anyone's guarantee and must also leave the
pool's warm headroom idle: they may use warm capacity beyond the interactive campaigns'
reserve + headroom only. They may fill the part of the reserve owed to batch-class
campaigns, because it is reclaimed from them within one grace period: a batch request
within its own guarantee is then served within ``grace_s`` on the reclaim path. The bound
is ``grace_s`` plus the boot latency when the lease backing it is already draining for
another request (a warned lease's remainder is not reclaimable again; the request then
waits for it, or boots). They never fill an interactive campaign's reserve: that would need an instant
reclaim, and a preemptible lease's unused remainder is neither free nor reclaimable.

Lending a reserve only to preemptible leases is what keeps it safe to lend: it comes
back within a grace period whatever happens. Handing an idle reserve to firm work instead
(say, while its own campaign's queued request is too big for it) breaks the *other*
campaigns' isolation when it is owed again: it is then restored out of their free warm
capacity, not out of reclaimable capacity.
"""

from __future__ import annotations

from collections.abc import Iterable

from bursar.broker import dims
from bursar.broker.envelope import CampaignSpec, LeaseClass


def unmet(guarantee: dims.Vec, held: dims.Vec) -> dims.Vec:
    return dims.vmax0(dims.sub(guarantee, held))


def warm_limit(
    on_free: dims.Vec,
    reserve_total: dims.Vec,
    own_unmet: dims.Vec,
    headroom: dims.Vec,
    preemptible: bool,
    batch_reserve: dims.Vec = dims.ZERO,
) -> dims.Vec:
    """Warm capacity this request may take now (may be negative while a reserve is short)."""
    if preemptible:
        return dims.sub(dims.sub(on_free, dims.sub(reserve_total, batch_reserve)), headroom)
    return dims.sub(on_free, dims.vmax0(dims.sub(reserve_total, own_unmet)))


def within_own_guarantee(size: dims.Vec, own_unmet: dims.Vec) -> bool:
    """A request entirely inside its campaign's unmet guarantee: served from its own reserve."""
    return dims.fits(size, own_unmet)


def kept(specs: Iterable[CampaignSpec]) -> tuple[dims.Vec, dims.Vec]:
    """The guarantees summed: every campaign's, and the interactive campaigns' alone (what
    ``ceiling`` keeps a request off, before taking its own campaign's out)."""
    every = interactive = dims.ZERO
    for s in specs:
        g = s.placed("guarantee")
        every = dims.add(every, g)
        if s.lease_class is LeaseClass.INTERACTIVE:
            interactive = dims.add(interactive, g)
    return every, interactive


def ceiling(own: CampaignSpec, totals: tuple[dims.Vec, dims.Vec], capacity: dims.Vec) -> dims.Vec:
    """The most of the pool one request of campaign ``own`` can ever be granted beside the
    other campaigns' guarantees, whatever they hold: their reserve plus their holdings never
    drop below their guarantees. A firm request keeps off every other guarantee; a
    preemptible one only off the interactive campaigns' (it may fill batch reserves; it has
    no guarantee of its own). ``totals``: ``kept`` over every campaign, ``own`` included. A
    request above it would wait for good, so it is refused at once."""
    every, interactive = totals
    if own.preemptible:
        others = interactive
    else:
        others = dims.vmax0(dims.sub(every, own.placed("guarantee")))
    return dims.vmax0(dims.sub(capacity, others))
