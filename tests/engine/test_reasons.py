"""A refused or queued request's reason and its wait (``reasons.py``), one setup per reason; the bucket's wake-ups; bad durations. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import pytest
from conftest import build_engine, gpu_campaign
from engine_support import BATCH, OPPORTUNISTIC, _pool_full, kinds, one, reclaim_setup, req

from bursar.broker.decisions import (
    Granted,
    Queued,
    Rejected,
)
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    Renew,
    Tick,
)
from bursar.broker.reasons import Reason


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
