"""The isolation rule.

Capacity equal to the sum of all campaigns' unmet guarantees, max(0, guarantee - held)
summed, is kept warm. A request may use:

* its own unmet guarantee, always (that part of the reserve is its own);
* beyond that, only warm capacity left after the *other* campaigns' unmet guarantees
  are set aside, then reclaimable (preemptible) capacity, then cold nodes.

Preemptible requests never count toward anyone's guarantee and must also leave the
pool's warm headroom idle: they may use warm capacity beyond reserve + headroom only.
"""

from __future__ import annotations

from bursar.broker import dims


def unmet(guarantee: dims.Vec, held: dims.Vec) -> dims.Vec:
    return dims.vmax0(dims.sub(guarantee, held))


def warm_limit(
    on_free: dims.Vec,
    reserve_total: dims.Vec,
    own_unmet: dims.Vec,
    headroom: dims.Vec,
    preemptible: bool,
) -> dims.Vec:
    """Warm capacity this request may take now (may be negative while a reserve is short)."""
    if preemptible:
        return dims.sub(dims.sub(on_free, reserve_total), headroom)
    return dims.sub(on_free, dims.vmax0(dims.sub(reserve_total, own_unmet)))


def within_own_guarantee(size: dims.Vec, own_unmet: dims.Vec) -> bool:
    """A request entirely inside its campaign's unmet guarantee: served from its own reserve."""
    return dims.fits(size, own_unmet)
