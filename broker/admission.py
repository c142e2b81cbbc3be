"""The admission rule: who is considered first, and what a campaign may take.

Order. Pending requests are considered by (class rank, highest first; fair-share usage,
lowest first; arrival sequence). The fair-share factor is Slurm's multifactor one,
``F = 2^(-U/S)``: ``U`` is the campaign's share of the pool's decayed usage and ``S`` its
share of the sustained rates. Usage decays with a half-life ``h``
(``PolicySpec.fairshare_half_life_s``, 7 days by default): a lease of size ``s`` held over
[t1, t2] adds ``integral of w(s) 2^(-(now - t)/h) dt`` with ``w(s) = max_d s_d / R_d``
over the dimensions with a sustained rate ``R_d > 0`` (the lease in multiples of the
campaign's own rate, in its dominant dimension). Since the pool-wide sums are common to
every campaign, ordering by F is ordering by ``u = U_c / R_c``, the campaign's decayed
usage in seconds at its sustained rate, lowest first; a campaign with no sustained rate
has share 0 and comes last. Usage is counted for a lease's whole term when it is granted
or renewed and given back for the part not used when it ends early (as tokens are), so
the order changes only at those events. With the half-life set to None the order is
(class, arrival).

Per-campaign checks, in this order (the first that fails is the reason):

1. burst: held + size <= burst in every dimension, else ``ABOVE_BURST``; a burst at least
   the pool's capacity in a dimension is not checked there (``CampaignState.burst_bound``):
   whatever the pool can give beside what the campaign holds is within it, so such a
   request waits for the pool, ages and keeps its turn among its campaign's requests;
2. bucket: under prepaid enforcement the above-R part of the lease times its whole span
   (duration plus any start delay) must be covered by the bucket level, else
   ``BUCKET_EMPTY``; under grant-instant enforcement the level must only be above 0.

Pool checks (isolation, then path) live in ``isolation.py`` and ``paths.py``.

Head of line. A request that fails for pool reasons does not block the requests behind
it: they may be granted past it (skip-ahead). Once it has waited ``hol_patience_s``
(300 s by default) it becomes *aged*, and the first aged requests hold reservations
(``reservations.py``): a request behind them (lower class, or the same class and
younger) is granted only if it leaves every reservation whole, else it queues with
``HEAD_OF_LINE``; requests that fit entirely inside their own campaign's unmet guarantee
draw on their own reserve and are exempt. Leases have bounded durations and a renewal that
would push a reservation later is refused, so an aged request is served by its
reservation.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bursar.broker import dims
from bursar.broker.bucket import Bucket, above_rate
from bursar.broker.policy import Enforcement
from bursar.broker.reasons import Reason

POOL_REASONS = frozenset({Reason.POOL_FULL, Reason.GUARANTEE_RESERVED, Reason.HEAD_OF_LINE})


class Side(enum.Enum):
    """Which side of the checks refused: the campaign's own limits (burst, bucket), the
    pool (isolation, paths) or the reservations (head of line)."""

    CAMPAIGN = "campaign"
    POOL = "pool"
    RESERVATIONS = "reservations"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request or a renewal may not be granted now: the reason, the details that go
    into its decision's inputs, and which side refused (a pool refusal holds for every
    request of its pool group until the next grant; the others do not)."""

    reason: Reason
    details: dict[str, Any] = field(default_factory=dict)
    side: Side = Side.CAMPAIGN


def burst_refusal(held: dims.Vec, size: dims.Vec, burst: dims.Vec) -> Refusal | None:
    """Check 1 (burst) for a request, or a renewal (``held``: the campaign's other holdings)."""
    return Refusal(Reason.ABOVE_BURST) if over_burst(held, size, burst) else None


def reservations_refusal(starts: Iterable[float]) -> Refusal:
    """Refused for the reservations (``starts``: when each begins): wait for the first."""
    first = min(starts)
    return Refusal(Reason.HEAD_OF_LINE, {"reserved_from": first}, Side.RESERVATIONS)


def bucket_refusal(short: dict[str, dict[str, float]]) -> Refusal | None:
    """Check 2 (bucket), given ``bucket_short`` over the span checked: a request's whole
    span (with its start delay once its path is known), a renewal's extension."""
    return Refusal(Reason.BUCKET_EMPTY, {"bucket_short": short}) if short else None


def retry_after(min_retry_s: float, wait: float) -> float:
    """The retry-after a refusal carries: the wait expected, never under the policy's
    ``min_retry_s`` (a client told to retry at once would spin). The one place the floor
    is applied."""
    return max(min_retry_s, wait)


def usage_weight(size: dims.Vec, sustained: dims.Vec) -> float:
    """A lease's weight in its campaign's fair-share usage: its size in multiples of the
    campaign's sustained rate, in the dominant dimension (0 where no rate is set)."""
    return max((s / r for s, r in zip(size, sustained, strict=True) if r > 0), default=0.0)


def has_share(sustained: dims.Vec) -> bool:
    return any(r > 0 for r in sustained)


def order_key(rank: int, usage: float, seq: int) -> tuple[int, float, int]:
    return (-rank, usage, seq)


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
