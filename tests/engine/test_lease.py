"""The lease life cycle (``lease.py``): renewal, expiry, release, cancel, a victim's grace. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import pytest
from conftest import build_engine, gpu_campaign
from engine_support import _pool_full, gpu, kinds, one, reclaim_setup, req

from bursar.broker import dims
from bursar.broker.decisions import (
    Cancelled,
    Granted,
    Queued,
    Rejected,
    Released,
)
from bursar.broker.errors import RequestError
from bursar.broker.events import (
    CancelRequest,
    Release,
    Renew,
    Tick,
)
from bursar.broker.lease import LeaseState
from bursar.broker.reasons import Reason


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
