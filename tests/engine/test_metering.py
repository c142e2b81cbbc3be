"""Rate dimensions metered through buckets (``metering.py``). Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import math

import pytest
from conftest import build_engine, gpu_campaign

from bursar.broker import dims
from bursar.broker.decisions import (
    Metered,
)
from bursar.broker.envelope import DimEnvelope
from bursar.broker.events import (
    Meter,
    Tick,
)


def metered(sustained=50, burst=200, bucket=1000):
    return build_engine(
        campaigns=[
            gpu_campaign(
                "m", 0, 8, 8, extra={"inference": DimEnvelope(0, sustained, burst, bucket)}
            )
        ]
    )


@pytest.mark.parametrize(
    ("env", "amounts", "expected"),
    [
        # (sustained, burst, bucket), [(at, amount)], [(granted, wait_s)]
        ((50, 200, 1000), [(0, 100)], [(100, 0.0)]),
        ((50, 200, 1000), [(0, 500)], [(200, 1.5)]),  # burst x window caps it; rest at burst
        ((50, 200, 150), [(0, 180)], [(150, 0.6)]),  # the bucket caps it
        ((50, 200, 1000), [(0, 200)] * 5 + [(0, 100)], [(200, 0.0)] * 5 + [(0, 2.0)]),
        ((50, 200, 1000), [(0, 200)] * 5 + [(2, 200)], [(200, 0.0)] * 5 + [(100, 2.0)]),
        ((50, 200, 1000), [(0, 1000), (100, 1000)], [(200, 4.0), (200, 4.0)]),
        ((0, 200, 100), [(0, 150)], [(100, math.inf)]),  # no sustained rate: never
    ],
)
def test_metering_grants_up_to_bucket_and_burst_and_says_how_long_to_wait(env, amounts, expected):
    eng = metered(*env)
    for (at, amount), (granted, wait) in zip(amounts, expected, strict=True):
        out = eng.apply(Meter(at=at, campaign="m", dim="inference", amount=amount))
        assert len(out) == 1 and isinstance(out[0], Metered)
        m = out[0]
        assert (m.requested, m.granted, m.wait_s) == (amount, granted, wait)


def test_meter_level_refills_at_R_and_is_capped_at_B():
    eng = metered()
    eng.apply(Meter(at=0, campaign="m", dim="inference", amount=200))
    assert eng.bucket_level("m", "inference") == 800
    eng.apply(Tick(at=2))
    assert eng.bucket_level("m", "inference") == 900
    eng.apply(Tick(at=100))
    assert eng.bucket_level("m", "inference") == 1000
    # Metering never touches placed holdings.
    assert eng.campaigns["m"].held == dims.ZERO
