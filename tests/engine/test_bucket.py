"""The token bucket (``bucket.py``): prepaid tokens for the part above the sustained rate, refunds, grant-instant accounting. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import pytest
from conftest import build_engine, gpu_campaign
from engine_support import kinds, one, req

from bursar.broker.decisions import (
    Granted,
)
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    Release,
    Tick,
)
from bursar.broker.policy import Enforcement
from bursar.broker.reasons import Reason


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
