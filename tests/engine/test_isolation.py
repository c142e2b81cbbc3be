"""Isolation (``isolation.py``): a guarantee served while others burst, the reserve, preemptible leases. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

from conftest import build_engine, gpu_campaign
from engine_support import INTERACTIVE, OPPORTUNISTIC, gpu, kinds, one, req

from bursar.broker import dims
from bursar.broker.decisions import (
    Granted,
    LeasePath,
    PreemptWarned,
    Queued,
)
from bursar.broker.events import (
    CreateCampaign,
    NodeReady,
)
from bursar.broker.lease import LeaseState
from bursar.broker.reasons import Reason


def test_request_within_own_unmet_guarantee_is_served_warm_while_others_burst():
    eng = build_engine(
        campaigns=[
            gpu_campaign("victim", 8, 8, 16, 6000, INTERACTIVE),
            gpu_campaign("storm", 0, 8, 64, None),
        ]
    )
    # 32 warm GPUs, 8 reserved for the victim: the storm gets 24 warm and 8 cold.
    g = one(eng.apply(req(0, "storm", 32, 1000)), Granted)
    assert g.path is LeasePath.COLD
    assert g.inputs["path_split"]["warm"] == {"gpu": 24.0}
    # Storm asks again: nothing warm beyond the reserve, so more cold.
    assert one(eng.apply(req(0.5, "storm", 8, 1000)), Granted).path is LeasePath.COLD
    out = eng.apply(req(1, "victim", 8, 60))
    g = one(out, Granted)
    assert (g.path, g.starts_at) == (LeasePath.WARM, 1)
    assert g.inputs["within_guarantee"] is True
    assert eng.lease(g.lease_id).state is LeaseState.ACTIVE
    assert gpu(eng.reserve) == 0


def test_reserve_on_booting_nodes_is_not_handed_out_by_the_cold_path():
    # 2 nodes x 8 GPUs, both cold; the victim's guarantee is the whole of one node.
    eng = build_engine(nodes=2, warm=0, warm_headroom={})
    out = eng.apply(CreateCampaign(at=0, spec=gpu_campaign("victim", 8, 8, 8)))
    assert kinds(out) == ["CampaignSet", "PoweredOn"]  # node000 boots for the reserve
    eng.apply(CreateCampaign(at=0, spec=gpu_campaign("other", 0, 16, 16)))
    # "other" has no guarantee: at most 16 - 8 = 8 GPUs are ever its to take (more is
    # refused as bad input). It boots the other node for its first 8; its next 8 must not
    # come out of the reserve booting on node000.
    assert one(eng.apply(req(1, "other", 8, 3600)), Granted).path is LeasePath.COLD
    out = eng.apply(req(1, "other", 8, 3600))
    assert not [d for d in out if isinstance(d, Granted)], out
    eng.apply(NodeReady(at=60, node="node000"))
    g = one(eng.apply(req(62, "victim", 8, 60)), Granted)
    assert g.starts_at <= 62 + 30 + 60


def test_part_above_guarantee_must_leave_others_unmet_guarantees():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        campaigns=[gpu_campaign("victim", 8, 8, 16), gpu_campaign("sci", 8, 8, 32)],
    )
    assert gpu(eng.reserve) == 16
    # sci may take its own 8 plus what is left after the victim's 8: 24 in all.
    assert one(eng.apply(req(0, "sci", 24, 100)), Granted).path is LeasePath.WARM
    assert one(eng.apply(req(1, "sci", 8, 100)), Queued).reason is Reason.GUARANTEE_RESERVED
    assert one(eng.apply(req(2, "victim", 8, 100)), Granted).path is LeasePath.WARM


def test_preemptible_requests_leave_reserve_and_headroom_idle():
    eng = build_engine(
        nodes=4,
        warm=4,
        campaigns=[
            gpu_campaign("victim", 8, 8, 16, lease_class=INTERACTIVE),
            gpu_campaign("sci", 0, 8, 32),
            gpu_campaign("bf", 0, 32, 32, None, OPPORTUNISTIC, preemptible=True),
        ],
    )
    # 32 warm: 8 reserve + 8 headroom stay idle for preemptible use.
    assert one(eng.apply(req(0, "bf", 16, 100)), Granted).path is LeasePath.WARM
    q = one(eng.apply(req(1, "bf", 8, 100)), Queued)
    assert q.reason is Reason.GUARANTEE_RESERVED
    assert gpu(eng.pool.totals()[0]) == 16
    # Firm work may use the headroom but not the reserve; beyond that it reclaims.
    assert one(eng.apply(req(2, "sci", 8, 100)), Granted).path is LeasePath.WARM
    out = eng.apply(req(3, "sci", 8, 100))
    assert kinds(out) == ["PreemptWarned", "Granted"] and out[1].path is LeasePath.RECLAIM
    assert one(eng.apply(req(4, "victim", 8, 100)), Granted).path is LeasePath.WARM
    eng.check_invariants()


def test_preemptible_leases_may_fill_a_batch_reserve_and_are_reclaimed_within_grace():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        campaigns=[
            gpu_campaign("sci", 8, 8, 16),  # batch class
            gpu_campaign("bf", 0, 32, 32, None, OPPORTUNISTIC, preemptible=True),
        ],
    )
    # 32 warm, 8 reserved for sci's guarantee: a batch reserve, so backfill may fill it.
    assert one(eng.apply(req(0, "bf", 32, 1000)), Granted).path is LeasePath.WARM
    assert gpu(eng.reserve) == 8 and gpu(eng.ledger.warm_reserve()) == 0
    # sci's request within its guarantee is served by reclaim: within one grace period.
    out = eng.apply(req(10, "sci", 8, 100))
    g = one(out, Granted)
    assert g.path is LeasePath.RECLAIM and g.starts_at - 10 <= eng.policy.grace_s
    assert one(out, PreemptWarned).lease_id == "L1"
    eng.check_invariants()


def test_preemptible_leases_do_not_count_toward_a_guarantee():
    eng = build_engine(
        campaigns=[gpu_campaign("bf", 0, 32, 32, None, OPPORTUNISTIC, preemptible=True)]
    )
    eng.apply(req(0, "bf", 8, 100))
    assert eng.campaigns["bf"].unmet == dims.ZERO
    assert eng.reserve == dims.ZERO
    assert gpu(eng.reclaimable) == 8
    assert eng.price() == 1.0  # preemptible use is not scarcity
