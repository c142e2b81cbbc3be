"""A policy change on a live engine (``ApplyPolicy``): it decides by the new policy from
that event on, what is under way keeps its terms, a change it may not make is refused
changing nothing, and a journal holding changes replays and audits bit for bit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import build_engine, gpu_campaign
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursar.broker import codec
from bursar.broker.audit import audit
from bursar.broker.decisions import PolicySet, PoweredOff, PoweredOn, Revoked
from bursar.broker.engine import Engine
from bursar.broker.envelope import LeaseClass
from bursar.broker.errors import RequestError
from bursar.broker.events import ApplyPolicy, CreateCampaign, Event, Release, RequestLease, Tick
from bursar.broker.journal import Journal, replay
from bursar.broker.policy import Enforcement, PolicySpec

CAMPAIGNS = (
    gpu_campaign("hi", sustained=16, burst=16, lease_class=LeaseClass.INTERACTIVE),
    gpu_campaign(
        "bf", sustained=16, burst=16, lease_class=LeaseClass.OPPORTUNISTIC, preemptible=True
    ),
)


def _engine(**policy: object) -> Engine:
    policy.setdefault("warm_headroom", {})
    policy.setdefault("power_down_idle_s", None)
    return build_engine(nodes=2, warm=2, campaigns=CAMPAIGNS, **policy)


def _change(eng: Engine, at: float, **settings_: object) -> PolicySet:
    out = eng.apply(ApplyPolicy(at=at, policy=dataclasses.replace(eng.policy, **settings_)))
    assert isinstance(out.own, PolicySet)
    return out.own


def _reclaim_start(eng: Engine, at: float) -> float:
    """bf fills the pool; hi asks for half at ``at``: its reclaim starts after the grace."""
    eng.apply(RequestLease(at=at - 1, campaign="bf", size={"gpu": 16}, duration_s=600))
    got = eng.apply(RequestLease(at=at, campaign="hi", size={"gpu": 8}, duration_s=60)).own
    return got.starts_at - at  # type: ignore[union-attr]


def test_a_shorter_grace_period_reclaims_sooner_from_the_change_on() -> None:
    assert _reclaim_start(_engine(), 10) == 30
    eng = _engine()
    changed = _change(eng, 5, grace_s=5.0)
    assert changed.changes == {"grace_s": (30.0, 5.0)}
    assert eng.policy.grace_s == 5.0
    assert _reclaim_start(eng, 10) == 5


def test_a_warning_already_sent_keeps_its_deadline() -> None:
    eng = _engine()
    assert _reclaim_start(eng, 10) == 30  # bf's L1 warned at 10, revoked at 40
    _change(eng, 11, grace_s=1.0)
    assert not any(isinstance(d, Revoked) for d in eng.apply(Tick(at=39)).decisions)
    revoked = [d for d in eng.apply(Tick(at=40)).decisions if isinstance(d, Revoked)]
    assert [d.lease_id for d in revoked] == ["L1"]


def test_more_headroom_boots_nodes_at_the_change() -> None:
    eng = build_engine(nodes=4, warm=2, warm_headroom={}, campaigns=CAMPAIGNS)
    out = eng.apply(
        ApplyPolicy(at=5, policy=dataclasses.replace(eng.policy, warm_headroom={"gpu": 24.0}))
    )
    boots = [d for d in out.decisions if isinstance(d, PoweredOn)]
    assert boots and boots[0].at == 5 and len(boots[0].nodes) == 1


def test_power_down_turned_on_and_off_on_idle_nodes() -> None:
    eng = build_engine(
        nodes=4, warm=4, warm_headroom={}, power_down_idle_s=None, campaigns=CAMPAIGNS
    )
    assert not any(isinstance(d, PoweredOff) for d in eng.apply(Tick(at=1000)).decisions)
    _change(eng, 1000, power_down_idle_s=60.0)
    off = [d for d in eng.apply(Tick(at=1060)).decisions if isinstance(d, PoweredOff)]
    assert off and off[0].at == 1060  # a spell started at the change
    eng2 = build_engine(
        nodes=4, warm=4, warm_headroom={}, power_down_idle_s=60, campaigns=CAMPAIGNS
    )
    _change(eng2, 30, power_down_idle_s=None)
    assert not any(isinstance(d, PoweredOff) for d in eng2.apply(Tick(at=5000)).decisions)


@pytest.mark.parametrize(
    ("change", "key", "allowed"),
    [
        ({"grace_s": -1.0}, "policy.grace_s", "allowed: a finite number >= 0"),
        ({"reservations": 0}, "policy.reservations", "allowed: a whole number 1 to 64"),
        ({"power_down_idle_s": 0.0}, "policy.power_down_idle_s", "allowed: a finite number > 0"),
        ({"elastic_rule": "fifo"}, "policy.elastic_rule", "allowed: dmug, edf"),
        ({"warm_headroom": {"gpu": 99.0}}, "policy.warm_headroom.gpu", "allowed: 0 to 16"),
        ({"idempotency_keys_kept": 0}, "policy.idempotency_keys_kept", "a whole number >= 1"),
        ({"ended_leases_kept": 2.5}, "policy.ended_leases_kept", "a whole number >= 1"),
        ({"idempotency_window_s": 0.0}, "policy.idempotency_window_s", "a finite number > 0"),
        (
            {"enforcement": Enforcement.GRANT_INSTANT},
            "policy.enforcement",
            "cannot change on a live broker",
        ),
        (
            {"fairshare_half_life_s": 60.0},
            "policy.fairshare_half_life_s",
            "cannot change on a live broker",
        ),
    ],
)
def test_a_change_it_may_not_make_is_refused_changing_nothing(
    change: dict[str, object], key: str, allowed: str
) -> None:
    eng = _engine()
    eng.apply(RequestLease(at=1, campaign="bf", size={"gpu": 8}, duration_s=600))
    before = eng.state_digest(), eng.policy, eng.events_applied
    with pytest.raises(RequestError) as err:
        eng.apply(ApplyPolicy(at=2, policy=dataclasses.replace(eng.policy, **change)))
    assert err.value.field == key
    assert allowed in err.value.message
    assert (eng.state_digest(), eng.policy, eng.events_applied) == before


def test_smaller_bounds_forget_the_oldest_at_the_change() -> None:
    eng = _engine()
    for i in range(1, 2_101):
        eng.apply(
            RequestLease(
                at=i, campaign="bf", size={"gpu": 1}, duration_s=600, idempotency_key=f"k{i}"
            )
        )
        eng.apply(Release(at=i + 0.5, lease_id=f"L{i}"))
    assert len(eng.ended) == 2_100 and eng.key_record("bf", "k1") is not None
    _change(eng, 2_200, ended_leases_kept=1_000, idempotency_keys_kept=1_000)
    # At once, whole chunks: between the bound and a chunk more.
    assert 1_000 <= len(eng.ended) < 2_000 and "L2100" in eng.ended and "L1" not in eng.ended
    assert 1_000 <= len(eng.idempotency) < 1_100
    assert eng.key_record("bf", "k1") is None and eng.key_record("bf", "k2100") is not None


def test_a_journal_with_policy_changes_replays_and_audits_bit_for_bit(tmp_path: Path) -> None:
    eng = build_engine(nodes=2, warm=2, warm_headroom={}, power_down_idle_s=None)
    events: list[Event] = [
        *(CreateCampaign(at=0, spec=spec) for spec in CAMPAIGNS),
        RequestLease(at=1, campaign="bf", size={"gpu": 16}, duration_s=600),
        ApplyPolicy(at=2, policy=dataclasses.replace(eng.policy, grace_s=5.0)),
        RequestLease(at=3, campaign="hi", size={"gpu": 8}, duration_s=60),
        Tick(at=20),
        ApplyPolicy(at=21, policy=dataclasses.replace(eng.policy, grace_s=5.0, price_k=4.0)),
        RequestLease(at=22, campaign="bf", size={"gpu": 8}, duration_s=60),
        Release(at=30, lease_id="L2"),
    ]
    with Journal.open(tmp_path / "j.sqlite", eng.pool_spec, eng.policy) as j:
        for e in events:
            j.append(e, eng.apply(e).decisions)
        assert j.current_policy == eng.policy and j.policy_changed_at == 7
        assert j.policy == PolicySpec(grace_s=30, warm_headroom={}, power_down_idle_s=None)
        again = replay(j, verify=True)
        report = audit(j)
    assert again.state_digest() == eng.state_digest()
    assert again.policy == eng.policy
    assert report.ok and report.events_checked == len(events)
    # The current policy survives a reopen, and opening with it is accepted.
    with Journal.open(tmp_path / "j.sqlite", eng.pool_spec, eng.policy) as j:
        assert j.current_policy.price_k == 4.0


_policies = st.builds(
    dict,
    grace_s=st.sampled_from([0.0, 5.0, 30.0, 120.0]),
    warm_headroom=st.sampled_from([{}, {"gpu": 8.0}, {"gpu": 16.0}]),
    hol_patience_s=st.sampled_from([0.0, 10.0, 300.0]),
    reservations=st.sampled_from([1, 2, 4]),
    # Not 0: an idle check of 0 s that finds the node needed loops (reported apart).
    power_down_idle_s=st.sampled_from([None, 30.0, 600.0]),
    max_lease_s=st.sampled_from([60.0, 900.0]),
    price_k=st.sampled_from([0.0, 2.0, 5.0]),
)
_step = st.one_of(
    st.tuples(st.just("policy"), _policies),
    st.tuples(
        st.just("request"),
        st.sampled_from(["hi", "bf"]),
        st.sampled_from([1.0, 4.0, 8.0, 16.0]),
        st.sampled_from([10.0, 60.0, 600.0]),
        st.booleans(),
    ),
    st.tuples(st.just("release"), st.integers(1, 12)),
    st.tuples(st.just("tick")),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 7.0, 31.0, 200.0]), _step), max_size=30))
def test_random_sequences_with_policy_changes_replay_identically(
    steps: list[tuple[float, tuple[object, ...]]],
) -> None:
    base = build_engine(nodes=4, warm=2, campaigns=CAMPAIGNS).policy
    t = 0.0
    events: list[Event] = []
    for dt, step in steps:
        t += dt
        match step:
            case ("policy", values):
                events.append(ApplyPolicy(at=t, policy=dataclasses.replace(base, **values)))  # type: ignore[arg-type]
            case ("request", campaign, gpu, duration, blocking):
                events.append(
                    RequestLease(
                        at=t,
                        campaign=campaign,
                        size={"gpu": gpu},
                        duration_s=duration,
                        blocking=blocking,
                    )  # type: ignore[arg-type]
                )
            case ("release", n):
                events.append(Release(at=t, lease_id=f"L{n}"))
            case _:
                events.append(Tick(at=t))
    first = build_engine(nodes=4, warm=2, campaigns=CAMPAIGNS)
    decided = []
    kept = []
    for e in events:
        try:
            out = first.apply(e)
        except RequestError:
            continue
        kept.append(e)
        decided.append(codec.dumps([codec.to_dict(d) for d in out.decisions]))
    # Through the journal's bytes, as a replay reads them.
    second = build_engine(nodes=4, warm=2, campaigns=CAMPAIGNS)
    again = [
        codec.dumps(
            [codec.to_dict(d) for d in second.apply(codec.decode_event(codec.encode(e))).decisions]
        )
        for e in kept
    ]
    assert again == decided
    assert second.state_digest() == first.state_digest()
    assert second.policy == first.policy
