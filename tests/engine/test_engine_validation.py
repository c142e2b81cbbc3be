"""Bad input: every kind gets a RequestError with the right code and a message naming the
field, and leaves the engine's state exactly as it was (state_digest unchanged)."""

from __future__ import annotations

import math

import pytest
from conftest import build_engine, gpu_campaign

from bursar.broker.decisions import Granted
from bursar.broker.elastic import Intent
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
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

NAN = math.nan
INF = math.inf


def engine():
    """8 nodes x 8 GPUs (4 warm): a = batch, R 8, burst 32, B 800; a live lease L1, a queued
    request L3 (above burst), an ended lease L2; a metered inference envelope."""
    eng = build_engine(
        max_lease_s=3600,
        campaigns=[
            gpu_campaign(
                "a",
                8,
                8,
                32,
                800,
                extra={
                    "inference": DimEnvelope(0, 50, 200, 1000),
                    "cpu": DimEnvelope(0, 64, 256, None),
                },
            ),
            gpu_campaign("b", 0, 8, 1000, None),
        ],
    )
    eng.apply(RequestLease(at=0, campaign="a", size={"gpu": 24}, duration_s=40))  # L1
    eng.apply(RequestLease(at=0, campaign="b", size={"gpu": 8}, duration_s=10))  # L2
    eng.apply(Release(at=5, lease_id="L2"))
    eng.apply(RequestLease(at=5, campaign="a", size={"gpu": 16}, duration_s=10))  # L3 queued
    assert set(eng.leases) == {"L1"} and set(eng.pending) == {"L3"}
    assert {k: v.state for k, v in eng.ended.items()} == {"L2": LeaseState.RELEASED}
    return eng


def lease(size, duration_s=10.0, campaign="a", **kw):
    return RequestLease(at=10, campaign=campaign, size=size, duration_s=duration_s, **kw)


ENV = DimEnvelope(0, 8, 16, None)

CASES = [
    # (id, event, code, field, words in the message)
    ("unknown campaign", lease({"gpu": 1}, campaign="nope"), ErrorCode.NOT_FOUND, "campaign", "nope"),
    ("negative size", lease({"gpu": -1}), ErrorCode.INVALID_ARGUMENT, "size.gpu", "negative"),
    ("zero size", lease({"gpu": 0}), ErrorCode.INVALID_ARGUMENT, "size", "greater than zero"),
    ("empty size", lease({}), ErrorCode.INVALID_ARGUMENT, "size", "size per dimension"),
    ("NaN size", lease({"gpu": NAN}), ErrorCode.INVALID_ARGUMENT, "size.gpu", "finite"),
    ("inf size", lease({"gpu": INF}), ErrorCode.INVALID_ARGUMENT, "size.gpu", "finite"),
    ("-inf size", lease({"gpu": -INF}), ErrorCode.INVALID_ARGUMENT, "size.gpu", "finite"),
    ("bool size", lease({"gpu": True}), ErrorCode.INVALID_ARGUMENT, "size.gpu", "finite"),
    ("str size", lease({"gpu": "8"}), ErrorCode.INVALID_ARGUMENT, "size.gpu", "finite"),
    ("unknown dimension", lease({"tpu": 1}), ErrorCode.INVALID_ARGUMENT, "size", "tpu"),
    ("rate dim fs_bw", lease({"fs_bw": 5}), ErrorCode.INVALID_ARGUMENT, "size", "fs_bw"),
    ("rate dim inference", lease({"inference": 5}), ErrorCode.INVALID_ARGUMENT, "size", "Meter"),
    ("dim without envelope", lease({"mem_gb": 5}), ErrorCode.INVALID_ARGUMENT, "size.mem_gb", "no envelope"),
    ("zero duration", lease({"gpu": 1}, 0), ErrorCode.INVALID_ARGUMENT, "duration_s", "> 0"),
    ("negative duration", lease({"gpu": 1}, -5), ErrorCode.INVALID_ARGUMENT, "duration_s", "> 0"),
    ("NaN duration", lease({"gpu": 1}, NAN), ErrorCode.INVALID_ARGUMENT, "duration_s", "finite"),
    ("inf duration", lease({"gpu": 1}, INF), ErrorCode.INVALID_ARGUMENT, "duration_s", "finite"),
    ("bool duration", lease({"gpu": 1}, True), ErrorCode.INVALID_ARGUMENT, "duration_s", "finite"),
    ("duration above max", lease({"gpu": 1}, 3601), ErrorCode.OUT_OF_RANGE, "duration_s", "3600"),
    ("larger than pool", lease({"gpu": 65}, campaign="b"), ErrorCode.OUT_OF_RANGE, "size.gpu", "whole pool"),
    ("above burst", lease({"gpu": 33}), ErrorCode.OUT_OF_RANGE, "size.gpu", "burst"),
    # 57 of 64 fits the pool and b's burst, but a's guarantee of 8 is never b's.
    ("never fits beside guarantees", lease({"gpu": 57}, campaign="b"), ErrorCode.OUT_OF_RANGE,
     "size.gpu", "beside the other campaigns' guarantees"),
    ("cpu above burst", lease({"gpu": 1, "cpu": 257}), ErrorCode.OUT_OF_RANGE, "size.cpu", "burst"),
    # 24 GPUs lift 16 above R=8: 16 x 51 s = 816 > B = 800, whatever the level.
    ("bucket can never prepay", lease({"gpu": 24}, 51), ErrorCode.OUT_OF_RANGE, "duration_s", "bucket"),
    ("class above campaign's", lease({"gpu": 1}, lease_class=LeaseClass.INTERACTIVE),
     ErrorCode.FAILED_PRECONDITION, "lease_class", "interactive"),
    ("class not a class", lease({"gpu": 1}, lease_class="batch"),
     ErrorCode.INVALID_ARGUMENT, "lease_class", "allowed"),
    ("time backwards", RequestLease(at=4, campaign="a", size={"gpu": 1}, duration_s=10),
     ErrorCode.INVALID_ARGUMENT, "at", "never goes back"),
    ("tick backwards", Tick(at=0), ErrorCode.INVALID_ARGUMENT, "at", "before"),
    ("NaN time", Tick(at=NAN), ErrorCode.INVALID_ARGUMENT, "at", "finite"),
    ("inf time", Tick(at=INF), ErrorCode.INVALID_ARGUMENT, "at", "finite"),
    ("renew unknown lease", Renew(at=10, lease_id="L99", duration_s=10), ErrorCode.NOT_FOUND, "lease_id", "L99"),
    ("release unknown lease", Release(at=10, lease_id="L99"), ErrorCode.NOT_FOUND, "lease_id", "L99"),
    ("released twice", Release(at=10, lease_id="L2"), ErrorCode.FAILED_PRECONDITION, "lease_id", "already ended"),
    ("renew ended lease", Renew(at=10, lease_id="L2", duration_s=10),
     ErrorCode.FAILED_PRECONDITION, "lease_id", "released"),
    ("renew zero duration", Renew(at=10, lease_id="L1", duration_s=0),
     ErrorCode.INVALID_ARGUMENT, "duration_s", "> 0"),
    ("renew NaN duration", Renew(at=10, lease_id="L1", duration_s=NAN),
     ErrorCode.INVALID_ARGUMENT, "duration_s", "finite"),
    ("renew above max", Renew(at=10, lease_id="L1", duration_s=3601),
     ErrorCode.OUT_OF_RANGE, "duration_s", "maximum"),
    ("cancel unknown", CancelRequest(at=10, request_id="L99"), ErrorCode.NOT_FOUND, "request_id", "L99"),
    ("cancel granted", CancelRequest(at=10, request_id="L1"),
     ErrorCode.FAILED_PRECONDITION, "request_id", "already granted"),
    ("cancel ended", CancelRequest(at=10, request_id="L2"),
     ErrorCode.FAILED_PRECONDITION, "request_id", "release"),
    ("duplicate campaign", CreateCampaign(at=10, spec=gpu_campaign("a", 0, 8, 16)),
     ErrorCode.ALREADY_EXISTS, "spec.name", "already exists"),
    ("guarantee above burst", CreateCampaign(at=10, spec=gpu_campaign("c", 9, 8, 8)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.guarantee"),
    ("negative guarantee", CreateCampaign(at=10, spec=gpu_campaign("c", -1, 8, 8)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.guarantee"),
    ("negative sustained", CreateCampaign(at=10, spec=gpu_campaign("c", 0, -8, 8)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.sustained"),
    ("NaN burst", CreateCampaign(at=10, spec=gpu_campaign("c", 0, 8, NAN)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.burst"),
    ("negative bucket", CreateCampaign(at=10, spec=gpu_campaign("c", 0, 8, 8, -1)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.bucket"),
    ("inf bucket", CreateCampaign(at=10, spec=gpu_campaign("c", 0, 8, 8, INF)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.bucket"),
    ("envelope for unknown dim", CreateCampaign(at=10, spec=CampaignSpec("c", {"tpu": ENV})),
     ErrorCode.INVALID_ARGUMENT, "spec", "tpu"),
    ("bad campaign name", CreateCampaign(at=10, spec=gpu_campaign("Bad Name", 0, 8, 8)),
     ErrorCode.INVALID_ARGUMENT, "spec", "Bad Name"),
    ("preemptible with guarantee",
     CreateCampaign(at=10, spec=gpu_campaign("c", 1, 8, 8, preemptible=True)),
     ErrorCode.INVALID_ARGUMENT, "spec", "preemptible"),
    # A preemptible campaign's "no guarantee" rule compares each guarantee with 0: only
    # once each is known to be a number (a malformed one once raised TypeError there).
    ("preemptible with a guarantee that is no number",
     CreateCampaign(at=10, spec=CampaignSpec("c", {"gpu": DimEnvelope("-inf", 8, 8)},
                                             preemptible=True)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.guarantee must be a finite number"),
    ("preemptible with a -inf guarantee",
     CreateCampaign(at=10, spec=CampaignSpec("c", {"gpu": DimEnvelope(-INF, 8, 8)},
                                             preemptible=True)),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.guarantee must be a finite number"),
    ("preemptible with a NUL dimension's malformed guarantee",
     CreateCampaign(at=10, spec=CampaignSpec("c", {"\x00": DimEnvelope("-inf")},
                                             preemptible=True)),
     ErrorCode.INVALID_ARGUMENT, "spec", "unknown dimension '\\x00'"),
    ("bool guarantee", CreateCampaign(at=10, spec=CampaignSpec("c", {"gpu": DimEnvelope(True, 8, 8)})),
     ErrorCode.INVALID_ARGUMENT, "spec", "gpu.guarantee"),
    # A step so small that max - min is inf steps (round() would overflow), or 1e300 steps.
    ("elastic step overflows", lease({}, intent=Intent(
        min={"gpu": 1}, max={"gpu": 2}, step={"gpu": 5e-324}, remaining_work=100,
        deadline_s=1000, amdahl=0.1)),
     ErrorCode.INVALID_ARGUMENT, "intent.max", "whole number of steps"),
    ("elastic step below a unit", lease({}, intent=Intent(
        min={"gpu": 1}, max={"gpu": 2}, step={"gpu": 1e-300}, remaining_work=100,
        deadline_s=1000, amdahl=0.1)),
     ErrorCode.INVALID_ARGUMENT, "intent.step", "not a whole number of units"),
    # a already guarantees 8 of the pool's 64 GPUs.
    ("guarantees above capacity", CreateCampaign(at=10, spec=gpu_campaign("c", 57, 57, 57)),
     ErrorCode.FAILED_PRECONDITION, "spec.envelopes", "guarantees would sum"),
    ("update raises guarantees above capacity",
     UpdateCampaign(at=10, spec=gpu_campaign("b", 57, 57, 1000)),
     ErrorCode.FAILED_PRECONDITION, "spec.envelopes", "guarantees would sum"),
    # b guaranteed 49 leaves a at most 15: its waiting L3 of 16 would wait for good.
    ("update strands a waiting request", UpdateCampaign(at=10, spec=gpu_campaign("b", 49, 49, 1000)),
     ErrorCode.FAILED_PRECONDITION, "spec.envelopes", "L3 (campaign 'a'"),
    ("update lowers a burst below a waiting request",
     UpdateCampaign(at=10, spec=gpu_campaign("a", 8, 8, 12, 800, extra={
         "inference": DimEnvelope(0, 50, 200, 1000), "cpu": DimEnvelope(0, 64, 256, None)})),
     ErrorCode.FAILED_PRECONDITION, "spec.envelopes", "never be granted"),
    ("update unknown campaign", UpdateCampaign(at=10, spec=gpu_campaign("zz", 0, 8, 8)),
     ErrorCode.NOT_FOUND, "campaign", "zz"),
    ("node ready for a warm node", NodeReady(at=10, node="node000"),
     ErrorCode.FAILED_PRECONDITION, "node", "not booting"),
    ("node ready for a cold node", NodeReady(at=10, node="node007"),
     ErrorCode.FAILED_PRECONDITION, "node", "cold"),
    ("node ready for an unknown node", NodeReady(at=10, node="node999"),
     ErrorCode.NOT_FOUND, "node", "node999"),
    ("meter a placed dim", Meter(at=10, campaign="a", dim="gpu", amount=5),
     ErrorCode.INVALID_ARGUMENT, "dim", "not metered"),
    ("meter an unknown dim", Meter(at=10, campaign="a", dim="tpu", amount=5),
     ErrorCode.INVALID_ARGUMENT, "dim", "tpu"),
    ("meter without envelope", Meter(at=10, campaign="a", dim="fs_bw", amount=5),
     ErrorCode.INVALID_ARGUMENT, "dim", "no envelope"),
    ("meter negative amount", Meter(at=10, campaign="a", dim="inference", amount=-5),
     ErrorCode.INVALID_ARGUMENT, "amount", "> 0"),
    ("meter zero amount", Meter(at=10, campaign="a", dim="inference", amount=0),
     ErrorCode.INVALID_ARGUMENT, "amount", "> 0"),
    ("meter NaN amount", Meter(at=10, campaign="a", dim="inference", amount=NAN),
     ErrorCode.INVALID_ARGUMENT, "amount", "finite"),
    ("meter unknown campaign", Meter(at=10, campaign="zz", dim="inference", amount=5),
     ErrorCode.NOT_FOUND, "campaign", "zz"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("event", "code", "field", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_refused_and_changes_nothing(event, code, field, words):
    eng = engine()
    before = eng.state_digest()
    state = eng.state_dict()
    timer = eng.next_timer()
    with pytest.raises(RequestError) as exc:
        eng.apply(event)
    e = exc.value
    assert e.code is code
    assert e.field == field
    assert words in e.message
    assert str(e).startswith(f"{field}: ")  # the message names the field
    assert eng.state_digest() == before
    assert eng.state_dict() == state
    assert eng.next_timer() == timer
    # The engine still works as if the bad call never happened.
    out = eng.apply(Tick(at=45))
    assert [type(d).__name__ for d in out] == ["Expired", "Granted"]
    eng.check_invariants()


def test_every_error_code_is_exercised():
    assert {c[2] for c in CASES} == set(ErrorCode)


def test_bad_input_on_a_fresh_engine_changes_nothing():
    eng = build_engine()
    before = eng.state_digest()
    with pytest.raises(RequestError):
        eng.apply(RequestLease(at=0, campaign="a", size={"gpu": 1}, duration_s=1))
    assert eng.state_digest() == before
    assert eng.events_applied == 0


def test_release_after_its_lease_expired_without_a_tick_is_refused():
    """The clock runs to ``at`` before the event applies: a Release/Renew arriving after the
    lease's expiry (with no Tick in between) must be refused, not crash."""
    eng = engine()
    before = eng.state_digest()
    for ev in (Release(at=60, lease_id="L1"), Renew(at=60, lease_id="L1", duration_s=10)):
        with pytest.raises(RequestError) as exc:
            eng.apply(ev)
        assert (exc.value.code, exc.value.field) == (ErrorCode.FAILED_PRECONDITION, "lease_id")
        assert eng.state_digest() == before


def _preempted_during_advance():
    """bf's L1 gets reclaimed at t=100 (deadline 130) by a request queued since t=1 that
    is only granted when a firm lease expires at t=100; no Tick is sent in between."""
    eng = build_engine(
        warm=8,
        warm_headroom={},
        campaigns=[
            gpu_campaign("bf", 0, 64, 64, None, LeaseClass.OPPORTUNISTIC, preemptible=True),
            gpu_campaign("a", 0, 64, 64),
            gpu_campaign("sci", 0, 64, 64),
        ],
    )
    eng.apply(RequestLease(at=0, campaign="bf", size={"gpu": 32}, duration_s=1000))  # L1
    eng.apply(RequestLease(at=0, campaign="a", size={"gpu": 32}, duration_s=100))  # L2
    eng.apply(RequestLease(at=1, campaign="sci", size={"gpu": 40}, duration_s=100))  # L3 queued
    assert list(eng.pending) == ["L3"]
    return eng


@pytest.mark.parametrize(
    "event",
    [Release(at=200, lease_id="L1"), Renew(at=200, lease_id="L1", duration_s=10)],
    ids=["release", "renew"],
)
def test_event_for_a_lease_revoked_while_the_clock_advances(event):
    """Validation sees L1 live (no deadline yet); it is reclaimed and revoked while the clock
    runs to the event. The event is then a no-op: its decisions are the advance's alone."""
    eng = _preempted_during_advance()
    out = eng.apply(event)
    assert [(type(d).__name__, getattr(d, "lease_id", None)) for d in out] == [
        ("Expired", "L2"),
        ("PreemptWarned", "L1"),
        ("Granted", "L3"),
        ("Revoked", "L1"),
        ("Activated", "L3"),
    ]
    assert eng.ended["L1"].state is LeaseState.REVOKED
    eng.check_invariants()
    control = _preempted_during_advance()
    control.apply(Tick(at=200))
    assert control.state_dict() == eng.state_dict()


def test_control_same_sequence_with_a_tick_first():
    eng = _preempted_during_advance()
    out = eng.apply(Tick(at=200))
    assert [type(d).__name__ for d in out] == [
        "Expired",
        "PreemptWarned",
        "Granted",
        "Revoked",
        "Activated",
    ]
    with pytest.raises(RequestError) as exc:
        eng.apply(Release(at=200, lease_id="L1"))
    assert exc.value.code is ErrorCode.FAILED_PRECONDITION


def test_cancel_of_a_request_granted_while_the_clock_advances_does_not_crash():
    eng = _preempted_during_advance()
    out = eng.apply(CancelRequest(at=200, request_id="L3"))
    grants = [d for d in out if isinstance(d, Granted)]
    assert [g.lease_id for g in grants] == ["L3"]
    assert "L3" not in eng.pending
    eng.check_invariants()


def test_the_ceiling_beside_guarantees_counts_each_class_as_it_may_borrow():
    """A firm request keeps off every other campaign's guarantee; a preemptible one only
    off the interactive campaigns' (batch reserves are lent to preemptible leases)."""
    eng = build_engine(
        campaigns=[
            gpu_campaign("batch", 8, 8, 64),
            gpu_campaign("live", 16, 16, 64, lease_class=LeaseClass.INTERACTIVE),
            gpu_campaign("fill", 0, 64, 64, lease_class=LeaseClass.OPPORTUNISTIC, preemptible=True),
            gpu_campaign("firm", 0, 64, 64),
        ]
    )
    for campaign, top in (("firm", 40), ("fill", 48), ("batch", 48), ("live", 56)):
        with pytest.raises(RequestError) as exc:
            eng.apply(RequestLease(at=0, campaign=campaign, size={"gpu": top + 1}, duration_s=10))
        assert f"ask for at most {top}" in exc.value.message, campaign
        out = eng.apply(RequestLease(at=0, campaign=campaign, size={"gpu": top}, duration_s=10))
        assert out.own is not None and out.own.kind in {"grant", "queue"}, campaign
        if isinstance(out.own, Granted):
            eng.apply(Release(at=0, lease_id=out.own.lease_id))
        else:
            eng.apply(CancelRequest(at=0, request_id=out.own.request_id))
    eng.check_invariants()
