"""The simulated pool, through the PoolBackend interface (plus its documented extras), and the
one node-state enum the engine and the backends share."""

from __future__ import annotations

from collections import Counter

import pytest

from bursar.broker.backends.base import BackendError, NodeState, PoolBackend, apply_decision
from bursar.broker.backends.simulated import SimulatedPool
from bursar.broker.config import parse_config
from bursar.broker.decisions import (
    Activated,
    Expired,
    Granted,
    LeasePath,
    PoweredOn,
    Released,
    Revoked,
)
from bursar.broker.events import NodeLost, NodeReady
from bursar.broker.policy import NodeGroup, PoolSpec

COLD, BOOTING, ON, DOWN = NodeState.COLD, NodeState.BOOTING, NodeState.ON, NodeState.DOWN


def _spec(count: int = 4, warm: int = 2, boot: float = 60.0) -> PoolSpec:
    return PoolSpec(
        groups=(NodeGroup(count=count, resources={"gpu": 8}, warm=warm, prefix="n"),),
        boot_latency_s=boot,
    )


@pytest.fixture
def pool() -> SimulatedPool:
    return SimulatedPool(_spec())


def _states(backend: PoolBackend) -> dict[str, NodeState]:
    return dict(backend.node_states())


def test_is_a_pool_backend(pool: SimulatedPool) -> None:
    assert isinstance(pool, PoolBackend)
    assert pool.boot_latency_s == 60.0
    assert not pool.slow  # bookkeeping only: driven inline
    # What the simulated pool has nothing to say about is declared, with its default.
    pool.place("L1", ["n000"], now=0.0)
    pool.warn("L1", deadline=30.0, now=1.0)
    assert pool.allocation("L1") == {}


def test_engine_and_backends_share_one_node_state_enum() -> None:
    from bursar.broker import pool
    from bursar.broker.engine import Engine

    assert NodeState is pool.NodeState and not hasattr(pool, "Power")
    # The values the engine's state digest writes.
    assert [s.value for s in NodeState] == ["cold", "booting", "on", "down"]
    engine = Engine(_spec())
    assert [n.power for n in engine.pool.nodes] == [ON, ON, COLD, COLD]
    assert [n.power for n in engine.pool.nodes] == list(_states(SimulatedPool(_spec())).values())


def test_initial_states_follow_the_spec() -> None:
    spec = PoolSpec(
        groups=(
            NodeGroup(count=3, resources={"gpu": 8}, warm=1, prefix="g"),
            NodeGroup(count=2, resources={"cpu": 64}, warm=2, prefix="c"),
        )
    )
    assert _states(SimulatedPool(spec)) == {
        "g000": ON,
        "g001": COLD,
        "g002": COLD,
        "c000": ON,
        "c001": ON,
    }


def test_node_states_is_read_only(pool: SimulatedPool) -> None:
    with pytest.raises(TypeError):
        pool.node_states()["n000"] = COLD  # type: ignore[index]


def test_started_node_is_ready_after_the_boot_latency(pool: SimulatedPool) -> None:
    assert pool.next_event_time() is None
    pool.start(["n002"], now=10.0)
    assert pool.node_states()["n002"] is BOOTING
    assert pool.next_event_time() == 70.0
    assert pool.due_events(69.999) == []
    assert pool.node_states()["n002"] is BOOTING
    assert pool.due_events(70.0) == [NodeReady(at=70.0, node="n002")]
    assert pool.node_states()["n002"] is ON
    assert pool.due_events(80.0) == []  # each event once
    assert pool.next_event_time() is None


def test_events_carry_the_time_they_happened_not_the_time_asked(pool: SimulatedPool) -> None:
    pool.start(["n003"], now=0.0)
    pool.start(["n002"], now=5.0)
    assert pool.due_events(1000.0) == [
        NodeReady(at=60.0, node="n003"),
        NodeReady(at=65.0, node="n002"),
    ]


def test_same_ready_time_is_ordered_by_name(pool: SimulatedPool) -> None:
    pool.start(["n003", "n002"], now=0.0)
    assert [e.node for e in pool.due_events(60.0)] == ["n002", "n003"]


def test_start_is_idempotent_and_never_delays_a_boot(pool: SimulatedPool) -> None:
    pool.start(["n002"], now=0.0)
    pool.start(["n002", "n000"], now=30.0)  # booting and on: no-ops
    assert pool.node_states()["n000"] is ON
    assert pool.next_event_time() == 60.0
    assert pool.due_events(60.0) == [NodeReady(at=60.0, node="n002")]


def test_pending_events_make_next_event_time_due(pool: SimulatedPool) -> None:
    pool.start(["n002"], now=0.0)
    pool.place("L1", ["n000"], now=100.0)  # passes the ready time without draining
    assert pool.next_event_time() == 100.0  # due now, never in the pool's past
    assert pool.due_events(100.0) == [NodeReady(at=60.0, node="n002")]


def test_stop_powers_off_and_abandons_a_boot(pool: SimulatedPool) -> None:
    pool.start(["n002"], now=0.0)
    pool.stop(["n002", "n001", "n003"], now=10.0)  # booting, on, cold
    assert _states(pool) == {"n000": ON, "n001": COLD, "n002": COLD, "n003": COLD}
    assert pool.next_event_time() is None
    assert pool.due_events(100.0) == []


def test_stop_refuses_leased_nodes_and_changes_nothing(pool: SimulatedPool) -> None:
    pool.place("L1", ["n000"], now=0.0)
    before = _states(pool)
    with pytest.raises(BackendError, match=r"n000.*holds lease\(s\) L1"):
        pool.stop(["n001", "n000"], now=1.0)
    assert _states(pool) == before


def test_place_and_unplace_share_nodes(pool: SimulatedPool) -> None:
    pool.place("L1", ["n000", "n001"], now=0.0)
    pool.place("L2", ["n001"], now=1.0)
    assert dict(pool.placements()) == {"L1": ("n000", "n001"), "L2": ("n001",)}
    pool.unplace("L1", now=2.0)
    assert dict(pool.placements()) == {"L2": ("n001",)}  # L2 still there
    with pytest.raises(BackendError, match="holds lease"):
        pool.stop(["n001"], now=2.5)
    pool.stop(["n000"], now=2.5)  # free again: it may be powered off
    pool.unplace("L2", now=3.0)
    assert dict(pool.placements()) == {}
    assert _states(pool) == {"n000": COLD, "n001": ON, "n002": COLD, "n003": COLD}
    pool.unplace("never-placed", now=4.0)  # ignored


@pytest.mark.parametrize(
    ("lease", "nodes", "match"),
    [
        ("L9", ["n002"], r"n002.*cold"),
        ("L9", ["nope"], "unknown node"),
        ("L1", ["n001"], "already placed"),
        ("L9", "n000", "collection of names"),
    ],
)
def test_place_refuses_and_changes_nothing(
    pool: SimulatedPool, lease: str, nodes: list[str], match: str
) -> None:
    pool.place("L1", ["n000"], now=0.0)
    before = (_states(pool), dict(pool.placements()))
    with pytest.raises(BackendError, match=match):
        pool.place(lease, nodes, now=1.0)
    assert (_states(pool), dict(pool.placements())) == before


def test_place_on_a_booting_node_waits_for_ready(pool: SimulatedPool) -> None:
    pool.start(["n002"], now=0.0)
    with pytest.raises(BackendError, match="booting"):
        pool.place("L1", ["n002"], now=59.0)
    pool.place("L1", ["n002"], now=60.0)  # ready at exactly boot latency
    assert _states(pool)["n002"] is ON and pool.placements()["L1"] == ("n002",)


def test_time_may_not_go_backwards(pool: SimulatedPool) -> None:
    pool.due_events(10.0)
    with pytest.raises(BackendError, match="backwards"):
        pool.start(["n002"], now=9.0)
    pool.due_events(10.0)  # equal is fine


def test_fail_reports_node_lost_and_repair_reports_ready(pool: SimulatedPool) -> None:
    pool.place("L1", ["n000", "n001"], now=0.0)
    pool.fail("n001", now=5.0, repair_after_s=100.0)
    assert _states(pool)["n001"] is DOWN
    assert dict(pool.placements()) == {"L1": ("n000",)}
    with pytest.raises(BackendError, match="down"):
        pool.start(["n001"], now=6.0)
    with pytest.raises(BackendError, match="already down"):
        pool.fail("n001", now=6.0)
    assert pool.due_events(6.0) == [NodeLost(at=5.0, node="n001")]
    assert pool.next_event_time() == 105.0
    pool.unplace("L1", now=7.0)  # the engine revoked L1
    assert pool.due_events(200.0) == [NodeReady(at=105.0, node="n001")]
    assert _states(pool) == {"n000": ON, "n001": ON, "n002": COLD, "n003": COLD}


def test_same_calls_give_same_events() -> None:
    def script() -> list[object]:
        p = SimulatedPool(_spec(count=8, warm=2, boot=45.0))
        out: list[object] = []
        p.start(["n007", "n003", "n004"], now=1.0)
        p.place("a", ["n000"], now=2.0)
        p.fail("n001", now=3.0, repair_after_s=44.0)
        p.start(["n005"], now=4.0)
        p.stop(["n004"], now=5.0)
        while (t := p.next_event_time()) is not None:
            out.extend(p.due_events(t))
        return [*out, sorted((n, s.value) for n, s in p.node_states().items())]

    assert script() == script()
    assert [e for e in script() if isinstance(e, NodeReady)] == [
        NodeReady(at=46.0, node="n003"),
        NodeReady(at=46.0, node="n007"),
        NodeReady(at=47.0, node="n001"),
        NodeReady(at=49.0, node="n005"),
    ]


def test_apply_decision_drives_the_backend(pool: SimulatedPool) -> None:
    apply_decision(pool, PoweredOn(at=0.0, nodes=("n002",), ready_by=60.0))
    assert _states(pool)["n002"] is BOOTING

    def grant(lease: str, nodes: tuple[str, ...], at: float, starts: float) -> Granted:
        return Granted(
            at=at,
            lease_id=lease,
            campaign="c",
            size={"gpu": 8},
            path=LeasePath.WARM if starts == at else LeasePath.COLD,
            starts_at=starts,
            expires_at=starts + 100,
            tokens=0.0,
            price=1.0,
            credits=0.0,
            nodes=nodes,
        )

    apply_decision(pool, grant("W", ("n000",), at=1.0, starts=1.0))  # warm: placed at grant
    apply_decision(pool, grant("C", ("n002",), at=1.0, starts=60.0))  # cold: placed later
    assert dict(pool.placements()) == {"W": ("n000",)}
    pool.due_events(60.0)
    apply_decision(pool, Activated(at=60.0, lease_id="C", campaign="c", nodes=("n002",)))
    assert dict(pool.placements()) == {"W": ("n000",), "C": ("n002",)}

    apply_decision(pool, Released(at=70.0, lease_id="W", campaign="c", refund_tokens=0.0,
                                  refund_credits=0.0))  # fmt: skip
    apply_decision(pool, Expired(at=80.0, lease_id="C", campaign="c"))
    apply_decision(pool, Revoked(at=90.0, lease_id="gone", campaign="c", cause="x",
                                refund_tokens=0.0, refund_credits=0.0))  # fmt: skip
    assert dict(pool.placements()) == {}
    assert Counter(_states(pool).values()) == {ON: 3, COLD: 1}


ENGINE_POOL = """\
[pool]
boot_latency_s = 60
[pool.groups.n]
count = 8
warm = 2
gpu = 8
[policy]
grace_s = 30
[campaigns.sci]
class = "batch"
[campaigns.sci.gpu]
guarantee = 8
sustained = 64
burst = 64
"""


def test_engine_cold_path_lease_is_placed_when_its_nodes_are_ready() -> None:
    # The shell loop the simulator and the service run: engine decisions go to the
    # backend, backend events go to the engine, time jumps to whichever is due first.
    from bursar.broker.engine import Engine
    from bursar.broker.events import CreateCampaign, RequestLease, Tick

    cfg = parse_config(ENGINE_POOL, "toml")
    engine = Engine(cfg.pool, cfg.policy)
    backend = SimulatedPool(cfg.pool)
    decisions = []

    def feed(event: object) -> None:
        for d in engine.apply(event):  # type: ignore[arg-type]
            decisions.append(d)
            apply_decision(backend, d)

    for spec in cfg.campaigns:
        feed(CreateCampaign(at=0.0, spec=spec))
    feed(RequestLease(at=1.0, campaign="sci", size={"gpu": 48}, duration_s=600.0))
    (grant,) = [d for d in decisions if isinstance(d, Granted)]
    assert grant.starts_at == 61.0
    assert any(isinstance(d, PoweredOn) and d.ready_by == 61.0 for d in decisions)

    t = 1.0
    while True:
        due = [x for x in (backend.next_event_time(), engine.next_timer()) if x is not None]
        if not due or min(due) > 100.0:
            break
        t = max(t, min(due))
        events = backend.due_events(t)
        for e in events:
            feed(e)
        if not events:
            feed(Tick(at=t))

    (act,) = [d for d in decisions if isinstance(d, Activated)]
    assert act.at == 61.0 and act.lease_id == grant.lease_id
    assert backend.placements()[grant.lease_id] == act.nodes
    assert all(backend.node_states()[n] is ON for n in act.nodes)
    # Each decision carries the lease's piece of every node it names, as the engine has it.
    pieces = {n: dict(p) for n, p in act.pieces.items()}
    assert pieces == {n: {"gpu": 8.0} for n in act.nodes} == dict(grant.pieces)
    assert sum(p["gpu"] for p in pieces.values()) == grant.size["gpu"] == 48
