"""Reservations and backfill: the rules on small cases, and properties over random sequences.

The properties run one warm pool of GPUs with firm campaigns of one class (so that no
request is entitled to pass a reservation), unlimited buckets and bursts above the pool
(so that every wait is the pool's: a request waiting on its own campaign's limits holds
no reservation):

* a reservation is kept: a request holding one is granted no later than the earliest
  start it was ever promised (backfilled leases never delay it); under a policy that lets
  renewals push reservations, only a renewal may promise a later start;
* every request is eventually granted once leases stop being renewed (leases are bounded);
* the engine's own invariants (capacity, holdings, buckets) hold after every event.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bursar.broker import dims
from bursar.broker.decisions import Granted, Rejected, Renewed
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.events import CreateCampaign, Release, Renew, RequestLease, Tick
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.broker.reservations import Profile, firm_steps

NODES, GPUS = 4, 8
CAPACITY = NODES * GPUS
MAX_LEASE = 600.0
NAMES = ("a", "b", "c")


def engine(reservations: int, fairshare: bool, patience: float, push: bool = False) -> Engine:
    pool = PoolSpec(
        groups=(NodeGroup(count=NODES, resources={"gpu": GPUS}, warm=NODES),),
        boot_latency_s=30.0,
    )
    policy = PolicySpec(
        hol_patience_s=patience,
        reservations=reservations,
        fairshare_half_life_s=3600.0 if fairshare else None,
        max_lease_s=MAX_LEASE,
        power_down_idle_s=None,
        renewals_push_reservations=push,
    )
    eng = Engine(pool, policy)
    for name in NAMES:
        env = DimEnvelope(guarantee=0, sustained=GPUS, burst=4 * CAPACITY, bucket=None)
        eng.apply(CreateCampaign(0.0, CampaignSpec(name, {"gpu": env}, LeaseClass.BATCH)))
    return eng


actions = st.lists(
    st.one_of(
        st.tuples(
            st.just("request"),
            st.sampled_from(NAMES),
            st.integers(1, CAPACITY),
            st.sampled_from([10.0, 60.0, 200.0, 500.0]),
        ),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("renew"), st.integers(0, 50), st.sampled_from([50.0, 300.0])),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 20.0, 100.0])),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    acts=actions,
    reservations=st.sampled_from([1, 3]),
    fairshare=st.booleans(),
    patience=st.sampled_from([0.0, 30.0]),
    push=st.booleans(),
)
# A renewal the policy lets push the reservation it would otherwise be refused for.
@example(
    acts=[
        ("request", "a", 16, 10.0),
        ("request", "a", 17, 10.0),
        ("wait", 1.0),
        ("renew", 0, 50.0),
    ],
    reservations=1,
    fairshare=False,
    patience=0.0,
    push=True,
)
def test_reservations_are_kept_and_every_request_is_served(
    acts, reservations, fairshare, patience, push
):
    eng = engine(reservations, fairshare, patience, push)
    promised: dict[str, float] = {}
    granted: dict[str, float] = {}
    now = 0.0

    def apply(ev):
        out = eng.apply(ev)
        eng.check_invariants()
        for d in out:
            if isinstance(d, Granted):
                granted[d.lease_id] = d.at
                if d.lease_id in promised:
                    assert d.at <= promised[d.lease_id] + 1e-6, (d.lease_id, promised, d)
        pushed = push and isinstance(ev, Renew) and any(isinstance(d, Renewed) for d in out)
        for rid in eng.pending:
            t = eng.reservation(rid)
            if t is not None and not math.isinf(t):
                # A renewal the policy lets push a reservation promises anew.
                promised[rid] = t if pushed else min(promised.get(rid, math.inf), t)
        return out

    def step_to(t: float) -> None:
        # Deliver every timer on time, as the shell does.
        while (due := eng.next_timer()) is not None and due <= t:
            apply(Tick(due))
        apply(Tick(t))

    for act in acts:
        if act[0] == "request":
            _, name, size, duration = act
            apply(RequestLease(now, campaign=name, size={"gpu": size}, duration_s=duration))
        elif act[0] == "release" and eng.leases:
            lid = sorted(eng.leases)[act[1] % len(eng.leases)]
            apply(Release(now, lid))
        elif act[0] == "renew" and eng.leases:
            lid = sorted(eng.leases)[act[1] % len(eng.leases)]
            out = apply(Renew(now, lid, act[2]))
            assert any(isinstance(d, Renewed | Rejected) for d in out)
        elif act[0] == "wait":
            now += act[1]
            step_to(now)
    # No more renewals: every lease ends by its expiry, so the queue drains.
    step_to(now + 2 * MAX_LEASE * (len(eng.pending) + 1))
    assert eng.pending == {}


def test_profile_reserves_the_earliest_fit_and_admits_what_leaves_it_whole():
    # 4 free now; 8 return at 100 and 8 more at 200.
    steps = iter([(100.0, (8.0, 0.0, 0.0)), (200.0, (8.0, 0.0, 0.0))])
    p = Profile(0.0, (4.0, 0.0, 0.0), steps)
    r = p.reserve("L1", (10.0, 0.0, 0.0), 50.0, dims.ZERO, 0.0)
    assert (r.at, r.until) == (100.0, 150.0)
    assert p.admits((4.0, 0.0, 0.0), 0.0, 100.0)  # ends as the reservation begins
    assert p.admits((2.0, 0.0, 0.0), 0.0, 1000.0)  # 12 - 10 = 2 left over it
    assert not p.admits((3.0, 0.0, 0.0), 0.0, 1000.0)
    p.take((2.0, 0.0, 0.0), 0.0, 1000.0)
    assert not p.admits((1.0, 0.0, 0.0), 50.0, 120.0)  # the 2 left are taken now
    # A second reservation goes after the first where it does not fit beside it.
    r2 = p.reserve("L2", (8.0, 0.0, 0.0), 100.0, dims.ZERO, 0.0)
    assert r2.at == 150.0


def test_capacity_returning_to_a_campaigns_own_reserve_is_not_the_pools():
    # Campaign g holds 8 with a guarantee of 4: when its lease ends, 4 go back to its own
    # reserve and only 4 to the pool.
    ends = [(50.0, "g", (8.0, 0.0, 0.0)), (60.0, "x", (8.0, 0.0, 0.0))]
    out = list(firm_steps(ends, {"g": ((4.0, 0.0, 0.0), (8.0, 0.0, 0.0))}))
    assert out == [(50.0, (4.0, 0.0, 0.0)), (60.0, (8.0, 0.0, 0.0))]


units = st.sampled_from([0.0, 1.0, 2.0, 3.0, 5.0, 8.0])
instants = st.sampled_from([0.0, 10.0, 25.0, 50.0, 75.0, 100.0, 150.0, 200.0, 1e9])


@settings(max_examples=300, deadline=None)
@given(
    base=units,
    steps=st.lists(st.tuples(instants, units), max_size=4),
    reserve=st.lists(st.tuples(units, st.sampled_from([10.0, 50.0, 120.0]), instants), max_size=3),
    take=st.lists(st.tuples(units, instants, instants), max_size=3),
    size=units,
    start=instants,
    ends=st.lists(st.floats(-10.0, 2e9, allow_nan=False), min_size=1, max_size=8),
)
def test_admits_until_is_the_latest_end_admits_allows(
    base, steps, reserve, take, size, start, ends
):
    """``admits_until`` answers ``admits`` for any end at once: the pass asks it once per
    size and answers every duration from it."""

    def v(x: float) -> dims.Vec:
        return (x, 0.0, 0.0)

    p = Profile(0.0, v(base), iter(sorted((t, v(g)) for t, g in steps)))
    for k, (s, span, earliest) in enumerate(reserve):
        p.reserve(f"L{k}", v(s), span, dims.ZERO, earliest)
        for s2, a, b in take[:k]:
            p.take(v(s2), min(a, b), max(a, b))
    until = p.admits_until(v(size), start)
    # The latest end itself and the floats around it, besides the drawn ends.
    probes = [*ends, until, math.nextafter(until, math.inf), math.nextafter(until, -math.inf)]
    for end in probes:
        if math.isfinite(end):
            assert p.admits(v(size), start, end) == (end <= until), (end, until)
