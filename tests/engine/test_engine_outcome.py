"""The engine's outcomes: each event's own answer apart from its effects on others, request
identity, idempotency keys, and the bounded record of ended leases."""

from __future__ import annotations

import pytest
from conftest import build_engine, gpu_campaign
from hypothesis import given, settings
from hypothesis import strategies as st

from bursar.broker import codec
from bursar.broker.decisions import (
    Allocated,
    CampaignSet,
    Cancelled,
    Granted,
    Metered,
    PreemptWarned,
    Queued,
    Rejected,
    Released,
    Renewed,
    Revoked,
)
from bursar.broker.engine import KEY_WINDOW_S
from bursar.broker.envelope import DimEnvelope
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    AllocationReady,
    CancelRequest,
    CreateCampaign,
    LeaseLost,
    Meter,
    Release,
    Renew,
    RequestLease,
    Tick,
)
from bursar.broker.lease import LeaseState


def two_campaigns(**policy):
    return build_engine(
        nodes=2,
        warm=2,
        campaigns=[
            gpu_campaign("a", 0, 16, 16, None),
            gpu_campaign("b", 0, 16, 16, None, preemptible=False),
        ],
        warm_headroom={},
        **policy,
    )


def test_a_request_is_answered_by_its_own_decision_not_by_others_grants():
    eng = two_campaigns()
    assert isinstance(
        eng.apply(RequestLease(0, "a", {"gpu": 16}, 100)).own, Granted
    )  # L1 fills the pool
    queued = eng.apply(RequestLease(1, "b", {"gpu": 8}, 100))  # L2 waits
    assert isinstance(queued.own, Queued) and queued.own.request_id == "L2"
    # Releasing L1 grants L2 as an effect; the release's own answer is its Released.
    out = eng.apply(Release(2, "L1"))
    assert isinstance(out.own, Released) and out.own.lease_id == "L1"
    assert [type(d) for d in out.effects] == [Granted]
    assert out.effects[0].lease_id == "L2"
    # A new request in the same event as older grants: the answer is the new one's.
    eng.apply(RequestLease(3, "b", {"gpu": 8}, 100))  # L3 granted (pool has 8 left)
    out = eng.apply(RequestLease(4, "a", {"gpu": 1}, 100, blocking=False))
    assert isinstance(out.own, Rejected) and out.own.request_id == "L4"


def test_every_kind_of_event_names_its_own_answer():
    eng = build_engine(
        campaigns=[
            gpu_campaign("a", 0, 8, 32, None, extra={"inference": DimEnvelope(0, 50, 200, 1000)})
        ]
    )
    assert isinstance(eng.apply(CreateCampaign(0, gpu_campaign("z", 0, 1, 1))).own, CampaignSet)
    g = eng.apply(RequestLease(0, "a", {"gpu": 8}, 100)).own
    assert isinstance(g, Granted) and g.lease_id == "L1"
    assert isinstance(eng.apply(Renew(10, "L1", 200)).own, Renewed)
    assert isinstance(eng.apply(Meter(11, "a", "inference", 10)).own, Metered)
    assert eng.apply(Tick(12)).own is None
    lost = eng.apply(LeaseLost(13, "L1", "gone")).own
    assert isinstance(lost, Revoked) and lost.cause == "gone"
    # Ended already: the event has nothing left to answer.
    assert eng.apply(LeaseLost(14, "L1", "again")).own is None


def test_queued_and_granted_in_the_same_pass_answers_with_the_grant():
    # A reclaim grant: the request is answered at once with a STARTING lease.
    eng = build_engine(
        nodes=1,
        warm=1,
        campaigns=[gpu_campaign("p", 0, 8, 8, preemptible=True), gpu_campaign("f", 0, 8, 8)],
        warm_headroom={},
    )
    eng.apply(RequestLease(0, "p", {"gpu": 8}, 100))
    out = eng.apply(RequestLease(1, "f", {"gpu": 8}, 100))
    assert isinstance(out.own, Granted) and out.own.lease_id == "L2"
    assert [type(d) for d in out.effects] == [PreemptWarned]


def test_outcome_reads_like_the_list_of_decisions():
    eng = two_campaigns()
    out = eng.apply(RequestLease(0, "a", {"gpu": 4}, 100))
    assert len(out) == 1 and out[0] is out.own and list(out) == [out.own]
    assert out == [out.own] and out.seq == 0
    assert out.committed(7).seq == 7 and out.committed(7).own is out.own


def test_cancel_answers_with_cancelled_and_a_granted_request_with_its_release():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 16}, 10))
    eng.apply(RequestLease(1, "b", {"gpu": 8}, 100))  # L2 queued until L1 expires at 10
    assert isinstance(eng.apply(CancelRequest(2, "L2")).own, Cancelled)
    eng.apply(RequestLease(3, "b", {"gpu": 8}, 100))  # L3 queued
    # By t=11 L1 has expired and L3 was granted while the clock advanced: the cancel
    # releases it.
    out = eng.apply(CancelRequest(11, "L3"))
    assert isinstance(out.own, Released) and out.own.lease_id == "L3"
    assert eng.ended["L3"].cause == "cancelled"


# ----------------------------------------------------------------------------- keys


def test_a_key_names_one_request_and_remembers_its_answer():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 4}, 100, idempotency_key="k1"))
    rec = eng.key_record("a", "k1")
    assert rec is not None and rec.request_id == "L1" and isinstance(rec.answer, Granted)
    # Keys are per campaign: b may use the same one.
    eng.apply(RequestLease(1, "b", {"gpu": 4}, 100, idempotency_key="k1"))
    assert eng.key_record("b", "k1").request_id == "L2"
    assert eng.key_record("a", "nope") is None and eng.key_record("a", "") is None


def test_a_retry_with_the_key_is_refused_by_the_engine_and_changes_nothing():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 4}, 100, idempotency_key="k1"))
    before = eng.state_digest()
    with pytest.raises(RequestError) as same:
        eng.apply(RequestLease(1, "a", {"gpu": 4}, 100, idempotency_key="k1"))
    assert same.value.code is ErrorCode.ALREADY_EXISTS and "L1" in str(same.value)
    with pytest.raises(RequestError) as other:
        eng.apply(RequestLease(1, "a", {"gpu": 8}, 100, idempotency_key="k1"))
    assert other.value.code is ErrorCode.INVALID_ARGUMENT
    assert other.value.field == "idempotency_key" and "different" in str(other.value)
    assert eng.state_digest() == before


def test_a_queued_request_gets_its_answer_when_granted_and_frees_its_key_when_withdrawn():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 16}, 10))
    eng.apply(RequestLease(1, "b", {"gpu": 8}, 100, idempotency_key="w"))
    assert eng.key_record("b", "w").answer is None
    eng.apply(Tick(10))
    assert isinstance(eng.key_record("b", "w").answer, Granted)
    eng.apply(RequestLease(11, "b", {"gpu": 16}, 100, idempotency_key="q"))  # L3 above burst
    eng.apply(CancelRequest(12, "L3"))
    assert eng.key_record("b", "q") is None
    # The withdrawn request's key may name a new request.
    assert eng.apply(RequestLease(13, "b", {"gpu": 16}, 100, idempotency_key="q")).own


def test_a_rejected_request_keeps_its_refusal():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 16}, 10))
    eng.apply(RequestLease(1, "b", {"gpu": 8}, 100, blocking=False, idempotency_key="r"))
    assert isinstance(eng.key_record("b", "r").answer, Rejected)


def test_keys_are_forgotten_after_the_window():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 1}, 100, idempotency_key="old"))
    eng.apply(Tick(KEY_WINDOW_S - 1))
    assert eng.key_record("a", "old") is not None
    eng.apply(Tick(KEY_WINDOW_S))
    assert eng.key_record("a", "old") is None


@pytest.mark.parametrize("key", ["x" * 129, "tab\there"])
def test_a_bad_key_is_refused(key):
    eng = two_campaigns()
    with pytest.raises(RequestError) as e:
        eng.apply(RequestLease(0, "a", {"gpu": 1}, 100, idempotency_key=key))
    assert e.value.field == "idempotency_key" and "128 printable" in str(e.value)


def test_a_key_is_journaled_only_when_given():
    plain = RequestLease(0, "a", {"gpu": 1}, 100)
    keyed = RequestLease(0, "a", {"gpu": 1}, 100, idempotency_key="k")
    assert "idempotency_key" not in codec.encode(plain)
    assert codec.decode_event(codec.encode(keyed)) == keyed
    assert codec.decode_event(codec.encode(plain)) == plain


# --------------------------------------------------------------------- ended leases


def test_an_ended_lease_is_remembered_with_how_it_ended():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 4}, 100, labels={"job": "x"}))
    eng.apply(Release(5, "L1"))
    rec = eng.ended["L1"]
    assert (rec.campaign, rec.state, rec.at, rec.cause) == ("a", LeaseState.RELEASED, 5, "released")
    assert rec.labels == {"job": "x"} and rec.size[0] == 4


def test_the_record_of_ended_leases_is_bounded(monkeypatch):
    # Kept in chunks (of 2 here), the oldest dropped whole while 3 remain.
    monkeypatch.setattr("bursar.broker.ended.CHUNK", 2)
    eng = two_campaigns(ended_leases_kept=3)
    for i in range(5):
        eng.apply(RequestLease(i, "a", {"gpu": 1}, 100))
        eng.apply(Release(i + 0.5, f"L{i + 1}"))
    assert list(eng.ended) == ["L3", "L4", "L5"]
    with pytest.raises(RequestError) as e:
        eng.apply(Release(10, "L1"))
    assert e.value.code is ErrorCode.NOT_FOUND


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.sampled_from([1.0, 4.0, 8.0, 16.0]),
            st.booleans(),
            st.sampled_from(["", "k1", "k2", "k3"]),
        ),
        max_size=20,
    )
)
def test_every_request_gets_exactly_one_own_answer_about_itself(requests):
    eng = two_campaigns()
    t = 0.0
    for campaign, gpus, blocking, key in requests:
        t += 1.0
        event = RequestLease(t, campaign, {"gpu": gpus}, 5.0, blocking, idempotency_key=key)
        try:
            out = eng.apply(event)
        except RequestError as exc:
            assert exc.field == "idempotency_key"
            continue
        own = out.own
        assert isinstance(own, Granted | Queued | Rejected)
        rid = own.lease_id if isinstance(own, Granted) else own.request_id
        assert own.campaign == campaign and rid == f"L{eng._seq}"
        assert own not in out.effects
        if key:
            assert eng.key_record(campaign, key).request_id == rid


def test_an_allocation_ready_is_recorded_for_a_live_lease_and_ignored_after_its_end():
    eng = two_campaigns()
    eng.apply(RequestLease(0, "a", {"gpu": 4}, 100))
    before = {k: v for k, v in eng.state_dict().items() if k != "now"}
    out = eng.apply(AllocationReady(1, "L1", {"backend": "slurm", "job_id": "42"}))
    assert isinstance(out.own, Allocated)
    assert out.own.allocation == {"backend": "slurm", "job_id": "42"}
    assert (out.own.lease_id, out.own.campaign, out.effects) == ("L1", "a", ())
    # A record, not a change: the engine's state is as it was, but for its clock.
    assert {k: v for k, v in eng.state_dict().items() if k != "now"} == before
    eng.apply(Release(2, "L1"))
    assert eng.apply(AllocationReady(3, "L1", {"job_id": "42"})).own is None
    with pytest.raises(RequestError) as e:
        eng.apply(AllocationReady(4, "L1", {"job_id": 42}))  # type: ignore[dict-item]
    assert e.value.field == "allocation"
    restored = codec.decode_event(codec.encode(AllocationReady(5, "L9", {"job_id": "7"})))
    assert restored == AllocationReady(5, "L9", {"job_id": "7"})
