"""Supply signals read off the engine: capacity per path, price, per-campaign buckets."""

from __future__ import annotations

import pytest

from bursar.broker.events import NodeReady, RequestLease
from bursar.broker.policy import Enforcement
from bursar.broker.supply import supply
from tests.conftest import build_engine, gpu_campaign


def _engine(**policy: object):
    return build_engine(
        nodes=8,
        warm=4,
        campaigns=[
            gpu_campaign("g", guarantee=8, sustained=8, burst=32, bucket=10_000),
            gpu_campaign("bf", sustained=64, burst=64, preemptible=True),
        ],
        **policy,
    )


def test_capacity_by_path_and_time_to_n() -> None:
    eng = _engine()
    s = supply(eng)
    gpu = s.dims["gpu"]
    # 4 warm nodes (32 GPUs), 8 reserved for g's unmet guarantee, 4 cold nodes.
    assert (gpu.capacity, gpu.warm_free, gpu.reserve, gpu.available_warm) == (64, 32, 8, 24)
    assert (gpu.reclaimable, gpu.cold) == (0, 32)
    assert s.time_to(24) == {"warm": 0.0, "reclaim": 30, "cold": 60}
    assert s.time_to(40) == {"warm": None, "reclaim": None, "cold": 60}
    assert s.time_to(100) == {"warm": None, "reclaim": None, "cold": None}


def test_reclaimable_counts_active_preemptible_leases_only() -> None:
    eng = _engine()
    eng.apply(RequestLease(1, "bf", {"gpu": 16}, 600))  # warm: 24 - 8 headroom = 16
    assert supply(eng).dims["gpu"].reclaimable == 16
    eng.apply(RequestLease(2, "bf", {"gpu": 16}, 600))  # cold: starting, not reclaimable
    assert supply(eng).dims["gpu"].reclaimable == 16
    for n in ("node004", "node005"):
        eng.apply(NodeReady(62, n))
    assert supply(eng).dims["gpu"].reclaimable == 32


def test_campaign_signals() -> None:
    eng = _engine()
    eng.apply(RequestLease(0, "g", {"gpu": 16}, 100))
    c = supply(eng).campaigns["g"]
    assert c.held == {"gpu": 16}
    assert c.headroom_to_burst == {"gpu": 16}
    assert c.unmet_guarantee == {}
    assert c.bucket["gpu"] == pytest.approx(10_000 - 8 * 100)  # 8 above R, prepaid
    assert c.time_to_empty_s == {"gpu": None}  # prepaid buckets do not drain
    assert supply(eng).campaigns["bf"].bucket == {"gpu": None}  # unlimited


def test_time_to_empty_under_grant_instant() -> None:
    eng = _engine(enforcement=Enforcement.GRANT_INSTANT)
    eng.apply(RequestLease(0, "g", {"gpu": 16}, 100))
    assert supply(eng).campaigns["g"].time_to_empty_s["gpu"] == pytest.approx(10_000 / 8)


def test_price_rises_with_pressure() -> None:
    eng = _engine()
    p0 = supply(eng).price
    eng.apply(RequestLease(0, "g", {"gpu": 32}, 100))
    assert supply(eng).price > p0 == pytest.approx(1.0)


def test_time_to_counts_the_askers_own_unmet_guarantee() -> None:
    eng = _engine()
    s = supply(eng)
    # 24 GPUs warm beyond the reserve; g's own 8-GPU unmet guarantee is warm for g only.
    assert s.time_to(32)["warm"] is None
    assert s.time_to(32, campaign="g")["warm"] == 0.0
    assert s.time_to(32, campaign="bf")["warm"] is None
