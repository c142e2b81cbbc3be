"""The admission rule: who is considered first, and what a campaign may take.

Order. Pending requests are considered by (class rank, highest first; fair-share
deficit, largest first; arrival sequence). A campaign's deficit is
``1 - max_d(held_d / R_d)`` over the placed dimensions with a sustained rate R_d > 0:
a campaign holding nothing has deficit 1, one at its sustained rate 0, one above it
negative. Within one campaign and class, requests are served first come, first served.

Per-campaign checks, in this order (the first that fails is the reason):

1. burst: held + size <= burst in every dimension, else ``ABOVE_BURST``;
2. bucket: under prepaid enforcement the above-R part of the lease times its whole span
   (duration plus any start delay) must be covered by the bucket level, else
   ``BUCKET_EMPTY``; under grant-instant enforcement the level must only be above 0.

Pool checks (isolation, then path) live in ``isolation.py`` and ``paths.py``.

Head of line. A request that fails for pool reasons does not block the requests behind
it: they may be granted past it (skip-ahead). Once it has waited ``hol_patience_s``
(300 s by default) it becomes *aged*, and from then on no request after it in the order
may take pool capacity (they queue with ``HEAD_OF_LINE``) until it is granted, except
requests that fit entirely inside their own campaign's unmet guarantee, which draw on
their own reserve. Leases have bounded durations, so the aged head is served within its
patience plus the longest running lease; a small request waits behind a large one at
most that long, never forever.
"""

from __future__ import annotations

from collections.abc import Mapping

from bursar.broker import dims
from bursar.broker.bucket import Bucket, above_rate
from bursar.broker.policy import Enforcement
from bursar.broker.reasons import Reason

POOL_REASONS = frozenset({Reason.POOL_FULL, Reason.GUARANTEE_RESERVED, Reason.HEAD_OF_LINE})


def deficit(held: dims.Vec, sustained: dims.Vec) -> float:
    ratios = [h / r for h, r in zip(held, sustained, strict=True) if r > 0]
    return 1.0 - (max(ratios) if ratios else 0.0)


def order_key(rank: int, deficit_: float, seq: int) -> tuple[int, float, int]:
    return (-rank, -deficit_, seq)


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
