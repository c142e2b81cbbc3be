"""Node-shaped placement: every piece of a lease fits one node, in the request's shape.

Multi-dimensional pools where a componentwise split would be wrong, each request shape
(total units, nodes x per_node, exclusive, CPUs and memory per GPU), best fit, whole
nodes kept free, reclaimed and cold pieces, validation, the journal bytes of unshaped
requests, a zero-grace reclaim, and a property over random request/release sequences.
"""

from __future__ import annotations

import math

import pytest
from conftest import build_engine
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bursar.broker import codec, dims
from bursar.broker.backends.base import apply_decision, placed_by
from bursar.broker.backends.simulated import SimulatedPool
from bursar.broker.decisions import Activated, Granted, LeasePath, Queued
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    CreateCampaign,
    NodeReady,
    Release,
    RequestLease,
    Tick,
)
from bursar.broker.lease import LeaseState
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.broker.reasons import Reason
from bursar.broker.shape import Mode, Shape
from bursar.broker.supply import supply

ALL = ("gpu", "cpu", "mem_gb")


def campaign(name: str, *, preemptible: bool = False, cls=LeaseClass.BATCH) -> CampaignSpec:
    big = DimEnvelope(0, 10_000, 10_000, None)
    return CampaignSpec(name, {d: big for d in ALL}, cls, preemptible)


def engine(nodes: int = 3, warm: int = 2, **policy: object) -> Engine:
    policy.setdefault("warm_headroom", {})
    return build_engine(
        nodes=nodes,
        warm=warm,
        gpu=8,
        cpu=64,
        mem_gb=256,
        campaigns=[campaign("a"), campaign("b"), campaign("bf", preemptible=True)],
        **policy,
    )


def ask(eng: Engine, size: dict[str, float], campaign_: str = "a", shape: Shape | None = None):
    out = eng.apply(
        RequestLease(at=eng.now, campaign=campaign_, size=size, duration_s=600, shape=shape)
    )
    eng.check_invariants()
    return out.own


def pieces(eng: Engine, lease_id: str) -> dict[str, dict[str, float]]:
    ls = eng.lease(lease_id)
    return {eng.pool.nodes[i].name: dims.as_dict(v) for i, v in sorted(ls.pieces.items())}


# --------------------------------------------------------------------------- node shape


def _a_gpus_b_cpus(eng: Engine) -> None:
    """node000 keeps 7 free GPUs and no free CPU; node001 63 free CPUs and no GPU."""
    assert isinstance(ask(eng, {"gpu": 1, "cpu": 64}, "b"), Granted)
    assert pieces(eng, "L1") == {"node000": {"gpu": 1, "cpu": 64}}
    assert isinstance(ask(eng, {"gpu": 8, "cpu": 1}, "b"), Granted)
    assert pieces(eng, "L2") == {"node001": {"gpu": 8, "cpu": 1}}


def test_gpus_on_one_node_and_cpus_on_another_are_not_a_placement() -> None:
    eng = engine(nodes=2, warm=2)
    _a_gpus_b_cpus(eng)
    on_free, _, _, _ = eng.pool.totals()
    assert dims.fits(dims.vec({"gpu": 4, "cpu": 32}), on_free)  # the aggregate fits
    got = ask(eng, {"gpu": 4, "cpu": 32})
    assert isinstance(got, Queued) and got.reason is Reason.POOL_FULL
    assert "L3" not in eng.leases


def test_gpus_and_cpus_go_together_to_a_third_node() -> None:
    eng = engine(nodes=3, warm=2)
    _a_gpus_b_cpus(eng)
    g = ask(eng, {"gpu": 4, "cpu": 32})
    assert isinstance(g, Granted) and g.path is LeasePath.COLD
    assert g.pieces == {"node002": {"gpu": 4, "cpu": 32}}
    eng.apply(NodeReady(at=eng.now + 60, node="node002"))
    assert eng.lease("L3").state is LeaseState.ACTIVE


# --------------------------------------------------------------------------- shapes


def test_total_units_split_keeps_the_request_ratios() -> None:
    eng = engine(nodes=2, warm=2)
    half = {"gpu": 4, "cpu": 32, "mem_gb": 128}
    assert isinstance(ask(eng, {}, "b", Shape(nodes=2, per_node=half)), Granted)
    g = ask(eng, {"gpu": 8, "cpu": 64, "mem_gb": 256})
    assert isinstance(g, Granted) and g.path is LeasePath.WARM
    assert g.pieces == {"node000": half, "node001": half}


def test_total_units_split_holds_whole_gpus() -> None:
    eng = engine(nodes=2, warm=2)
    # node000: 5 GPUs, 8 cores left; node001 empty.
    assert isinstance(ask(eng, {"gpu": 3, "cpu": 56}, "b"), Granted)
    g = ask(eng, {"gpu": 10, "cpu": 40})  # 4 cores per GPU
    assert isinstance(g, Granted)
    # node000 holds 2 whole units (2 GPUs, 8 cores), node001 the other 8.
    assert g.pieces == {"node000": {"gpu": 2, "cpu": 8}, "node001": {"gpu": 8, "cpu": 32}}


def test_nodes_times_per_node_gives_equal_pieces_on_distinct_nodes() -> None:
    eng = engine(nodes=4, warm=4)
    g = ask(eng, {}, shape=Shape(nodes=2, per_node={"gpu": 4, "cpu": 16}))
    assert isinstance(g, Granted)
    assert dims.as_dict(eng.lease("L1").size) == {"gpu": 8, "cpu": 32}
    assert g.pieces == {"node000": {"gpu": 4, "cpu": 16}, "node001": {"gpu": 4, "cpu": 16}}
    # A total of the same size fits one node, best fit on a partly used one.
    t = ask(eng, {"gpu": 4, "cpu": 16})
    assert isinstance(t, Granted) and len(t.pieces) == 1
    # The size may be given with the shape when it is nodes x per_node.
    g3 = ask(eng, {"gpu": 2}, shape=Shape(nodes=2))
    assert isinstance(g3, Granted) and sorted(g3.pieces.values(), key=str) == [{"gpu": 1}] * 2


def test_per_gpu_ratios_add_cpus_and_memory() -> None:
    eng = engine(nodes=2, warm=2)
    g = ask(eng, {"gpu": 4}, shape=Shape(cpus_per_gpu=8, mem_per_gpu=32))
    assert isinstance(g, Granted)
    assert g.size == {"gpu": 4, "cpu": 32, "mem_gb": 128}
    g2 = ask(eng, {}, shape=Shape(nodes=2, per_node={"gpu": 2}, cpus_per_gpu=16))
    assert isinstance(g2, Granted)
    assert list(g2.pieces.values()) == [{"gpu": 2, "cpu": 32}] * 2


def test_exclusive_takes_whole_empty_nodes_and_holds_their_capacity() -> None:
    eng = engine(nodes=4, warm=4)
    assert isinstance(ask(eng, {"gpu": 2}, "b"), Granted)  # node000 is partly used
    g = ask(eng, {}, shape=Shape(nodes=2, exclusive=True))
    assert isinstance(g, Granted) and g.path is LeasePath.WARM
    whole = {"gpu": 8, "cpu": 64, "mem_gb": 256}
    assert g.pieces == {"node001": whole, "node002": whole}
    assert g.size == {"gpu": 16, "cpu": 128, "mem_gb": 512}
    # Nothing else goes next to an exclusive lease.
    assert isinstance(ask(eng, {"gpu": 6}, "b"), Granted)
    assert pieces(eng, "L3") == {"node000": {"gpu": 6}}
    q = ask(eng, {"cpu": 1}, "b")
    assert isinstance(q, Granted) and set(q.pieces) == {"node000"}


def test_exclusive_waits_for_an_empty_node_rather_than_share_one() -> None:
    eng = engine(nodes=2, warm=2)
    assert isinstance(ask(eng, {"gpu": 8}, "b"), Granted)
    assert pieces(eng, "L1") == {"node000": {"gpu": 8}}
    assert isinstance(ask(eng, {"cpu": 1}, "b"), Granted)
    assert pieces(eng, "L2") == {"node000": {"cpu": 1}}
    assert isinstance(ask(eng, {"gpu": 8}, "b"), Granted)
    assert pieces(eng, "L3") == {"node001": {"gpu": 8}}
    eng.apply(Release(at=1, lease_id="L1"))
    # node000 has all but one core free: the aggregate holds a whole node, no node is whole.
    q = ask(eng, {}, shape=Shape(exclusive=True))
    assert isinstance(q, Queued) and q.reason is Reason.POOL_FULL
    out = eng.apply(Release(at=2, lease_id="L2"))
    eng.check_invariants()
    (g,) = [d for d in out if isinstance(d, Granted)]
    assert g.lease_id == q.request_id
    assert g.pieces == {"node000": {"gpu": 8, "cpu": 64, "mem_gb": 256}}


def test_best_fit_takes_the_node_left_with_the_least() -> None:
    eng = engine(nodes=2, warm=2)
    assert isinstance(ask(eng, {"gpu": 4}, "b"), Granted)  # node000: 4 free
    assert isinstance(ask(eng, {"gpu": 6}, "b"), Granted)  # node001: 2 free
    assert pieces(eng, "L2") == {"node001": {"gpu": 6}}
    g = ask(eng, {"gpu": 2})
    assert isinstance(g, Granted) and g.pieces == {"node001": {"gpu": 2}}  # first fit: node000


def test_partly_used_nodes_are_filled_before_an_empty_one_is_opened() -> None:
    eng = engine(nodes=4, warm=4)
    assert isinstance(ask(eng, {"gpu": 2}, "b"), Granted)
    for size in (3, 1, 2):
        g = ask(eng, {"gpu": size}, "b")
        assert isinstance(g, Granted) and set(g.pieces) == {"node000"}
    # Three nodes stay whole for a three-node exclusive request.
    g = ask(eng, {}, shape=Shape(nodes=3, exclusive=True))
    assert isinstance(g, Granted) and set(g.pieces) == {"node001", "node002", "node003"}


# --------------------------------------------------------------------------- reclaim, cold


def test_reclaimed_pieces_are_on_the_victims_nodes() -> None:
    eng = engine(nodes=2, warm=2, grace_s=30)
    v = ask(eng, {"gpu": 8, "cpu": 32}, "bf")
    assert isinstance(v, Granted) and v.pieces == {"node000": {"gpu": 8, "cpu": 32}}
    assert isinstance(ask(eng, {"gpu": 4, "cpu": 48}, "b"), Granted)  # node001: 4 GPU, 16 cores
    g = ask(eng, {"gpu": 8, "cpu": 32})
    assert isinstance(g, Granted) and g.path is LeasePath.RECLAIM
    claimant = eng.lease(g.lease_id)
    assert claimant.claims == {"L1": dims.vec({"gpu": 4, "cpu": 16})}
    assert eng.lease("L1").claimed_by == {g.lease_id: {0: dims.vec({"gpu": 4, "cpu": 16})}}
    out = eng.apply(Tick(at=eng.now + 30))
    eng.check_invariants()
    a = [d for d in out if isinstance(d, Activated)]
    assert [d.lease_id for d in a] == [g.lease_id]
    quarter = {"gpu": 4, "cpu": 16}
    assert a[0].pieces == {"node000": quarter, "node001": quarter}


def test_victims_are_taken_youngest_first_and_only_those_drawn_on_are_warned() -> None:
    eng = engine(nodes=2, warm=2)
    assert isinstance(ask(eng, {"gpu": 8}, "bf"), Granted)  # L1, node000
    eng.apply(Tick(at=1))
    assert isinstance(ask(eng, {"gpu": 6}, "bf"), Granted)  # L2, the youngest, node001
    assert pieces(eng, "L2") == {"node001": {"gpu": 6}}
    out = eng.apply(RequestLease(at=2, campaign="a", size={"gpu": 6}, duration_s=60))
    eng.check_invariants()
    warned = [d.lease_id for d in out if type(d).__name__ == "PreemptWarned"]
    assert warned == ["L2"] and eng.lease("L1").state is LeaseState.ACTIVE
    # 2 GPUs are free next to L2: warm, on node001; the other 4 come from L2 there.
    assert out.own.pieces == {"node001": {"gpu": 2}}
    assert eng.lease("L2").claimed_by == {"L3": {1: dims.vec({"gpu": 4})}}


def test_cold_pieces_boot_only_the_nodes_they_are_on() -> None:
    eng = engine(nodes=4, warm=1)
    assert isinstance(ask(eng, {"gpu": 8}, "b"), Granted)
    out = eng.apply(
        RequestLease(
            at=1, campaign="a", size={}, duration_s=60, shape=Shape(nodes=2, per_node={"gpu": 8})
        )
    )
    g = out.own
    assert isinstance(g, Granted) and g.path is LeasePath.COLD
    booted = [d for d in out if type(d).__name__ == "PoweredOn"]
    assert [d.nodes for d in booted] == [("node001", "node002")]
    assert set(g.pieces) == {"node001", "node002"}


def test_a_zero_grace_reclaim_is_placed_once() -> None:
    eng = engine(nodes=1, warm=1, grace_s=0)
    backend = SimulatedPool(eng.pool_spec)
    placed: list[str] = []

    def run(event):
        out = eng.apply(event)
        eng.check_invariants()
        for d in out:
            apply_decision(backend, d)
            if placed_by(d) is not None:
                placed.append(placed_by(d))
        return out

    run(RequestLease(at=0, campaign="bf", size={"gpu": 8}, duration_s=600))
    g = run(RequestLease(at=1, campaign="a", size={"gpu": 8}, duration_s=600)).own
    assert isinstance(g, Granted) and g.path is LeasePath.RECLAIM and g.starts_at == g.at
    out = run(Tick(at=1))
    assert [type(d).__name__ for d in out] == ["Revoked", "Activated"]
    assert placed == ["L1", "L2"]
    assert backend.placements()["L2"] == ("node000",)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("size", "shape", "field", "words"),
    [
        ({}, Shape(nodes=1, per_node={"gpu": 9}), "shape.per_node", "largest node has 8 GPUs"),
        ({}, Shape(nodes=5, per_node={"gpu": 1}), "shape.nodes", "from 0 to 3"),
        ({}, Shape(nodes=-1, per_node={"gpu": 1}), "shape.nodes", "from 0 to 3"),
        ({}, Shape(per_node={"gpu": 1}), "shape.nodes", "1 to 3"),
        ({"gpu": 2, "cpu": 8}, Shape(cpus_per_gpu=4), "shape.cpus_per_gpu", "one or the other"),
        ({"cpu": 8}, Shape(mem_per_gpu=4), "shape.mem_per_gpu", "names none"),
        ({"gpu": 2}, Shape(cpus_per_gpu=-1), "shape.cpus_per_gpu", ">= 0"),
        ({"gpu": 2}, Shape(exclusive=True), "size", "leave it empty"),
        ({}, Shape(nodes=4, exclusive=True), "shape.nodes", "from 0 to 3"),
        ({"gpu": 4}, Shape(nodes=2, per_node={"gpu": 1}), "size", "nodes x per_node"),
        ({"gpu": 1, "cpu": 100}, None, "size", "largest node has 8 GPUs, 64 cores, 256 GB"),
        ({}, Shape(nodes=1, per_node={"tpu": 1}), "shape.per_node", "unknown dimension"),
        ({"gpu": 1}, {"nodes": 1}, "shape", "expected a Shape"),
    ],
)
def test_shape_errors_name_the_field_and_what_is_allowed(size, shape, field, words) -> None:
    eng = engine(nodes=3, warm=3)
    with pytest.raises(RequestError) as e:
        eng.apply(RequestLease(at=0, campaign="a", size=size, duration_s=60, shape=shape))
    assert e.value.code is ErrorCode.INVALID_ARGUMENT
    assert e.value.field == field and words in str(e.value), str(e.value)
    assert eng.events_applied == 3  # nothing applied


def test_a_shape_adding_a_dimension_needs_its_envelope() -> None:
    eng = build_engine(
        campaigns=[CampaignSpec("g", {"gpu": DimEnvelope(0, 64, 64, None)})], warm_headroom={}
    )
    with pytest.raises(RequestError) as e:
        eng.apply(
            RequestLease(
                at=0, campaign="g", size={"gpu": 1}, duration_s=60, shape=Shape(cpus_per_gpu=2)
            )
        )
    assert e.value.field == "shape" and "no envelope for cpu" in str(e.value)


# --------------------------------------------------------------------------- journal


def test_an_unshaped_request_journals_the_same_bytes_as_before_shapes() -> None:
    e = RequestLease(at=1.0, campaign="a", size={"gpu": 2.0}, duration_s=60.0)
    assert codec.encode(e) == (
        '{"at":1.0,"blocking":true,"campaign":"a","duration_s":60.0,"kind":"request_lease",'
        '"labels":{},"lease_class":null,"size":{"gpu":2.0}}'
    )
    shaped = RequestLease(
        at=1.0,
        campaign="a",
        size={},
        duration_s=60.0,
        shape=Shape(nodes=2, per_node={"gpu": 4.0}, cpus_per_gpu=8.0),
    )
    assert codec.decode_event(codec.encode(shaped)) == shaped
    assert codec.encode(codec.decode_event(codec.encode(shaped))) == codec.encode(shaped)


# --------------------------------------------------------------------------- fragmentation


def test_supply_reports_stranded_and_partial_free_capacity() -> None:
    eng = engine(nodes=2, warm=2)
    _a_gpus_b_cpus(eng)
    s = supply(eng)
    # Pool ratio: 8 cores and 32 GB per GPU. node000: 7 GPUs, no cores free: all stranded;
    # node001: 63 cores and 255 GB but no GPU: stranded too.
    assert s.dims["gpu"].stranded == 7
    assert s.dims["cpu"].stranded == 63
    assert s.dims["gpu"].partial_free == 7 and s.dims["cpu"].partial_free == 63
    empty = supply(engine(nodes=2, warm=2))
    assert empty.dims["gpu"].stranded == 0 and empty.dims["gpu"].partial_free == 0


# --------------------------------------------------------------------------- property


def _pool(warm: bool) -> PoolSpec:
    """Three node kinds; with ``warm`` all powered (firm requests on a full pool reclaim),
    else some cold (they boot)."""
    return PoolSpec(
        groups=(
            NodeGroup(3, {"gpu": 8, "cpu": 64, "mem_gb": 256}, 3 if warm else 2, "g"),
            NodeGroup(2, {"gpu": 4, "cpu": 96, "mem_gb": 512}, 2 if warm else 1, "h"),
            NodeGroup(2, {"cpu": 128, "mem_gb": 256}, 2 if warm else 1, "c"),
        ),
        boot_latency_s=30,
    )


size_s = st.fixed_dictionaries(
    {"gpu": st.sampled_from([1, 2, 3, 4, 8, 12])},
    optional={"cpu": st.sampled_from([1, 8, 16, 48]), "mem_gb": st.sampled_from([16, 64, 300])},
) | st.fixed_dictionaries({"cpu": st.sampled_from([1, 16, 100])})
per_node_s = st.fixed_dictionaries(
    {"gpu": st.sampled_from([1, 2, 4])}, optional={"cpu": st.sampled_from([4, 16])}
)
sized_s = st.one_of(
    st.tuples(size_s, st.none()),
    st.tuples(st.just({}), st.builds(Shape, nodes=st.integers(1, 3), per_node=per_node_s)),
    st.tuples(st.just({}), st.builds(Shape, nodes=st.integers(1, 2), exclusive=st.just(True))),
    st.tuples(
        st.fixed_dictionaries({"gpu": st.sampled_from([1, 2, 4, 8])}),
        st.builds(
            Shape, cpus_per_gpu=st.sampled_from([2, 8]), mem_per_gpu=st.sampled_from([0, 16])
        ),
    ),
)
request_s = st.tuples(st.just("request"), st.sampled_from(["a", "b", "bf", "bf"]), sized_s)
action_s = st.one_of(
    request_s,
    request_s,
    request_s,
    st.tuples(st.just("release"), st.integers(0, 30)),
    st.tuples(st.just("tick"), st.sampled_from([1, 10, 31])),
)


def _check_shapes(eng: Engine, demands: dict) -> None:
    nodes = eng.pool.nodes
    per_node = [dims.ZERO for _ in nodes]
    for ls in eng.leases.values():
        for i, p in ls.pieces.items():
            assert dims.fits(p, nodes[i].cap), (ls.id, nodes[i].name, p)
            per_node[i] = dims.add(per_node[i], p)
        if ls.state is not LeaseState.ACTIVE:
            continue  # a starting lease's pieces may still be arriving from its victims
        d = demands[ls.id]
        got = [p for p in ls.pieces.values() if not dims.is_zero(p)]
        if d.mode is Mode.TOTAL:
            for p in got:  # each piece keeps the lease's ratios
                f = max(p[j] / d.size[j] for j in range(3) if d.size[j] > 0)
                assert all(math.isclose(p[j], f * d.size[j], abs_tol=1e-6) for j in range(3))
        else:
            assert len(got) == d.count, (ls.id, got, d)
            assert all(dims.fits(p, d.unit) and dims.fits(d.unit, p) for p in got)
        if d.mode is Mode.WHOLE:
            for i in ls.pieces:
                others = [o.id for o in eng.leases.values() if o is not ls and i in o.pieces]
                assert not others, (ls.id, nodes[i].name, others)
    for i, n in enumerate(nodes):
        assert dims.fits(per_node[i], n.cap), (n.name, per_node[i])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.booleans(), st.lists(action_s, min_size=5, max_size=40))
# A release at the instant a reclaimed lease's grace ends (its revoke comes first).
@example(
    False,
    [
        ("request", "a", ({"gpu": 1}, None)),
        ("request", "a", ({}, Shape(nodes=1, exclusive=True))),
        ("request", "bf", ({"gpu": 8}, None)),
        ("request", "a", ({"gpu": 1}, None)),
        ("request", "a", ({"gpu": 12}, None)),
        ("request", "a", ({}, Shape(nodes=1, exclusive=True))),
        ("release", 0),
        ("request", "a", ({"cpu": 1}, None)),
        ("release", 0),
        ("release", 0),
    ],
)
def test_every_piece_fits_its_node_and_nodes_never_overflow(warm, actions) -> None:
    idle = None if warm else 60.0
    eng = Engine(_pool(warm), PolicySpec(grace_s=5, warm_headroom={}, power_down_idle_s=idle))
    for spec in (
        campaign("a"),
        campaign("b", cls=LeaseClass.INTERACTIVE),
        campaign("bf", preemptible=True),
    ):
        eng.apply(CreateCampaign(at=0, spec=spec))
    demands: dict = {}
    t = 0.0
    for act in actions:
        t += 1
        if act[0] == "request":
            _, camp, (size, shape) = act
            e = RequestLease(at=t, campaign=camp, size=size, duration_s=120, shape=shape)
            try:
                out = eng.apply(e)
            except RequestError:
                continue
            rid = f"L{eng._seq}"
            demands[rid] = eng.pending[rid].demand if rid in eng.pending else None
            if demands[rid] is None:
                from bursar.broker import shape as shp

                demands[rid] = shp.resolve(size, shape, eng.pool.kinds)
        elif act[0] == "release":
            # Only a lease still alive at t can be released: one whose revoke deadline
            # or expiry falls at t is ended by the clock first (the call is refused).
            live = sorted(
                lid
                for lid, ls in eng.leases.items()
                if min(ls.expires_at, ls.preempt_deadline or math.inf) > t
            )
            if not live:
                continue
            out = eng.apply(Release(at=t, lease_id=live[act[1] % len(live)]))
        else:
            t += act[1]
            out = eng.apply(Tick(at=t))
        for n in eng.pool.nodes:
            if n.ready_at is not None and n.power.value == "booting" and n.ready_at <= t:
                eng.apply(NodeReady(at=t, node=n.name))
        del out
        eng.check_invariants()
        _check_shapes(eng, demands)
