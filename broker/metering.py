"""Metered rate dimensions (``fs_bw``, ``inference``): throttle at the source.

A client asks to consume N unit-seconds (MB of I/O, inference tokens). It is granted
at once what its bucket holds, up to ``burst * meter_window_s`` (the burst ceiling on
the rate), and told how long the rest will take: at most the burst rate, and for what
the bucket cannot cover, the sustained rate R at which it refills. The rest is not
reserved; the client asks again (a piece at a time, or after the wait). A bucket refills at R and is
capped at B, exactly like the placed dimensions' buckets with nothing held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bursar.broker.bucket import Bucket
from bursar.broker.envelope import DimEnvelope


@dataclass(frozen=True, slots=True)
class MeterOutcome:
    granted: float
    wait_s: float
    level_before: float


def meter(bucket: Bucket, env: DimEnvelope, amount: float, window_s: float) -> MeterOutcome:
    """Pure: how much of ``amount`` may be used now (the caller takes it from the bucket)."""
    level = bucket.level
    cap = env.burst * window_s
    granted = min(amount, cap, level)
    rest = amount - granted
    if rest <= 1e-12:
        return MeterOutcome(granted, 0.0, level)
    # The rest flows at most at the burst rate, and beyond what is left in the bucket only
    # as fast as it refills (R): the wait is the slower of the two.
    left = level - granted
    by_burst = rest / env.burst if env.burst > 0 else math.inf
    short = max(0.0, rest - left)
    by_bucket = 0.0
    if short > 1e-12:
        by_bucket = short / env.sustained if env.sustained > 0 else math.inf
    return MeterOutcome(granted, max(by_burst, by_bucket), level)
