"""The congestion price (``price.py``). Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import math

import pytest
from conftest import build_engine, gpu_campaign
from engine_support import one, req

from bursar.broker import dims
from bursar.broker.decisions import (
    Granted,
    Queued,
    Renewed,
)
from bursar.broker.envelope import DimEnvelope
from bursar.broker.events import (
    Renew,
    RequestLease,
)
from bursar.broker.reasons import Reason


@pytest.mark.parametrize(
    ("held", "queued", "pressure"),
    [(0, 0, 0.0), (16, 0, 0.25), (32, 0, 0.5), (64, 0, 1.0), (64, 32, 1.5)],
)
def test_congestion_price_rises_with_pressure(held, queued, pressure):
    eng = build_engine(
        warm=8,
        warm_headroom={},
        price_base=2.0,
        price_k=3.0,
        campaigns=[gpu_campaign("a", 0, 64, 64), gpu_campaign("b", 0, 64, 64)],
    )
    if held:
        eng.apply(req(0, "a", held, 100))
    if queued:
        assert one(eng.apply(req(0, "b", queued, 100)), Queued)
    assert eng.pressure() == pressure
    assert eng.price() == 2.0 * math.exp(3.0 * pressure)


def test_price_is_base_at_zero_pressure_and_includes_the_new_lease():
    eng = build_engine(price_base=3.0, campaigns=[gpu_campaign("a", 0, 64, 64)])
    assert eng.price() == 3.0
    # Priced at the pressure with itself counted, as a renewal is: 16 of 64.
    g = one(eng.apply(req(0, "a", 16, 3600)), Granted)
    assert g.price == pytest.approx(3.0 * math.exp(2.0 * 16 / 64), rel=1e-12)
    assert g.credits == pytest.approx(g.price * 16, rel=1e-12)  # price x units x hours
    assert eng.price() == pytest.approx(g.price, rel=1e-12)
    r = one(eng.apply(Renew(at=10, lease_id="L1", duration_s=3600)), Renewed)
    assert r.inputs["price"] == pytest.approx(g.price, rel=1e-12)
    g2 = one(eng.apply(req(20, "a", 16, 1800)), Granted)
    assert g2.price == pytest.approx(3.0 * math.exp(2.0 * 32 / 64), rel=1e-12)


def test_demand_waiting_on_its_own_bucket_is_not_congestion():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 64, 800), gpu_campaign("b", 0, 64, 64)])
    eng.apply(req(0, "a", 16, 100))  # bucket 0 now
    assert one(eng.apply(req(1, "a", 8, 10)), Queued).reason is Reason.BUCKET_EMPTY
    assert eng.ledger.queued_demand == dims.ZERO
    idle = eng.price()
    eng.apply(req(2, "b", 60, 100))  # 32 free of 64 after a's 16 (default pool)
    assert eng.price() >= idle


def test_price_counts_dominant_share_for_multi_dimensional_leases():
    eng = build_engine(
        campaigns=[
            gpu_campaign("a", 0, 64, 64, extra={"cpu": DimEnvelope(0, 512, 512, None)}),
        ]
    )
    g = one(
        eng.apply(RequestLease(at=0, campaign="a", size={"gpu": 4, "cpu": 256}, duration_s=3600)),
        Granted,
    )
    # cpu share 256/512 = 1/2 of the pool -> charged as 32 GPUs (four GPUs: each piece is
    # a GPU with 64 cores, the most one node has); the pressure is read in the primary
    # dimension (4 GPUs of 64, the lease itself).
    assert g.price == pytest.approx(math.exp(2.0 * 4 / 64), rel=1e-12)
    assert g.credits == pytest.approx(32.0 * g.price, rel=1e-12)
