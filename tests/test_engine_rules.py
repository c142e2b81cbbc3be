"""One unit test per engine rule: paths, reasons, prepaid tokens, renewal,
the lease life cycle, isolation, price, metering and the supply-relevant accessors (the
admission pass's own rules, order and head of line, are in ``test_admission.py``). Exact
values throughout: the engine is pure arithmetic."""

from __future__ import annotations

import math

import pytest
from conftest import build_engine, gpu_campaign

from bursar.broker import codec, dims, paths
from bursar.broker.decisions import (
    Activated,
    Cancelled,
    Expired,
    Granted,
    LeasePath,
    Metered,
    PoweredOn,
    PreemptWarned,
    Queued,
    Rejected,
    Released,
    Renewed,
    Revoked,
)
from bursar.broker.envelope import DimEnvelope, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    CancelRequest,
    CreateCampaign,
    Meter,
    NodeReady,
    Release,
    Renew,
    RequestLease,
    Tick,
    UpdateCampaign,
)
from bursar.broker.lease import LeaseState
from bursar.broker.policy import Enforcement
from bursar.broker.reasons import Reason

INTERACTIVE = LeaseClass.INTERACTIVE
BATCH = LeaseClass.BATCH
OPPORTUNISTIC = LeaseClass.OPPORTUNISTIC


def req(at, campaign, gpu, duration_s, **kw):
    return RequestLease(at=at, campaign=campaign, size={"gpu": gpu}, duration_s=duration_s, **kw)


def kinds(decisions):
    return [type(d).__name__ for d in decisions]


def one(decisions, cls):
    found = [d for d in decisions if isinstance(d, cls)]
    assert len(found) == 1, (cls.__name__, decisions)
    return found[0]


def gpu(vec):
    return vec[dims.PLACED.index("gpu")]


# --------------------------------------------------------------------------- paths


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


def reclaim_setup():
    """All 8 nodes warm (64 GPUs, no cold), a 48-GPU backfill lease, victim reserve 8."""
    eng = build_engine(
        warm=8,
        campaigns=[
            gpu_campaign("victim", 8, 8, 16, 6000, INTERACTIVE),
            gpu_campaign("sci", 0, 8, 32, 100_000),
            gpu_campaign("bf", 0, 64, 64, None, OPPORTUNISTIC, preemptible=True),
        ],
    )
    # Preemptible: warm beyond reserve (8) + headroom (8) only.
    out = eng.apply(req(0, "bf", 48, 1000))
    assert kinds(out) == ["Granted"] and out[0].path is LeasePath.WARM
    assert gpu(eng.reclaimable) == 48
    return eng


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


# --------------------------------------------------------------------------- reasons


def _above_burst():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 16, None)])
    eng.apply(req(0, "a", 12, 100))
    return eng, 10, "a", 8, 90.0  # waits for its own lease to end at t=100


def _bucket_empty():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 800)])
    assert one(eng.apply(req(0, "a", 16, 100)), Granted).tokens == 800
    # Above R the level neither drains nor refills: it refills once the lease ends.
    return eng, 10, "a", 4, 90.0


def _guarantee_reserved():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        campaigns=[gpu_campaign("victim", 16, 16, 16), gpu_campaign("other", 0, 8, 32)],
    )
    eng.apply(req(0, "other", 8, 100))
    # 24 GPUs are free but 16 are the victim's unmet guarantee.
    return eng, 1, "other", 16, 99.0


def _pool_full():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        campaigns=[gpu_campaign("a", 0, 8, 64), gpu_campaign("b", 0, 8, 64)],
    )
    eng.apply(req(0, "a", 32, 100))
    return eng, 5, "b", 8, 95.0


@pytest.mark.parametrize("blocking", [True, False])
@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (_above_burst, Reason.ABOVE_BURST),
        (_bucket_empty, Reason.BUCKET_EMPTY),
        (_guarantee_reserved, Reason.GUARANTEE_RESERVED),
        (_pool_full, Reason.POOL_FULL),
    ],
)
def test_refusal_reason_and_wait(setup, reason, blocking):
    eng, at, name, size, wait = setup()
    out = eng.apply(
        req(at, name, size, 10 if reason is Reason.BUCKET_EMPTY else 100, blocking=blocking)
    )
    assert len(out) == 1
    d = out[0]
    if blocking:
        assert isinstance(d, Queued)
        assert (d.request_id, d.reason, d.estimated_wait_s) == ("L2", reason, wait)
        assert list(eng.pending) == ["L2"]
        assert eng.pending["L2"].reason is reason
    else:
        assert isinstance(d, Rejected)
        assert (d.request_id, d.reason, d.retry_after_s) == ("L2", reason, wait)
        assert not eng.pending
    assert "L2" not in eng.leases
    assert d.inputs["class_rank"] == BATCH.rank
    eng.check_invariants()


def test_bucket_empty_request_is_granted_when_the_bucket_has_refilled():
    eng, at, name, size, _ = _bucket_empty()
    eng.apply(req(at, name, size, 10))
    # t=100: the lease expires, the bucket refills at R=8 from 0; 4 GPUs above 0 < R need
    # nothing: held 0 + 4 <= R, so the queued request goes through at once.
    out = eng.apply(Tick(at=100))
    assert kinds(out) == ["Expired", "Granted"]
    assert out[1].lease_id == "L2" and out[1].tokens == 0.0 and out[1].at == 100


def test_bucket_wake_ups_do_not_multiply():
    # All nodes cold: the only path is cold, so the prepaid span is 10 s + 60 s of boot:
    # 8 x 70 = 560 tokens, more than B = 100; for the duration alone 80 would do.
    eng = build_engine(
        nodes=2, warm=0, warm_headroom={}, campaigns=[gpu_campaign("x", 0, 0, 16, 100)]
    )
    q1 = one(eng.apply(req(0, "x", 8, 10)), Queued)
    q2 = one(eng.apply(req(0, "x", 8, 10, lease_class=OPPORTUNISTIC)), Queued)
    assert q1.reason is q2.reason is Reason.BUCKET_EMPTY
    eng.apply(Tick(at=10))  # 2^11 = 2048 timers by now (0.4 s); by t=20 it takes minutes
    assert len(eng.timers) < 100


def test_bucket_empty_wakes_at_the_refill_time():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 800)])
    eng.apply(req(0, "a", 16, 100))
    out = eng.apply(req(10, "a", 12, 50))  # needs above(0, 12, 8) * 50 = 200 later
    assert one(out, Queued).reason is Reason.BUCKET_EMPTY
    out = eng.apply(Tick(at=100))
    assert kinds(out) == ["Expired"]
    assert eng.next_timer() == 125  # 200 tokens at 8/s
    out = eng.apply(Tick(at=125))
    g = one(out, Granted)
    assert (g.at, g.lease_id, g.tokens) == (125, "L2", 200)
    assert eng.bucket_level("a", "gpu") == 0


def test_lease_preempting_refuses_renewal():
    eng = reclaim_setup()
    eng.apply(req(10, "sci", 24, 100))
    out = eng.apply(Renew(at=20, lease_id="L1", duration_s=100))
    assert len(out) == 1 and isinstance(out[0], Rejected)
    assert (out[0].reason, out[0].request_id, out[0].retry_after_s) == (
        Reason.LEASE_PREEMPTING,
        "L1",
        20,
    )
    assert eng.lease("L1").expires_at == 1000


def test_a_duration_above_the_maximum_lease_is_bad_input():
    """No reason code stands for "too long": a duration above max_lease_s is refused as
    bad input (OUT_OF_RANGE) for requests and renewals alike, and a renewal only extends
    to now + duration, so no lease can run past max_lease_s from its last renewal."""
    eng = build_engine(max_lease_s=100, campaigns=[gpu_campaign("a", 0, 8, 16)])
    with pytest.raises(RequestError) as e:
        eng.apply(req(0, "a", 8, 101))
    assert e.value.code is ErrorCode.OUT_OF_RANGE
    eng.apply(req(0, "a", 8, 100))
    with pytest.raises(RequestError) as e:
        eng.apply(Renew(at=50, lease_id="L1", duration_s=101))
    assert e.value.code is ErrorCode.OUT_OF_RANGE
    out = eng.apply(Renew(at=50, lease_id="L1", duration_s=100))
    assert kinds(out) == ["Renewed"] and out[0].expires_at == 150


# --------------------------------------------------------------------------- prepaid


@pytest.mark.parametrize(
    ("held", "size", "duration", "tokens"),
    [
        (0, 8, 100, 0),  # at R: free
        (0, 4, 100, 0),
        (0, 16, 100, 800),  # 8 above R
        (4, 8, 50, 200),  # lifts 4 above R
        (12, 4, 25, 100),  # already above R: all of it
    ],
)
def test_prepaid_charges_the_above_R_part_for_the_whole_duration(held, size, duration, tokens):
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 6000)])
    if held:
        eng.apply(req(0, "a", held, 1000 if held <= 8 else 100))
    before = eng.bucket_level("a", "gpu")
    g = one(eng.apply(req(0, "a", size, duration)), Granted)
    assert g.tokens == tokens
    assert eng.bucket_level("a", "gpu") == before - tokens


def test_refund_of_unused_tokens_on_early_release():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 6000)])
    g = one(eng.apply(req(0, "a", 16, 100)), Granted)
    assert g.tokens == 800
    assert eng.bucket_level("a", "gpu") == 5200
    assert eng.apply(Tick(at=40)) == []
    assert eng.bucket_level("a", "gpu") == 5200  # above R: no refill, no drain
    out = eng.apply(Release(at=40, lease_id="L1"))
    assert kinds(out) == ["Released"]
    assert out[0].refund_tokens == 8 * 60
    assert out[0].refund_credits == pytest.approx(g.price * 16 * 60 / 3600, rel=1e-12)
    assert eng.bucket_level("a", "gpu") == 5680
    eng.apply(Tick(at=50))
    assert eng.bucket_level("a", "gpu") == 5680 + 8 * 10
    assert eng.campaigns["a"].credits == pytest.approx(g.price * 16 * 40 / 3600, rel=1e-12)


def test_release_before_start_refunds_the_whole_prepaid_span():
    eng = build_engine(warm_headroom={}, campaigns=[gpu_campaign("sci", 0, 8, 64, 100_000)])
    eng.apply(req(5, "sci", 48, 100))
    out = eng.apply(Release(at=15, lease_id="L1"))
    assert kinds(out) == ["Released"]
    assert out[0].refund_tokens == 40 * 150  # expires 165, released at 15
    assert eng.bucket_level("sci", "gpu") == 100_000 - 40 * 10
    eng.check_invariants()


def test_grant_instant_lets_a_lease_exceed_what_prepaid_allows():
    spec = gpu_campaign("a", 0, 8, 32, 800)
    prepaid = build_engine(campaigns=[spec])
    with pytest.raises(RequestError) as e:
        prepaid.apply(req(0, "a", 16, 1000))  # needs 8000 tokens, the bucket holds 800
    assert (e.value.code, e.value.field) == (ErrorCode.OUT_OF_RANGE, "duration_s")

    eng = build_engine(enforcement=Enforcement.GRANT_INSTANT, campaigns=[spec])
    g = one(eng.apply(req(0, "a", 16, 1000)), Granted)
    assert (g.tokens, g.expires_at) == (0.0, 1000)
    eng.apply(Tick(at=50))
    assert eng.bucket_level("a", "gpu") == 400  # drains at u - R = 8/s
    eng.apply(Tick(at=200))
    assert eng.bucket_level("a", "gpu") == 0
    # The first lease runs above R to its end: 8 GPUs x 1000 s above R against a bucket
    # of 800 (prepaid pins this to B).
    assert eng.lease("L1").expires_at == 1000
    eng.check_invariants()


def test_grant_instant_refuses_an_above_R_lease_on_an_empty_bucket():
    eng = build_engine(
        enforcement=Enforcement.GRANT_INSTANT, campaigns=[gpu_campaign("a", 0, 8, 32, 800)]
    )
    eng.apply(req(0, "a", 16, 1000))
    eng.apply(Tick(at=200))
    assert eng.bucket_level("a", "gpu") == 0
    out = eng.apply(req(200, "a", 1, 10, blocking=False))
    assert kinds(out) == ["Rejected"] and out[0].reason is Reason.BUCKET_EMPTY


# --------------------------------------------------------------------------- renewal


def test_renewal_is_granted_and_prepaid_for_the_extension():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 6000)])
    eng.apply(req(0, "a", 16, 100))
    out = eng.apply(Renew(at=50, lease_id="L1", duration_s=100))
    assert kinds(out) == ["Renewed"]
    r = out[0]
    assert (r.lease_id, r.expires_at, r.tokens) == ("L1", 150, 400)
    assert eng.bucket_level("a", "gpu") == 6000 - 800 - 400
    assert eng.lease("L1").expires_at == 150
    assert eng.next_timer() == 150
    # A renewal never shortens a lease and charges nothing when it does not extend it.
    out = eng.apply(Renew(at=60, lease_id="L1", duration_s=10))
    assert (out[0].expires_at, out[0].tokens, out[0].credits) == (150, 0.0, 0.0)
    # The refund on release covers both prepaid stretches.
    out = eng.apply(Release(at=70, lease_id="L1"))
    assert out[0].refund_tokens == 8 * 80
    assert eng.bucket_level("a", "gpu") == 6000 - 800 - 400 + 640


def test_renewal_refused_on_an_empty_bucket():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 800)])
    eng.apply(req(0, "a", 16, 100))
    out = eng.apply(Renew(at=50, lease_id="L1", duration_s=100))
    assert len(out) == 1 and isinstance(out[0], Rejected)
    assert (out[0].reason, out[0].request_id, out[0].retry_after_s) == (
        Reason.BUCKET_EMPTY,
        "L1",
        50,  # the level stays 0 while above R; it refills once the lease ends
    )
    assert eng.lease("L1").expires_at == 100
    assert kinds(eng.apply(Tick(at=100))) == ["Expired"]


def test_renewal_of_a_lease_at_R_is_free():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 32, 0)])
    eng.apply(req(0, "a", 8, 100))
    out = eng.apply(Renew(at=90, lease_id="L1", duration_s=100))
    assert kinds(out) == ["Renewed"] and (out[0].expires_at, out[0].tokens) == (190, 0.0)


# --------------------------------------------------------------------------- life cycle


def test_expiry_at_expires_at():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 16)])
    eng.apply(req(1, "a", 8, 60))
    assert eng.next_timer() == 61
    assert eng.apply(Tick(at=60.999)) == []
    out = eng.apply(Tick(at=61))
    assert kinds(out) == ["Expired"]
    assert (out[0].at, out[0].lease_id, out[0].campaign) == (61, "L1", "a")
    assert eng.leases == {} and {k: v.state for k, v in eng.ended.items()} == {
        "L1": LeaseState.EXPIRED
    }
    assert gpu(eng.campaigns["a"].held) == 0
    assert eng.next_timer() == 61 + 600  # only the idle node's power-down check is left


def test_expiry_fires_at_its_own_time_when_a_later_event_arrives():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 16), gpu_campaign("b", 0, 8, 16)])
    eng.apply(req(1, "a", 8, 60))
    out = eng.apply(req(500, "b", 8, 60))
    assert kinds(out) == ["Expired", "Granted"]
    assert out[0].at == 61 and out[1].at == 500


def test_release():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 16)])
    eng.apply(req(0, "a", 8, 100))
    out = eng.apply(Release(at=30, lease_id="L1"))
    assert kinds(out) == ["Released"]
    assert (out[0].at, out[0].lease_id, out[0].refund_tokens) == (30, "L1", 0.0)
    assert eng.ended["L1"].state is LeaseState.RELEASED and "L1" not in eng.leases
    assert gpu(eng.campaigns["a"].held) == 0
    assert eng.pool.nodes[0].used == dims.ZERO
    assert eng.next_timer() == 30 + 600  # the expiry timer is dead; the idle check is not


def _two_ending_together():
    """One 8-GPU node held by L1 and L2 (4 each, both ending at 50); L3 (8 GPUs, older)
    and L4 (4 GPUs, younger) wait for the pool, neither aged yet."""
    eng = build_engine(
        nodes=1,
        warm=1,
        warm_headroom={},
        campaigns=[gpu_campaign(n, 0, 8, 8) for n in ("a", "b", "c", "d")],
    )
    eng.apply(req(0, "a", 4, 100))
    eng.apply(req(0, "b", 4, 100))
    assert one(eng.apply(req(1, "c", 8, 50)), Queued).reason is Reason.POOL_FULL  # L3
    assert one(eng.apply(req(2, "d", 4, 10)), Queued).reason is Reason.POOL_FULL  # L4
    return eng


def test_leases_released_together_get_one_admission_pass():
    # Released one at a time, the first lease's 4 GPUs go to L4 at once, and L3 (8)
    # waits for L4 too; released together, the pass sees 8 free and L3 starts first.
    eng = _two_ending_together()
    one_by_one = [*eng.apply(Release(at=50, lease_id="L1")), *eng.apply(Release(50, "L2"))]
    assert [d.lease_id for d in one_by_one if isinstance(d, Granted)] == ["L4"]
    eng = _two_ending_together()
    out = eng.release_together([Release(at=50, lease_id="L1"), Release(at=50, lease_id="L2")])
    assert kinds(out) == ["Released", "Released", "Granted"] and out.own is None
    assert [d.lease_id for d in out if isinstance(d, (Released, Granted))] == ["L1", "L2", "L3"]
    assert "L4" in eng.pending and eng.events_applied == 4 + 4 + 2
    eng.check_invariants()
    # One release together is one apply.
    eng, other = _two_ending_together(), _two_ending_together()
    assert eng.release_together([Release(50, "L1")]) == other.apply(Release(50, "L1"))
    assert eng.state_digest() == other.state_digest()


@pytest.mark.parametrize(
    "releases, field",
    [
        ([Release(50, "L1"), Release(51, "L2")], "at"),
        ([Release(50, "L1"), Release(50, "L1")], "lease_id"),
        ([Release(50, "L1"), Release(50, "L9")], "lease_id"),
        ([Release(50, "L1"), Tick(50)], "releases"),
    ],
)
def test_a_bad_release_together_changes_nothing(releases, field):
    eng = _two_ending_together()
    before = eng.state_digest()
    with pytest.raises(RequestError) as e:
        eng.release_together(releases)
    assert e.value.field == field
    assert eng.state_digest() == before and "L1" in eng.leases


def test_cancel_of_a_queued_request():
    eng, at, name, size, _ = _pool_full()
    eng.apply(req(at, name, size, 100))
    assert eng.pressure() == (32 + 8) / 32
    out = eng.apply(CancelRequest(at=6, request_id="L2"))
    assert kinds(out) == ["Cancelled"]
    assert isinstance(out[0], Cancelled) and (out[0].request_id, out[0].campaign) == ("L2", "b")
    assert eng.pending == {}
    assert eng.pressure() == 1.0
    # Capacity freed later goes to nobody.
    assert kinds(eng.apply(Tick(at=100))) == ["Expired"]


def test_release_of_a_starting_claimant_keeps_the_victim_revoked_at_its_deadline():
    eng = reclaim_setup()
    eng.apply(req(10, "sci", 24, 100))
    out = eng.apply(Release(at=20, lease_id="L2"))
    assert kinds(out) == ["Released"]
    eng.check_invariants()
    out = eng.apply(Tick(at=40))
    assert kinds(out) == ["Revoked"] and out[0].lease_id == "L1"
    eng.check_invariants()


def test_victim_released_during_grace_hands_over_at_once():
    eng = reclaim_setup()
    eng.apply(req(10, "sci", 24, 100))
    out = eng.apply(Release(at=20, lease_id="L1"))
    assert kinds(out) == ["Released", "Activated"]
    assert out[1].lease_id == "L2" and out[1].at == 20
    eng.check_invariants()


# --------------------------------------------------------------------------- power down


def test_idle_node_powers_down_after_power_down_idle_s():
    eng = build_engine(nodes=2, warm=2, warm_headroom={}, campaigns=[gpu_campaign("a", 0, 16, 16)])
    eng.apply(req(0, "a", 8, 100))
    assert kinds(eng.apply(Tick(at=100))) == ["Expired"]
    assert eng.next_timer() == 700
    assert eng.apply(Tick(at=699)) == []
    out = eng.apply(Tick(at=700))
    assert kinds(out) == ["PoweredOff"] and (out[0].at, out[0].nodes) == (700, ("node000",))
    assert eng.pool.totals()[2] == (8.0, 64.0, 512.0)  # node000 is cold again
    assert eng.next_timer() is None


def test_idle_node_needed_for_the_reserve_stays_on():
    eng = build_engine(
        nodes=2,
        warm=2,
        warm_headroom={"gpu": 8},
        campaigns=[gpu_campaign("a", 0, 16, 16), gpu_campaign("v", 8, 8, 8)],
    )
    eng.apply(req(0, "a", 8, 100))
    eng.apply(Tick(at=100))
    assert eng.apply(Tick(at=1000)) == []  # 8 reserve + 8 headroom need both nodes
    assert all(n.power.value == "on" for n in eng.pool.nodes)


def test_power_down_keeps_the_reserve_warm():
    eng = build_engine(
        nodes=4,
        warm=3,
        warm_headroom={},
        boot_latency_s=20,
        power_down_idle_s=5,
        campaigns=[gpu_campaign("victim", 16, 16, 16), gpu_campaign("other", 0, 16, 16)],
    )
    eng.apply(req(0, "victim", 8, 10))  # L1 on node000
    eng.apply(req(0, "other", 1, 1000))  # L2: 1 GPU on node001
    out = eng.apply(req(0, "other", 8, 100))  # L3: 7 warm + 1 cold: node003 boots
    assert kinds(out) == ["PoweredOn", "Granted"] and out[0].nodes == ("node003",)
    eng.apply(Release(at=1, lease_id="L3"))  # node003 keeps booting, empty
    eng.apply(Tick(at=10))  # L1 ends: node000 idle, 23 GPUs warm and free, reserve 16
    eng.apply(Tick(at=15))  # node000's power-down check
    assert gpu(eng.pool.totals()[0]) >= gpu(eng.reserve)  # the reserve is still warm
    g = one(eng.apply(req(16, "victim", 16, 60)), Granted)
    assert (g.path, g.starts_at) == (LeasePath.WARM, 16)


def test_polling_next_timer_does_not_change_decisions():
    def run(poll):
        eng = build_engine(
            nodes=2, warm=2, warm_headroom={}, campaigns=[gpu_campaign("a", 0, 16, 16)]
        )
        out = []
        for ev in [
            req(0, "a", 8, 100),  # node000
            Tick(at=100),  # node000 idle: its power-down check is due at 700
            req(200, "a", 8, 1000),  # node000 busy again (the 700 check is now dead)
            Release(at=300, lease_id="L2"),  # idle again: a new check at 900
            Tick(at=800),
            Tick(at=1000),
        ]:
            out.append([codec.encode(d) for d in eng.apply(ev)])
            if poll:
                eng.next_timer()
        return out, eng.state_digest()

    # Without polling the stale 700 check fires (node000 is idle at 700) and powers the
    # node down at 700; with polling it was dropped at t=200 and the node goes at 900.
    assert run(poll=True) == run(poll=False)


# --------------------------------------------------------------------------- update


def test_invariants_hold_after_an_update_lowers_the_burst_below_holdings():
    eng = build_engine(campaigns=[gpu_campaign("a", 0, 8, 16)])
    eng.apply(req(0, "a", 16, 100))
    assert kinds(eng.apply(UpdateCampaign(at=1, spec=gpu_campaign("a", 0, 8, 8)))) == [
        "CampaignSet"
    ]
    # New leases and renewals are refused above the new ceiling...
    assert one(eng.apply(Renew(at=2, lease_id="L1", duration_s=100)), Rejected).reason is (
        Reason.ABOVE_BURST
    )
    # ...but holding above it until the leases end is allowed.
    eng.check_invariants()


# --------------------------------------------------------------------------- isolation


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


# --------------------------------------------------------------------------- price


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


# --------------------------------------------------------------------------- metering


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


# --------------------------------------------------------------------------- accessors


def test_supply_accessors():
    eng = reclaim_setup()
    assert gpu(eng.reserve) == 8
    assert gpu(eng.reclaimable) == 48
    on_free, boot_free, cold, on_cap = eng.pool.totals()
    assert (gpu(on_free), gpu(boot_free), gpu(cold), gpu(on_cap)) == (16, 0, 0, 64)
    assert eng.bucket_level("victim", "gpu") == 6000
    assert eng.bucket_level("bf", "gpu") == math.inf
    assert eng.bucket_level("victim", "inference") is None
    assert eng.pressure() == 0.0 and eng.price() == 1.0  # backfill is not scarcity
    assert eng.next_timer() == 1000
    eng.apply(req(10, "sci", 24, 100))
    assert eng.next_timer() == 40
    assert gpu(eng.reclaimable) == 0
    assert eng.pressure() == 24 / 64
    assert list(eng.queued()) == []
    with pytest.raises(RequestError) as e:
        eng.lease("L99")
    assert e.value.code is ErrorCode.NOT_FOUND


def test_state_digest_tracks_state_and_is_reproducible():
    a, b = reclaim_setup(), reclaim_setup()
    assert a.state_digest() == b.state_digest()
    a.apply(Tick(at=1))
    assert a.state_digest() != b.state_digest()
    b.apply(Tick(at=1))
    assert a.state_dict() == b.state_dict()
    assert a.events_applied == b.events_applied == 5


def test_decisions_expose_their_rule_inputs():
    eng = reclaim_setup()
    g = one(eng.apply(req(10, "sci", 24, 100)), Granted)
    assert g.inputs["class_rank"] == 1
    assert g.inputs["usage_s"] == 0.0
    assert g.inputs["tokens"] == {"gpu": 100_000}
    assert g.inputs["pool"]["reserve"] == {"gpu": 8.0}
    assert g.inputs["pool"]["reclaimable"] == {"gpu": 48.0}
    assert g.inputs["price"] == g.price
    assert g.inputs["waited_s"] == 0


@pytest.mark.parametrize(
    "cls", [Activated, Expired, PoweredOn, PreemptWarned, Released, Renewed, Revoked]
)
def test_decision_kinds_are_journal_kinds(cls):
    from bursar.broker.decisions import DECISION_TYPES

    assert DECISION_TYPES[cls.kind] is cls


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
    from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
    from bursar.broker.events import CreateCampaign, Release, RequestLease
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
