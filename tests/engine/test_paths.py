"""The serving paths (``paths.py``): warm, reclaim and cold, the prepaid start delay, keep-warm, the cheapest plan first. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import pytest
from conftest import build_engine, gpu_campaign
from engine_support import INTERACTIVE, gpu, kinds, one, reclaim_setup, req

from bursar.broker import paths
from bursar.broker.decisions import (
    Granted,
    LeasePath,
)
from bursar.broker.events import (
    NodeReady,
    Tick,
)
from bursar.broker.lease import LeaseState


def test_warm_path_is_active_at_once():
    eng = build_engine(campaigns=[gpu_campaign("victim", 8, 8, 16, 6000, INTERACTIVE)])
    out = eng.apply(req(1, "victim", 8, 60))
    assert kinds(out) == ["Granted"]
    g = out[0]
    assert (g.lease_id, g.path, g.starts_at, g.expires_at) == ("L1", LeasePath.WARM, 1, 61)
    assert g.nodes == ("node000",)
    assert g.tokens == 0.0
    assert eng.lease("L1").state is LeaseState.ACTIVE
    assert gpu(eng.campaigns["victim"].held) == 8
    eng.check_invariants()


def test_reclaim_path_warns_then_revokes_and_activates_at_the_deadline():
    eng = reclaim_setup()
    # sci may use warm beyond the victim's reserve (64 - 48 - 8 = 8), the rest is reclaimed.
    out = eng.apply(req(10, "sci", 24, 100))
    assert kinds(out) == ["PreemptWarned", "Granted"]
    w, g = out
    assert (w.lease_id, w.campaign, w.deadline, w.for_request) == ("L1", "bf", 40, "L2")
    assert g.path is LeasePath.RECLAIM
    assert (g.starts_at, g.expires_at) == (40, 140)
    assert g.inputs["path_split"] == {"warm": {"gpu": 8.0}, "reclaim": {"gpu": 16.0}, "cold": {}}
    # above R = 24 - 8 = 16 GPUs, prepaid for the whole span (grace + duration).
    assert g.tokens == 16 * 130
    assert eng.lease("L2").state is LeaseState.STARTING
    assert eng.lease("L1").state is LeaseState.PREEMPTING
    assert eng.lease("L1").preempt_deadline == 40
    assert gpu(eng.reclaimable) == 0
    assert eng.next_timer() == 40
    eng.check_invariants()

    assert eng.apply(Tick(at=39.5)) == []
    out = eng.apply(Tick(at=40))
    assert kinds(out) == ["Revoked", "Activated"]
    r, a = out
    assert (r.at, r.lease_id, r.cause) == (40, "L1", "reclaimed")
    bf_grant_credits = 48 * 1.0 * 1000 / 3600  # price 1 at zero pressure
    assert r.refund_credits == pytest.approx(bf_grant_credits * 960 / 1000, rel=1e-12)
    assert (a.at, a.lease_id) == (40, "L2")
    assert eng.lease("L2").state is LeaseState.ACTIVE
    assert "L1" not in eng.leases and eng.ended["L1"].state is LeaseState.REVOKED
    assert gpu(eng.campaigns["bf"].held) == 0
    eng.check_invariants()


def test_cold_path_powers_on_and_activates_when_the_nodes_are_ready():
    eng = build_engine(warm_headroom={}, campaigns=[gpu_campaign("sci", 0, 8, 64, None)])
    out = eng.apply(req(5, "sci", 48, 100))
    assert kinds(out) == ["PoweredOn", "Granted"]
    p, g = out
    assert p.nodes == ("node004", "node005") and p.ready_by == 65
    assert g.path is LeasePath.COLD
    assert (g.starts_at, g.expires_at) == (65, 165)
    assert g.nodes == tuple(f"node00{i}" for i in range(6))
    assert eng.lease("L1").state is LeaseState.STARTING
    eng.check_invariants()
    # The engine does not boot nodes itself: only NodeReady activates the lease.
    assert eng.apply(Tick(at=70)) == []
    assert eng.lease("L1").state is LeaseState.STARTING
    assert eng.apply(NodeReady(at=70, node="node004")) == []
    out = eng.apply(NodeReady(at=71, node="node005"))
    assert kinds(out) == ["Activated"]
    assert (out[0].at, out[0].lease_id) == (71, "L1")
    assert eng.lease("L1").state is LeaseState.ACTIVE
    eng.check_invariants()


def test_cold_path_start_delay_is_prepaid():
    eng = build_engine(warm_headroom={}, campaigns=[gpu_campaign("sci", 0, 8, 64, 100_000)])
    g = one(eng.apply(req(5, "sci", 48, 100)), Granted)
    assert g.tokens == (48 - 8) * (60 + 100)
    assert eng.bucket_level("sci", "gpu") == 100_000 - 40 * 160


def test_keep_warm_boots_for_reserve_plus_headroom():
    # 4 warm nodes (32 GPUs); a 24-GPU warm grant leaves 8 < reserve 8 + headroom 8.
    eng = build_engine(
        campaigns=[gpu_campaign("victim", 8, 8, 16, None), gpu_campaign("a", 0, 0, 64)]
    )
    out = eng.apply(req(1, "a", 24, 100))
    assert kinds(out) == ["Granted", "PoweredOn"]
    assert out[1].nodes == ("node004",) and out[1].ready_by == 61


@pytest.mark.parametrize(
    ("size", "warm", "reclaimable", "cold", "preemptible", "expected"),
    [
        (8, 8, 0, 0, False, (LeasePath.WARM, 8, 0, 0)),
        (8, 16, 8, 8, False, (LeasePath.WARM, 8, 0, 0)),
        (16, 8, 8, 8, False, (LeasePath.RECLAIM, 8, 8, 0)),
        (16, 8, 4, 8, False, (LeasePath.COLD, 8, 0, 8)),
        (16, 8, 4, 4, False, (LeasePath.COLD, 8, 4, 4)),
        (16, 8, 8, 8, True, (LeasePath.COLD, 8, 0, 8)),  # preemptible requests never reclaim
        (16, -4, 16, 0, False, (LeasePath.RECLAIM, 0, 16, 0)),  # a short reserve: nothing warm
        (16, 8, 4, 3, False, None),
        (16, 8, 8, 0, True, None),
    ],
)
def test_path_plan_cheapest_first(size, warm, reclaimable, cold, preemptible, expected):
    v = lambda x: (float(x), 0.0, 0.0)  # noqa: E731
    plan = paths.plan(v(size), v(warm), v(reclaimable), v(cold), preemptible)
    if expected is None:
        assert plan is None
    else:
        assert (plan.path, plan.warm[0], plan.reclaim[0], plan.cold[0]) == expected
