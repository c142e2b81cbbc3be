"""The admission pass's rules, one unit test each: the order requests are considered in,
the checks a request and a renewal go through (``admission.py``: burst, bucket, the
typed ``Refusal`` and the retry-after floor), and head of line (aged requests' reservations
and backfill behind them). Exact values throughout: the engine is pure arithmetic."""

from __future__ import annotations

import math

import pytest
from conftest import build_engine, gpu_campaign
from engine_support import INTERACTIVE, OPPORTUNISTIC, _pool_full, gpu, kinds, one, req

from bursar.broker import admission
from bursar.broker.bucket import Bucket
from bursar.broker.decisions import (
    Granted,
    LeasePath,
    PreemptWarned,
    Queued,
    Rejected,
    Renewed,
)
from bursar.broker.envelope import DimEnvelope, LeaseClass
from bursar.broker.events import (
    CreateCampaign,
    Release,
    Renew,
    RequestLease,
    Tick,
)
from bursar.broker.policy import Enforcement
from bursar.broker.reasons import Reason


def test_the_retry_after_floor_is_the_policys_minimum():
    assert admission.retry_after(1.0, 0.2) == 1.0
    assert admission.retry_after(1.0, 30.0) == 30.0


def test_a_refusal_says_which_side_refused():
    assert admission.burst_refusal((4.0, 0.0, 0.0), (5.0, 0.0, 0.0), (8.0, 64.0, 512.0)) == (
        admission.Refusal(Reason.ABOVE_BURST, {}, admission.Side.CAMPAIGN)
    )
    assert admission.burst_refusal((3.0, 0.0, 0.0), (5.0, 0.0, 0.0), (8.0, 64.0, 512.0)) is None
    held = admission.reservations_refusal([300.0, 120.0])
    assert held == admission.Refusal(
        Reason.HEAD_OF_LINE, {"reserved_from": 120.0}, admission.Side.RESERVATIONS
    )


def test_a_bucket_refusal_carries_what_the_bucket_is_short_of():
    buckets = {"gpu": Bucket.full(100.0, 2.0, 0.0)}
    need = admission.token_need((0.0, 0.0, 0.0), (4.0, 0.0, 0.0), (2.0, 0.0, 0.0))
    assert need == (2.0, 0.0, 0.0)
    short = admission.bucket_short(buckets, (0.0, 0.0, 0.0), need, 60.0, 0.0, Enforcement.PREPAID)
    refused = admission.bucket_refusal(short)
    assert refused is not None and refused.reason is Reason.BUCKET_EMPTY
    assert refused.details == {"bucket_short": {"gpu": {"level": 100.0, "need": 120.0}}}
    assert refused.side is admission.Side.CAMPAIGN
    fits = admission.bucket_short(buckets, (0.0, 0.0, 0.0), need, 50.0, 0.0, Enforcement.PREPAID)
    assert admission.bucket_refusal(fits) is None


# --------------------------------------------------------------------------- admission order


def test_admission_order_class_then_fair_share_then_arrival():
    # 5 nodes x 8 GPUs, all warm; a firm filler holds 4 x 8 and "b" holds 8 (it has usage).
    eng = build_engine(
        nodes=5,
        warm=5,
        warm_headroom={},
        campaigns=[
            gpu_campaign("filler", 0, 64, 64),
            gpu_campaign("b", 0, 8, 64),
            gpu_campaign("a", 0, 8, 64),
            gpu_campaign("a2", 0, 8, 64),
            gpu_campaign("c", 0, 8, 64, lease_class=INTERACTIVE),
        ],
    )
    for _ in range(4):
        eng.apply(req(0, "filler", 8, 1000))  # L1..L4
    eng.apply(req(0, "b", 8, 1000))  # L5
    for at, name in [(1, "b"), (2, "a"), (3, "c"), (4, "a2")]:  # L6..L9
        assert one(eng.apply(req(at, name, 8, 1000)), Queued).reason is Reason.POOL_FULL
    assert [p.id for p in eng.queued()] == ["L8", "L7", "L9", "L6"]
    granted = []
    for i, at in enumerate([10, 11, 12, 13]):
        out = eng.apply(Release(at=at, lease_id=f"L{i + 1}"))
        granted.append(one(out, Granted).lease_id)
    # c (interactive) first; a and a2 tie with no usage (arrival decides); b has used some.
    assert granted == ["L8", "L7", "L9", "L6"]


@pytest.mark.parametrize("half_life", [100.0, None])
def test_fair_share_usage_decays_with_its_half_life(half_life):
    eng = build_engine(
        nodes=2,
        warm=2,
        warm_headroom={},
        fairshare_half_life_s=half_life,
        campaigns=[
            gpu_campaign("f", 0, 16, 16),
            gpu_campaign("x", 0, 8, 8),
            gpu_campaign("y", 0, 8, 8),
        ],
    )
    eng.apply(req(0, "x", 8, 10))  # x: 80 GPU-s long ago
    eng.apply(req(500, "y", 8, 5))  # y: 40 GPU-s recently
    eng.apply(req(550, "f", 8, 50))  # L3, until 600
    eng.apply(req(550, "f", 8, 150))  # L4, until 700
    assert one(eng.apply(req(560, "y", 8, 100)), Queued)  # L5
    assert one(eng.apply(req(561, "x", 8, 100)), Queued)  # L6
    x, y = eng.campaigns["x"], eng.campaigns["y"]
    if half_life is None:
        assert eng.ledger.decayed_usage(x, 561) == 0.0
        expect = "L5"  # arrival order
    else:
        # In seconds at the sustained rate (8): 10 s decayed 5.5 half-lives, 5 s 0.56.
        assert eng.ledger.decayed_usage(x, 561) == pytest.approx(
            10 * 2 ** (-551 / 100) * (100 / 10 / math.log(2)) * (1 - 2 ** (-10 / 100)), rel=1e-6
        )
        assert eng.ledger.decayed_usage(x, 561) < eng.ledger.decayed_usage(y, 561)
        expect = "L6"  # x has had less of the pool lately
    assert one(eng.apply(Tick(at=600)), Granted).lease_id == expect


def test_within_a_campaign_first_come_first_served_while_the_head_waits_on_its_limits():
    eng = build_engine(nodes=4, warm=4, warm_headroom={}, campaigns=[gpu_campaign("b", 0, 8, 16)])
    eng.apply(req(0, "b", 8, 100))  # L1
    assert one(eng.apply(req(1, "b", 16, 100)), Queued).reason is Reason.ABOVE_BURST  # L2
    q = one(eng.apply(req(2, "b", 8, 100)), Queued)  # L3 would fit its burst: waits behind L2
    assert (q.reason, q.inputs["behind"]) == (Reason.ABOVE_BURST, "L2")
    out = eng.apply(Tick(at=100))
    assert kinds(out) == ["Expired", "Granted"]
    assert out[1].lease_id == "L2"
    assert one(eng.apply(Release(at=101, lease_id="L2")), Granted).lease_id == "L3"


def test_a_head_blocked_by_the_pool_does_not_hold_its_campaign_back():
    eng, at, name, _, _ = _pool_full()  # a holds 32 of 32 until 100
    eng.apply(Release(at=at, lease_id="L1"))
    eng.apply(req(at, "a", 24, 1000))  # L2: 8 left
    assert one(eng.apply(req(at, name, 16, 100)), Queued).reason is Reason.POOL_FULL  # L3
    g = one(eng.apply(req(at, name, 8, 100)), Granted)  # L4 passes its own campaign's L3
    assert g.lease_id == "L4"
    out = eng.apply(Release(at=50, lease_id="L2"))
    assert [d.lease_id for d in out if isinstance(d, Granted)] == ["L3"]


# --------------------------------------------------------------------------- head of line


def hol_setup(big: float = 32, more: tuple[str, ...] = ()):
    """64 warm GPUs; a firm filler holds 40; "guarded" has an unmet guarantee of 8; "big"
    queues ``big`` GPUs behind the filler (L2). ``more``: other campaigns like "small"."""
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[
            gpu_campaign("filler", 0, 64, 64),
            gpu_campaign("big", 0, 64, 64),
            gpu_campaign("small", 0, 64, 64),
            *(gpu_campaign(name, 0, 64, 64) for name in more),
            gpu_campaign("guarded", 8, 8, 16),
        ],
    )
    eng.apply(req(0, "filler", 40, 1000))  # L1
    assert one(eng.apply(req(0, "big", big, 1000)), Queued).reason is Reason.POOL_FULL  # L2
    return eng


def test_small_request_passes_a_blocked_big_one_before_patience():
    eng = hol_setup()
    g = one(eng.apply(req(10, "small", 8, 1000)), Granted)  # skip-ahead
    assert g.lease_id == "L3"
    assert eng.next_timer() == 300


def test_aged_request_holds_a_reservation_and_later_ones_backfill_around_it():
    # 64 GPUs; filler holds 40 until 1000, guarded's unmet guarantee keeps 8 aside; big (56)
    # cannot fit until the filler ends: its reservation starts at 1000, and needs all of it.
    eng = hol_setup(big=56, more=("quick",))
    assert eng.reservation("L2") is None  # not aged yet: no reservation
    eng.apply(Tick(at=300))
    assert eng.reservation("L2") == 1000
    # Ends after the reservation begins, and the reservation needs every unit: blocked.
    q = one(eng.apply(req(310, "small", 8, 1000)), Queued)  # L3
    assert (q.reason, q.inputs["reserved_from"]) == (Reason.HEAD_OF_LINE, 1000)
    # Its estimated wait comes from the reservation: it fits once big's span ends (2000).
    assert q.estimated_wait_s == 2000 - 310
    r = one(
        eng.apply(req(311, "small", 8, 1000, lease_class=OPPORTUNISTIC, blocking=False)), Rejected
    )
    assert r.reason is Reason.HEAD_OF_LINE
    # Ends before the reservation begins: backfilled now.
    g = one(eng.apply(req(312, "quick", 8, 600)), Granted)  # L5, ends 912
    assert (g.lease_id, g.starts_at, g.expires_at) == ("L5", 312, 912)
    # Within its own unmet guarantee: drawn from its own reserve, not blocked.
    g = one(eng.apply(req(320, "guarded", 8, 1000)), Granted)  # L6
    assert (g.lease_id, g.path, g.starts_at) == ("L6", LeasePath.WARM, 320)
    # The reservation is kept: big starts when the filler's lease expires, not later.
    out = eng.apply(Tick(at=1000))
    assert [d.lease_id for d in out if isinstance(d, Granted)] == ["L2"]
    eng.check_invariants()


def test_backfill_may_use_what_the_reservation_leaves():
    # big needs 32 of the 56 free at 1000: 24 are left, so a long request of 8 that
    # runs past the reservation still starts now.
    eng = hol_setup()  # filler 40 until 1000; big (32) queued; guarded reserves 8
    eng.apply(Tick(at=300))
    assert eng.reservation("L2") == 1000
    assert one(eng.apply(req(310, "small", 24, 5000, blocking=False)), Rejected).reason in (
        Reason.POOL_FULL,
        Reason.GUARANTEE_RESERVED,
    )  # (and it does not fit now anyway)
    g = one(eng.apply(req(311, "small", 8, 5000)), Granted)
    assert g.expires_at == 5311
    # 16 are left at 1000 now; freeing the filler early serves the reservation at once.
    assert one(eng.apply(Release(at=400, lease_id="L1")), Granted).lease_id == "L2"
    eng.check_invariants()


def test_renewal_that_would_push_a_reservation_later_is_refused():
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[
            gpu_campaign("filler", 0, 64, 64),
            gpu_campaign("big", 0, 64, 64),
            gpu_campaign("other", 0, 64, 64),
        ],
    )
    eng.apply(req(0, "filler", 40, 1000))  # L1
    eng.apply(req(0, "other", 8, 2000))  # L2
    eng.apply(req(0, "big", 48, 1000))  # L3: free 16 < 48, reserved from 1000 once aged
    eng.apply(Tick(at=300))
    assert eng.reservation("L3") == 1000
    r = one(eng.apply(Renew(at=500, lease_id="L1", duration_s=1000)), Rejected)
    assert (r.reason, r.retry_after_s) == (Reason.HEAD_OF_LINE, 500)
    assert eng.lease("L1").expires_at == 1000  # unchanged
    # Other's units are not needed at 1000 (16 free + 40 returning >= 48): it may renew.
    assert one(eng.apply(Renew(at=500, lease_id="L2", duration_s=3000)), Renewed)
    assert one(eng.apply(Tick(at=1000)), Granted).lease_id == "L3"


def test_a_burst_as_large_as_the_pool_binds_nothing_so_the_older_request_keeps_its_turn():
    # u's burst is the whole pool (64): a second 40 beside its running 40 is blocked by
    # the pool, not by u's own limits, so it ages and holds the reservation; u's later,
    # smaller request may not start first on the capacity u's lease gives back.
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[gpu_campaign("u", 0, 64, 64), gpu_campaign("o", 0, 64, 64)],
    )
    eng.apply(req(0, "u", 40, 1000))  # L1
    eng.apply(req(0, "o", 24, 2000))  # L2: the pool is full
    assert one(eng.apply(req(10, "u", 40, 100)), Queued).reason is Reason.POOL_FULL  # L3
    assert one(eng.apply(req(20, "u", 24, 100)), Queued).reason is Reason.POOL_FULL  # L4
    eng.apply(Tick(at=400))
    assert eng.reservation("L3") == 1000
    assert one(eng.apply(Release(at=900, lease_id="L1")), Granted).lease_id == "L3"
    assert "L4" in eng.pending
    # A burst below the pool's capacity still binds: the same request waits on u's own
    # limits, and holds no reservation.
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[gpu_campaign("u", 0, 63, 63), gpu_campaign("o", 0, 64, 64)],
    )
    eng.apply(req(0, "u", 40, 1000))
    eng.apply(req(0, "o", 24, 2000))
    assert one(eng.apply(req(10, "u", 40, 100)), Queued).reason is Reason.ABOVE_BURST
    eng.apply(Tick(at=400))
    assert eng.reservation("L3") is None
    eng.check_invariants()


def test_a_head_that_turns_from_its_bucket_to_the_pool_lets_its_queue_be_tried():
    # One campaign on one 8-GPU node; its burst is the node, so only the pool and its
    # bucket (R = 2, B = 400) bind it. L4, the head of its queue, waits on its bucket and
    # holds L5 back. At 300 L5 has aged and holds the reservation, and L4's bucket has
    # refilled: L4 now waits only for the pool and is refused for L5's reservation. The
    # pass then tries L5, held back until now, instead of leaving both waiting for good
    # on an empty pool; L4 follows.
    eng = build_engine(
        nodes=1, warm=1, warm_headroom={}, campaigns=[gpu_campaign("all", 0, 2, 8, 400)]
    )
    assert one(eng.apply(req(0, "all", 4, 1)), Granted).lease_id == "L1"
    assert one(eng.apply(req(0, "all", 5, 44)), Queued).reason is Reason.POOL_FULL  # L2
    assert one(eng.apply(req(0, "all", 8, 57)), Queued).reason is Reason.BUCKET_EMPTY  # L3
    assert one(eng.apply(req(0, "all", 8, 55)), Queued).reason is Reason.BUCKET_EMPTY  # L4
    assert one(eng.apply(req(0, "all", 5, 1)), Queued).reason is Reason.POOL_FULL  # L5
    assert one(eng.apply(Release(at=0, lease_id="L1")), Granted).lease_id == "L2"
    granted: dict[str, float] = {}
    while (t := eng.next_timer()) is not None and t < 1000:
        out = list(eng.apply(Tick(at=t)))
        for d in out:
            if isinstance(d, Granted):
                granted[d.lease_id] = t
                if d.lease_id in ("L4", "L5"):  # they end at once; L2 and L3 expire
                    out.extend(eng.apply(Release(at=t, lease_id=d.lease_id)))
        eng.check_invariants()
    assert list(granted) == ["L3", "L5", "L4"] and granted["L5"] == 300
    assert not eng.pending


def test_a_policy_may_let_renewals_push_a_reservation_later():
    eng = build_engine(
        warm=8,
        warm_headroom={},
        renewals_push_reservations=True,
        campaigns=[gpu_campaign("filler", 0, 64, 64), gpu_campaign("big", 0, 64, 64)],
    )
    eng.apply(req(0, "filler", 40, 1000))  # L1
    eng.apply(req(0, "big", 48, 1000))  # L2: free 24 < 48, reserved from 1000 once aged
    eng.apply(Tick(at=300))
    assert eng.reservation("L2") == 1000
    assert one(eng.apply(Renew(at=500, lease_id="L1", duration_s=1000)), Renewed)
    # The reservation moved with the lease it waits on, and is served when that ends.
    assert eng.reservation("L2") == 1500
    assert not [d for d in eng.apply(Tick(at=1000)) if isinstance(d, Granted)]
    assert one(eng.apply(Tick(at=1500)), Granted).lease_id == "L2"
    eng.check_invariants()


def test_request_that_turns_pool_blocked_still_ages():
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[
            gpu_campaign("big", 0, 8, 64, 800),
            gpu_campaign("other", 0, 64, 64),
            gpu_campaign("small", 0, 64, 64),
        ],
    )
    assert one(eng.apply(req(0, "big", 16, 100)), Granted).tokens == 800  # bucket now 0
    assert one(eng.apply(req(0, "big", 40, 10)), Queued).reason is Reason.BUCKET_EMPTY  # L2
    eng.apply(req(120, "other", 32, 2000))  # L3: free 32 < 40
    eng.apply(Tick(at=140))  # bucket refilled to 320: L2 is now blocked by the pool
    assert eng.pending["L2"].reason is Reason.POOL_FULL
    eng.apply(Tick(at=600))  # queued 600 s, pool-blocked for 460 s: past patience either way
    assert eng.reservation("L2") == 2120
    # 30 would still be held at 2120, where only 64 - 40 = 24 are left: it waits.
    assert one(eng.apply(req(600, "small", 30, 5000)), Queued).reason is Reason.HEAD_OF_LINE


def test_bucket_wake_up_does_not_bypass_an_aged_request():
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[
            gpu_campaign("big", 0, 8, 64),
            gpu_campaign("other", 0, 64, 64),
            gpu_campaign("x", 0, 1, 64, 400),
        ],
    )
    eng.apply(req(0, "other", 32, 420))  # L1
    assert one(eng.apply(req(0, "x", 5, 100)), Granted).tokens == 400  # L2, bucket 0
    assert one(eng.apply(req(0, "big", 62, 100)), Queued).reason is Reason.POOL_FULL  # L3
    assert one(eng.apply(req(0, "x", 4, 100)), Queued).reason is Reason.BUCKET_EMPTY  # L4
    eng.apply(Tick(at=350))  # L3 aged at 300, reserved from 420 (2 left there)
    assert eng.reservation("L3") == 420
    assert one(eng.apply(req(350, "other", 3, 1000)), Queued).reason is Reason.HEAD_OF_LINE
    out = eng.apply(Tick(at=400))  # L4's bucket is full enough now; it would run past 420
    assert not [d for d in out if isinstance(d, Granted)]
    assert eng.pending["L4"].reason is Reason.HEAD_OF_LINE
    out = eng.apply(Tick(at=420))
    assert next(d.lease_id for d in out if isinstance(d, Granted)) == "L3"


def test_aged_request_does_not_block_a_higher_class():
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[
            gpu_campaign("filler", 0, 64, 64),
            gpu_campaign("big", 0, 64, 64),
            gpu_campaign("boss", 0, 8, 8, lease_class=INTERACTIVE),
        ],
    )
    eng.apply(req(0, "filler", 40, 1000))
    eng.apply(req(0, "big", 32, 1000))
    eng.apply(Tick(at=400))
    assert one(eng.apply(req(400, "boss", 8, 100)), Granted).path is LeasePath.WARM


def test_a_reclaim_leaves_enough_behind_to_back_the_lent_reserve():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        campaigns=[
            gpu_campaign("sci", 8, 8, 16),  # batch: its 8 may be lent
            gpu_campaign("x", 0, 32, 32),
            gpu_campaign("bf", 0, 32, 32, None, OPPORTUNISTIC, preemptible=True),
        ],
    )
    assert one(eng.apply(req(0, "bf", 20, 1000)), Granted).path is LeasePath.WARM  # L1
    assert one(eng.apply(req(1, "bf", 12, 1000)), Granted).path is LeasePath.WARM  # L2
    assert gpu(eng.ledger.lent()) == 8
    # 14 would warn both backfill leases (youngest first, whole): nothing would be left
    # for sci to reclaim its lent 8 from, so it is refused.
    r = one(eng.apply(req(2, "x", 14, 100, blocking=False)), Rejected)
    assert r.reason in (Reason.GUARANTEE_RESERVED, Reason.POOL_FULL)
    # 12 warns only L2: 20 stay reclaimable, enough to back the 8.
    out = eng.apply(req(3, "x", 12, 100))
    assert one(out, Granted).path is LeasePath.RECLAIM
    assert [d.lease_id for d in out if isinstance(d, PreemptWarned)] == ["L2"]
    # sci's own request takes its lent reserve back within the grace period (warning L1
    # whole: the 12 it does not take drain back by the deadline, and still back the rest).
    g = one(eng.apply(req(4, "sci", 8, 100)), Granted)
    assert g.path is LeasePath.RECLAIM and g.starts_at <= 4 + eng.policy.grace_s
    assert gpu(eng.ledger.draining) == 12
    eng.check_invariants()


def test_a_request_may_not_crowd_its_own_campaigns_reservation_over_its_burst():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        hol_patience_s=0,
        campaigns=[gpu_campaign("f", 0, 32, 32), gpu_campaign("b", 0, 22, 22)],
    )
    eng.apply(req(0, "f", 16, 100))  # L1
    assert one(eng.apply(req(0, "b", 20, 100)), Queued).reason is Reason.POOL_FULL  # L2
    eng.apply(Tick(at=1))
    assert eng.reservation("L2") == 100
    # 4 more for b would fit what L2's reservation leaves at 100 (32 - 20), but b would
    # then hold 24 > its burst of 22 there, and L2 could not start: it waits.
    q = one(eng.apply(req(2, "b", 4, 1000)), Queued)
    assert q.reason is Reason.HEAD_OF_LINE
    # Ending before the reservation is fine.
    assert one(eng.apply(req(3, "f", 4, 50)), Granted).expires_at == 53
    assert one(eng.apply(Tick(at=100)), Granted).lease_id == "L2"


def test_requests_waiting_on_their_campaigns_burst_behind_a_pool_blocked_head_are_served():
    """A campaign's small requests queued ABOVE_BURST behind its own head that waits for
    the pool are looked at again when the campaign's holding drops (they are in no pool
    index): they were once left waiting for good with the pool idle."""
    from bursar.broker.decisions import Granted, Queued
    from bursar.broker.engine import Engine
    from bursar.broker.envelope import CampaignSpec
    from bursar.broker.events import Release
    from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
    from bursar.broker.reasons import Reason

    pool = PoolSpec(groups=(NodeGroup(count=10, resources={"cpu": 1}, warm=10),))
    eng = Engine(pool, PolicySpec(power_down_idle_s=None))
    env = DimEnvelope(guarantee=0, sustained=10, burst=8, bucket=None)
    eng.apply(CreateCampaign(0, CampaignSpec("u", {"cpu": env}, LeaseClass.BATCH)))
    other = DimEnvelope(guarantee=0, sustained=10, burst=10, bucket=None)
    eng.apply(CreateCampaign(0, CampaignSpec("v", {"cpu": other}, LeaseClass.BATCH)))
    eng.apply(RequestLease(1, "v", {"cpu": 4}, 1000))
    big = eng.apply(RequestLease(2, "u", {"cpu": 7}, 100)).own  # 6 free: waits for the pool
    assert isinstance(big, Queued) and big.reason is Reason.POOL_FULL
    held = eng.apply(RequestLease(3, "u", {"cpu": 5}, 1000)).own.lease_id  # passes it
    small = eng.apply(RequestLease(4, "u", {"cpu": 4}, 100)).own
    assert isinstance(small, Queued) and small.reason is Reason.ABOVE_BURST
    out = eng.apply(Release(5, held))
    granted = {d.lease_id for d in out if isinstance(d, Granted)}
    # The big one still does not fit beside v's 4; the small one does.
    assert granted == {small.request_id}
    eng.check_invariants()
