"""Actuation off the request path: the inline actuator (the simulated pool, in decision order)
and the threaded one (a slow backend on worker threads, one ordered lane per lease), what
they report back through the broker, and the service answering around a slow allocation.

The slow backend is the simulated pool with a gate per lease: its placement waits until the
test opens the gate, as an salloc waits for Slurm, or fails as Slurm refuses
(``GatedPool``). The Slurm pool itself is tested the same way in test_slurm_actuation.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

import grpc
import pytest
from service_support import START, config, fails, run, serve, until

from bursar.broker.actuator import InlineActuator, Placed, ThreadedActuator, actuator_for
from bursar.broker.backends.base import NO_PIECES, Pieces, PlaceFailed, PoolBackend
from bursar.broker.backends.simulated import SimulatedPool
from bursar.broker.clock import ManualClock
from bursar.broker.decisions import Allocated, Granted, LeasePath, PoweredOn, Released, Revoked
from bursar.broker.events import AllocationReady, Event, LeaseLost, NodeReady, RequestLease
from bursar.broker.policy import NodeGroup, PoolSpec
from bursar.broker.runtime import Runtime
from bursar.protos.bursar.v1 import broker_pb2 as pb


class GatedPool(SimulatedPool):
    """The simulated pool as a slow backend: a lease's placement waits for its gate (if it
    has one) and then fails if the lease is refused; every call is recorded in order."""

    slow = True

    def __init__(self, pool: PoolSpec) -> None:
        super().__init__(pool)
        self.calls: list[tuple[str, str]] = []
        self._gates: dict[str, threading.Event] = {}
        self._refused: dict[str, str] = {}
        self._lock = threading.RLock()

    def gate(self, lease_id: str) -> threading.Event:
        return self._gates.setdefault(lease_id, threading.Event())

    def refuse(self, lease_id: str, cause: str) -> None:
        self._refused[lease_id] = cause

    def place(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        gate = self._gates.get(lease_id)
        if gate is not None:
            assert gate.wait(10), f"the test never opened {lease_id}'s gate"
        with self._lock:
            self.calls.append(("place", lease_id))
            if lease_id in self._refused:
                raise PlaceFailed(self._refused[lease_id])
            # Lanes run side by side: a gated one acts after later ones have moved time on.
            super().place(lease_id, nodes, max(now, self.now), pieces)

    def allocation(self, lease_id: str) -> Mapping[str, str]:
        with self._lock:
            nodes = self.placements().get(lease_id)
        return {"backend": "gated", "nodes": ",".join(nodes)} if nodes else {}

    def unplace(self, lease_id: str, now: float) -> None:
        gate = self._gates.get(f"unplace {lease_id}")
        if gate is not None:
            assert gate.wait(10), f"the test never opened {lease_id}'s unplace gate"
        with self._lock:
            self.calls.append(("unplace", lease_id))
            super().unplace(lease_id, max(now, self.now))

    def start(self, nodes: Iterable[str], now: float) -> None:
        with self._lock:
            super().start(nodes, max(now, self.now))

    def due_events(self, now: float) -> list[Event]:
        with self._lock:
            return super().due_events(max(now, self.now))

    def next_event_time(self) -> float | None:
        with self._lock:
            return super().next_event_time()


def _spec(boot: float = 60.0) -> PoolSpec:
    return PoolSpec(
        groups=(NodeGroup(count=4, resources={"gpu": 8}, warm=2, prefix="n"),),
        boot_latency_s=boot,
    )


def _grant(lease_id: str, node: str, at: float = START) -> Granted:
    return Granted(
        at=at,
        lease_id=lease_id,
        campaign="c",
        size={"gpu": 8},
        path=LeasePath.WARM,
        starts_at=at,
        expires_at=at + 100,
        tokens=0.0,
        price=1.0,
        credits=0.0,
        nodes=(node,),
        pieces={node: {"gpu": 8.0}},
    )


def _released(lease_id: str, at: float) -> Released:
    return Released(at=at, lease_id=lease_id, campaign="c", refund_tokens=0.0, refund_credits=0.0)


class Reports:
    """Collects a threaded actuator's notifications; ``wait(n)`` until ``n`` reports are due."""

    def __init__(self, act: ThreadedActuator, clock: ManualClock) -> None:
        self._act, self._clock = act, clock
        self._cond = threading.Condition()
        self.got: list[object] = []
        act.on_report(self._notified)

    def _notified(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, n: int, timeout_s: float = 10.0) -> list[object]:
        with self._cond:
            ok = self._cond.wait_for(lambda: self._take() >= n, timeout_s)
        assert ok, f"expected {n} reports, got {self.got}"
        return self.got

    def _take(self) -> int:
        self.got.extend(self._act.due(self._clock.now()))
        return len(self.got)


# ------------------------------------------------------------------------------ threaded


def test_a_slow_placement_holds_up_no_other_lease_and_its_lane_stays_in_order() -> None:
    clock = ManualClock(START)
    pool = GatedPool(_spec())
    act = ThreadedActuator(pool, clock)
    reports = Reports(act, clock)
    try:
        slow = pool.gate("L1")
        act.actuate([_grant("L1", "n000"), _grant("L2", "n001")])
        # L2 is placed while L1's placement still waits.
        assert reports.wait(1) == [Placed("L2", START)]
        assert dict(pool.placements()) == {"L2": ("n001",)} and act.busy()
        # L1's release queues behind its placement, on its lane.
        act.actuate([_released("L1", START + 1)])
        clock.advance(2)
        slow.set()
        assert act.wait_idle(10)
        assert reports.wait(2)[1] == Placed("L1", START + 2)
        assert pool.calls == [("place", "L2"), ("place", "L1"), ("unplace", "L1")]
        assert dict(pool.placements()) == {"L2": ("n001",)}
    finally:
        act.close()


def test_a_placement_waits_for_the_unplacing_of_what_held_its_nodes() -> None:
    clock = ManualClock(START)
    pool = GatedPool(_spec())
    act = ThreadedActuator(pool, clock)
    reports = Reports(act, clock)
    try:
        act.actuate([_grant("L1", "n000")])
        assert reports.wait(1) == [Placed("L1", START)]
        freeing = pool.gate("unplace L1")
        # L1 released; the engine hands n000 to L2 at once, n001 to L3.
        act.actuate([_released("L1", START), _grant("L2", "n000"), _grant("L3", "n001")])
        assert reports.wait(2)[1] == Placed("L3", START)
        assert "L2" not in pool.placements()  # n000 still holds L1's old allocation
        freeing.set()
        assert act.wait_idle(10)
        assert reports.wait(3)[2] == Placed("L2", START)
        assert pool.calls == [
            ("place", "L1"),
            ("place", "L3"),
            ("unplace", "L1"),
            ("place", "L2"),
        ]
    finally:
        act.close()


def test_a_refused_placement_is_reported_as_the_lease_lost_with_the_backends_cause() -> None:
    clock = ManualClock(START)
    pool = GatedPool(_spec())
    pool.refuse("L1", "slurm: salloc: Requested nodes are busy")
    act = ThreadedActuator(pool, clock)
    reports = Reports(act, clock)
    try:
        act.actuate([_grant("L1", "n000")])
        (lost,) = reports.wait(1)
        assert lost == LeaseLost(START, "L1", "slurm: salloc: Requested nodes are busy")
        assert dict(pool.placements()) == {}
    finally:
        act.close()


def test_the_poller_reports_the_backends_events_when_they_fall_due() -> None:
    clock = ManualClock(START)
    pool = GatedPool(_spec(boot=30.0))
    act = ThreadedActuator(pool, clock)
    reports = Reports(act, clock)
    try:
        act.actuate([PoweredOn(at=START, nodes=("n002",), ready_by=START + 30)])
        assert act.wait_idle(10)
        # The poller sleeps on the clock until the boot is due, then reads the event.
        clock.set(START + 30)
        assert reports.wait(1) == [NodeReady(START + 30, "n002")]
        assert act.next_report_time() is None
    finally:
        act.close()


def test_the_service_factory_threads_only_slow_backends() -> None:
    assert isinstance(actuator_for(SimulatedPool(_spec())), InlineActuator)
    act = actuator_for(GatedPool(_spec()))
    try:
        assert isinstance(act, ThreadedActuator) and act.asynchronous
    finally:
        act.close()


# ------------------------------------------------------------------------------ broker


def _broker(tmp_path: Path, pool: SimulatedPool, threaded: bool) -> Runtime:
    if threaded:
        clock = ManualClock(START + 2)  # report times: after the requests below

        def threads(backend: PoolBackend) -> ThreadedActuator:
            return ThreadedActuator(backend, clock)

        return Runtime.open(tmp_path, config(), pool, at=START, actuator=threads)
    return Runtime.open(tmp_path, config(), pool, at=START)


@pytest.mark.parametrize("threaded", [False, True], ids=["inline", "threaded"])
def test_a_failed_placement_ends_the_lease_through_the_journal(
    tmp_path: Path, threaded: bool
) -> None:
    pool = GatedPool(config().pool) if threaded else _RefusingPool(config().pool)
    pool.refuse("L1", "slurm: salloc: Job violates accounting policy")
    with _broker(tmp_path, pool, threaded) as b:
        grant = b.submit(RequestLease(START + 1, "sci", {"gpu": 8}, 60)).own
        assert isinstance(grant, Granted) and grant.lease_id == "L1"
        assert grant.pieces == {grant.nodes[0]: {"gpu": 8.0}}
        ok = b.submit(RequestLease(START + 2, "sci", {"gpu": 8}, 60)).own
        assert isinstance(ok, Granted)
        if threaded:
            assert isinstance(b.actuator, ThreadedActuator) and b.actuator.wait_idle(10)
        b.catch_up(START + 3)
        entries = list(b.journal.entries())
        (rev,) = [d for _, _, ds in entries for d in ds if isinstance(d, Revoked)]
        assert rev.lease_id == "L1" and rev.cause == "slurm: salloc: Job violates accounting policy"
        assert "L1" in b.engine.ended and ok.lease_id in b.engine.leases
        # The inline actuator placed L2 inside its submit; the threaded one reports it, and
        # the report is journaled: the engine records the allocation in journal order.
        ready = [e for _, e, _ in entries if isinstance(e, AllocationReady)]
        allocated = [d for _, _, ds in entries for d in ds if isinstance(d, Allocated)]
        if threaded:
            assert [e.lease_id for e in ready] == [ok.lease_id]
            assert [(d.lease_id, d.allocation) for d in allocated] == [
                (ok.lease_id, ready[0].allocation)
            ]
            assert ready[0].allocation == {"backend": "gated", "nodes": ok.nodes[0]}
        else:
            assert ready == [] and allocated == []
        lost = [e for _, e, _ in entries if isinstance(e, LeaseLost)]
        assert [e.lease_id for e in lost] == ["L1"]


class _RefusingPool(SimulatedPool):
    """The simulated pool, refusing to place the leases it is told to (inline)."""

    def __init__(self, pool: PoolSpec) -> None:
        super().__init__(pool)
        self._refused: dict[str, str] = {}

    def refuse(self, lease_id: str, cause: str) -> None:
        self._refused[lease_id] = cause

    def place(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        if lease_id in self._refused:
            raise PlaceFailed(self._refused[lease_id])
        super().place(lease_id, nodes, now, pieces)


def test_the_inline_actuator_places_before_submit_returns(tmp_path: Path) -> None:
    pool = SimulatedPool(config().pool)
    with _broker(tmp_path, pool, threaded=False) as b:
        assert isinstance(b.actuator, InlineActuator) and not b.actuator.asynchronous
        grant = b.submit(RequestLease(START + 1, "sci", {"gpu": 8}, 60)).own
        assert isinstance(grant, Granted)
        assert dict(pool.placements()) == {grant.lease_id: grant.nodes}


# ------------------------------------------------------------------------------ service


def test_the_service_answers_other_acquires_while_one_allocation_is_slow(tmp_path: Path) -> None:
    pool = GatedPool(config().pool)
    slow = pool.gate("L1")

    async def scenario() -> None:
        async with serve(tmp_path, backend=pool) as c:
            assert isinstance(c.core.runtime.actuator, ThreadedActuator)
            first = asyncio.ensure_future(c.acquire("sci", 8))
            try:
                await until(lambda: "L1" in c.core.engine.leases)
                # Granted and journaled, its allocation still being made: other calls go on.
                other = await asyncio.wait_for(c.acquire("sci", 8), 5)
                assert other.lease.lease_id == "L2" and not first.done()
                assert other.lease.allocation == {"backend": "gated", "nodes": "w001"}
                # A stream opened now shows both; L1 has no allocation yet.
                watch = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
                snaps = [await asyncio.wait_for(watch.read(), 5) for _ in range(2)]
                assert [(e.lease.lease_id, e.snapshot) for e in snaps] == [
                    ("L1", True),
                    ("L2", True),
                ]
                assert not snaps[0].lease.allocation and snaps[1].lease.allocation
                assert not first.done()
                # A stream that replays the journal has both grants and L2's allocation, in
                # journal order.
                replay = c.broker.Watch(pb.WatchRequest(from_seq=1), metadata=c.as_("sci"))
                grants = [await asyncio.wait_for(replay.read(), 5) for _ in range(3)]
                assert [(e.kind, e.lease.lease_id) for e in grants] == [
                    (pb.LEASE_EVENT_KIND_GRANTED, "L1"),
                    (pb.LEASE_EVENT_KIND_GRANTED, "L2"),
                    (pb.LEASE_EVENT_KIND_ALLOCATED, "L2"),
                ]
                assert grants[0].seq < grants[1].seq < grants[2].seq
            finally:
                slow.set()
            answer = await asyncio.wait_for(first, 5)
            assert answer.lease.allocation == {"backend": "gated", "nodes": "w000"}
            # Its allocation is journaled when it is ready, after L2's grant: every stream
            # hears it there, with the allocation, once.
            for stream in (watch, replay):
                ev = await asyncio.wait_for(stream.read(), 5)
                assert (ev.kind, ev.lease.lease_id) == (pb.LEASE_EVENT_KIND_ALLOCATED, "L1")
                assert ev.lease.allocation["nodes"] == "w000" and not ev.snapshot
                assert ev.seq > grants[2].seq
            await c.broker.Release(pb.ReleaseRequest(lease_id="L2"), metadata=c.as_("sci"))
            for stream in (watch, replay):
                end = await asyncio.wait_for(stream.read(), 5)
                assert (end.kind, end.lease.lease_id) == (pb.LEASE_EVENT_KIND_RELEASED, "L2")
                stream.cancel()

    run(scenario())


def test_the_service_answers_a_failed_allocation_with_the_revoked_lease(tmp_path: Path) -> None:
    pool = GatedPool(config().pool)
    pool.refuse("L2", "slurm: salloc: Requested node configuration is not available")

    async def scenario() -> None:
        async with serve(tmp_path, backend=pool) as c:
            held = await asyncio.wait_for(c.acquire("sci", 8), 5)
            watch = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
            snap = await asyncio.wait_for(watch.read(), 5)  # the stream is open
            assert (snap.lease.lease_id, snap.snapshot) == (held.lease.lease_id, True)
            answer = await asyncio.wait_for(c.acquire("sci", 8), 5)
            assert (answer.lease.lease_id, answer.lease.state) == ("L2", pb.LEASE_STATE_REVOKED)
            assert answer.lease.end_cause.startswith("slurm: salloc: Requested node")
            # The holder hears the grant, then its end with the cause, in order.
            events = [await asyncio.wait_for(watch.read(), 5) for _ in range(2)]
            assert [(e.kind, e.lease.lease_id) for e in events] == [
                (pb.LEASE_EVENT_KIND_GRANTED, "L2"),
                (pb.LEASE_EVENT_KIND_REVOKED, "L2"),
            ]
            assert events[1].cause == answer.lease.end_cause
            # The GPUs are back: the next lease is placed on the node L2 could not have.
            again = await asyncio.wait_for(c.acquire("sci", 8), 5)
            assert again.lease.state == pb.LEASE_STATE_ACTIVE
            assert again.lease.allocation == {"backend": "gated", "nodes": "w001"}
            watch.cancel()

    run(scenario())


def test_an_acquire_waiting_for_its_allocation_is_cut_off_by_a_shutdown(tmp_path: Path) -> None:
    pool = GatedPool(config().pool)
    slow = pool.gate("L1")

    async def scenario() -> None:
        async with serve(tmp_path, backend=pool) as c:
            first = asyncio.ensure_future(c.acquire("sci", 8, idempotency_key="k1"))
            try:
                await until(lambda: "L1" in c.core.engine.leases)
                c.core.begin_shutdown()
                failed = await fails(first)
                # Like a queued Acquire cut off: retry against the restarted server.
                assert failed.code == grpc.StatusCode.UNAVAILABLE
                assert "allocation" in failed.message
            finally:
                slow.set()
        # Restarted: the retry with the same key gets the lease, placed.
        async with serve(tmp_path, backend=GatedPool(config().pool)) as c:
            again = await asyncio.wait_for(c.acquire("sci", 8, idempotency_key="k1"), 5)
            assert again.lease.lease_id == "L1" and again.lease.allocation["nodes"] == "w000"

    run(scenario())
