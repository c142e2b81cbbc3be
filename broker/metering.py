"""Metered rate dimensions (``fs_bw``, ``inference``): throttle at the source.

A client asks to consume N unit-seconds (MB of I/O, inference tokens). It is granted
at once what its bucket holds, up to ``burst * meter_window_s`` (the burst ceiling on
the rate), and told how long to wait for the rest at its sustained rate R: the rest
is not reserved, the client asks again after the wait. A bucket refills at R and is
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
        wait = 0.0
    elif env.sustained > 0:
        wait = rest / min(env.sustained, env.burst) if env.burst > 0 else math.inf
    else:
        wait = math.inf
    return MeterOutcome(granted, wait, level)
