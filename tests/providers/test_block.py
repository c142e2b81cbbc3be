"""The lease-block life cycle the Parsl, Dask and Ray plugins share (providers/block.py):
its transition table, and blocks against a real broker over gRPC, with their timers on a
ManualClock and real worker processes."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import psutil
import pytest
from elastic_support import GRACE_S, cpu_intent, elastic_config
from parsl_support import parsl_config
from service_support import run, serve, until

from bursar.broker.clock import ManualClock
from bursar.providers.block import (
    TRANSITIONS,
    Block,
    Cause,
    Hooks,
    IllegalTransition,
    Input,
    LeaseSpec,
    ProcessTree,
    Retry,
    State,
    transition,
)
from bursar.providers.client import (
    AsyncBrokerClient,
    Backoff,
    FailedPrecondition,
    Lease,
    LeaseState,
    NotFound,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)

# Ignores SIGTERM (as Ray's agents do), so only the KILL after the grace ends it.
STUBBORN = (
    "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); time.sleep(600)"
)
"""Ignores SIGTERM, then says so: it leaves a file named by its pid in the folder given."""


def test_the_transition_table() -> None:
    assert transition(State.REQUESTED, Input.ASK) is State.ACQUIRING
    assert transition(State.ACQUIRING, Input.REFUSED) is State.REQUESTED
    assert transition(State.ACQUIRING, Input.CANCEL) is State.ENDED  # the call is cut
    assert transition(State.RUNNING, Input.PREEMPTED) is State.DRAINING
    assert transition(State.DRAINING, Input.LEASE_ENDED) is State.STOPPING
    assert transition(State.STOPPING, Input.WORKERS_EXITED) is State.STOPPING
    for illegal in [
        (State.REQUESTED, Input.GRANTED),
        (State.STARTING, Input.WORKERS_EXITED),  # no workers before RUNNING
        (State.RUNNING, Input.DRAINED),
        (State.ENDED, Input.ASK),
        (State.FAILED, Input.CANCEL),
    ]:
        with pytest.raises(IllegalTransition):
            transition(*illegal)
    # Every state is reachable from REQUESTED; only ENDED and FAILED have no way out, and
    # every live state can be cancelled and can fail.
    seen, todo = {State.REQUESTED}, [State.REQUESTED]
    while todo:
        s = todo.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is s and dst not in seen:
                seen.add(dst)
                todo.append(dst)
    assert seen == set(State)
    for s in State:
        assert s.terminal == (not any(src is s for src, _ in TRANSITIONS))
        if not s.terminal:
            assert (s, Input.CANCEL) in TRANSITIONS and (s, Input.ERROR) in TRANSITIONS


class Recorder(Hooks):
    """Starts ``argv`` as the block's workers and records what the block did."""

    def __init__(self, argv: list[str] | None = None, drain_s: float = 0.0) -> None:
        self.argv = argv
        self.drain_s = drain_s
        self.steps: list[tuple[State, Input]] = []
        self.drained: list[float | None] = []
        self.graces: list[float] = []

    async def start_workers(self, block: Block, lease: Lease) -> ProcessTree | None:
        if self.argv is None:
            return None
        return ProcessTree(subprocess.Popen(self.argv, start_new_session=True))

    async def drain(self, block: Block, deadline: float | None) -> None:
        self.drained.append(deadline)
        await asyncio.sleep(self.drain_s)

    def stop_grace(self, block: Block) -> float:
        grace = 0.3
        self.graces.append(grace)
        return grace

    def changed(self, block: Block, old: State, inp: Input) -> None:
        if block.state is not old:
            self.steps.append((block.state, inp))


def states(h: Recorder) -> list[State]:
    return [s for s, _ in h.steps]


def spec(size: Mapping[str, float], duration_s: float = 30.0) -> LeaseSpec:
    return LeaseSpec(size, duration_s, labels={"engine": "test"})


def test_a_refused_block_asks_again_when_its_clock_says_so(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(time.time())
        async with (
            serve(tmp_path / "state", parsl_config()) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["capped"], backoff=FAST) as client,
        ):
            other = await client.acquire({"cpu": 2}, 30, blocking=False)  # capped's burst
            h = Recorder(["sleep", "60"])
            b = Block("b", client, spec({"cpu": 2}), h, retry=Retry(1.0, 5.0), clock=clock)
            b.start()
            await b.answered.wait()
            await until(lambda: b.retry_at is not None)
            assert b.state is State.REQUESTED and b.refusals == ["ABOVE_BURST"]
            assert b.retry_at is not None and 1.0 <= b.retry_at - clock.now() <= 5.0
            # It waits on the clock for the retry time, and only there: nothing asks again
            # before the clock says so.
            await until(lambda: clock.next_deadline() == b.retry_at)
            assert b.attempts == 1
            await client.release(other.id)
            clock.set(b.retry_at)
            await until(lambda: b.state is State.RUNNING, 10)
            assert b.attempts == 2 and b.workers is not None
            assert states(h) == [
                State.ACQUIRING,
                State.REQUESTED,
                State.ACQUIRING,
                State.STARTING,
                State.RUNNING,
            ]
            pid = b.workers.pid
            b.cancel()
            await asyncio.wait_for(b.done.wait(), 10)
            assert b.state is State.ENDED and b.cause is Cause.CANCELLED
            assert b.final_state == "released" and not psutil.pid_exists(pid or 0)
            assert (await client.get_lease(b.lease_id)).state is LeaseState.RELEASED

    run(scenario(), 30)


def test_a_preempted_block_drains_until_the_brokers_deadline_then_stops(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path / "state", parsl_config()) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST) as client,
            AsyncBrokerClient(srv.address, srv.tokens["hi"], backoff=FAST) as hi,
        ):
            h = Recorder(["sleep", "60"], drain_s=0.2)
            b = Block("b", client, spec({"cpu": 4}), h)
            b.start()
            await until(lambda: b.state is State.RUNNING, 10)
            await hi.acquire({"cpu": 2}, 30, blocking=False)  # reclaims wf's lease
            await asyncio.wait_for(b.done.wait(), 10)
            assert states(h)[-3:] == [State.DRAINING, State.STOPPING, State.ENDED]
            assert b.cause is Cause.PREEMPTED and b.ended_by_broker
            (deadline,) = h.drained
            assert deadline is not None and deadline > time.time() - 5
            assert b.workers is not None and not b.workers.alive()

    run(scenario(), 30)


def test_an_unrenewable_lease_drains_its_margin_before_it_expires(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(time.time())
        async with (
            serve(tmp_path / "state", parsl_config()) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST) as client,
        ):
            h = Recorder(["sleep", "60"])
            b = Block("b", client, spec({"cpu": 1}), h, expiry_margin_s=5.0, clock=clock)
            b.start()
            await until(lambda: b.state is State.RUNNING, 10)
            assert b.lease is not None
            expires = b.lease.expires_at
            due = expires - 5.0
            await until(lambda: clock.next_deadline() == due)
            clock.set(due - 0.5)
            # Not due yet: it still sleeps for exactly that time.
            await until(lambda: due in clock.deadlines())
            assert b.state is State.RUNNING
            clock.set(due)
            await asyncio.wait_for(b.done.wait(), 10)
            assert b.cause is Cause.UNRENEWABLE and not b.ended_by_broker
            assert h.drained == [expires]
            assert b.final_state == "released"

    run(scenario(), 30)


def test_workers_that_exit_end_the_block_and_a_rejected_request_fails_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path / "state", parsl_config()) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST) as client,
            AsyncBrokerClient(srv.address, srv.tokens["capped"], backoff=FAST) as capped,
            AsyncBrokerClient(srv.address, "not-a-token", backoff=FAST) as stranger,
        ):
            b = Block("b", client, spec({"cpu": 1}), Recorder([sys.executable, "-c", "exit(3)"]))
            b.start()
            await asyncio.wait_for(b.done.wait(), 10)
            assert b.state is State.ENDED and b.cause is Cause.EXITED and b.returncode == 3
            assert b.final_state == "released"

            bad = Block("bad", stranger, spec({"cpu": 1}), Recorder())
            bad.start()
            await asyncio.wait_for(bad.done.wait(), 10)
            assert bad.state is State.FAILED and bad.cause is Cause.REJECTED
            assert "INVALID_TOKEN" in str(bad.error) and bad.final_state == "none"

            # Without retries (Ray's autoscaler retries itself) a refusal ends the block.
            await capped.acquire({"cpu": 2}, 30, blocking=False)  # capped's whole burst
            more = Block("more", capped, spec({"cpu": 1}), Recorder(), retry=Retry(refusals=False))
            more.start()
            await asyncio.wait_for(more.done.wait(), 10)
            assert more.state is State.ENDED and more.cause is Cause.REFUSED
            assert more.refusals == ["ABOVE_BURST"] and more.attempts == 1

    run(scenario(), 30)


def test_a_process_tree_is_stopped_whole_and_nothing_else(tmp_path: Path) -> None:
    outsider = subprocess.Popen(["sleep", "60"], start_new_session=True)
    # A root (bash, then `sleep`) with a stubborn child, and a stubborn process that left
    # the tree (a double fork into a session of its own) but carries the tree's marker.
    ready = tmp_path / "ready"
    ready.mkdir()
    script = (
        f'{sys.executable} -c "{STUBBORN}" {ready} &\n'
        f'( setsid {sys.executable} -c "{STUBBORN}" {ready} & )\n'
        "exec sleep 60\n"
    )
    marker = uuid.uuid4().hex
    root = subprocess.Popen(
        ["bash", "-c", script], start_new_session=True, env={"PATH": "/usr/bin:/bin", "M": marker}
    )
    tree = ProcessTree(root, marker=f"M={marker}")
    try:

        def stubborn() -> set[psutil.Process]:
            return {p for p in tree.members() if p.name().startswith("python")}

        # Both ignore SIGTERM before the tree is stopped: on a busy machine a process can
        # be seen by name before its handler is set, and a TERM then ends it at once.
        deadline = time.monotonic() + 10
        while (len(stubborn()) < 2 or len(list(ready.iterdir())) < 2) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        members = tree.members()
        assert len(members) == 3, members
        assert (
            len({p.pid for p in members} - {p.pid for p in psutil.Process(root.pid).children()})
            == 2
        )
        t0 = time.monotonic()
        signalled = tree.stop(0.5)
        assert time.monotonic() - t0 >= 0.5  # the stubborn ones waited out their grace
        assert {p.pid for p in members} <= {p.pid for p in signalled}
        assert not tree.alive() and root.returncode == -15
        assert outsider.poll() is None  # never touched
    finally:
        tree.stop(0)
        outsider.kill()
        outsider.wait()


def test_a_cancel_while_the_broker_does_not_answer_ends_the_block_at_once() -> None:
    async def scenario() -> None:
        # The client's retry pauses are on a manual clock that never moves: a cancel that
        # waited for the Acquire to give up would wait for ever.
        clock = ManualClock(1_750_000_000.0)
        async with AsyncBrokerClient(
            "127.0.0.1:1", "t", backoff=FAST, retry_timeout_s=60, clock=clock
        ) as c:
            b = Block("b", c, spec({"cpu": 1}), Recorder(), clock=clock)
            b.start()
            # The Acquire failed against nobody and its retry pause is on the clock.
            await until(lambda: b.state is State.ACQUIRING and clock.sleepers() > 0, 10)
            b.cancel()
            await asyncio.wait_for(b.done.wait(), 5)
            assert b.state is State.ENDED and b.cause is Cause.CANCELLED
            assert b.final_state == "none"

    run(scenario(), 30)


class ResizeRecorder(Recorder):
    """A :class:`Recorder` that also records the resize hooks' calls."""

    def __init__(self, argv: list[str] | None = None) -> None:
        super().__init__(argv)
        self.started_on: list[dict[str, float]] = []
        self.warned: list[tuple[dict[str, float], dict[str, float], float | None]] = []
        self.sizes: list[dict[str, float]] = []

    async def start_workers(self, block: Block, lease: Lease) -> ProcessTree | None:
        self.started_on.append(block.usable)
        return await super().start_workers(block, lease)

    async def resize(
        self,
        block: Block,
        lease: Lease,
        warned_to: Mapping[str, float],
        deadline: float | None,
    ) -> None:
        self.warned.append((dict(lease.size), dict(warned_to), deadline))

    async def resized(self, block: Block, lease: Lease) -> None:
        self.sizes.append(dict(lease.size))


def test_an_elastic_block_hears_its_growth_and_its_shrink_without_changing_state(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        clock = ManualClock(time.time())
        async with (
            serve(tmp_path / "state", elastic_config(), clock=clock) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["el"], backoff=FAST, clock=clock) as el,
            AsyncBrokerClient(srv.address, srv.tokens["fixed"], backoff=FAST) as fixed,
        ):
            h = ResizeRecorder(["sleep", "60"])
            intent = cpu_intent(1, 4)
            b = Block("b", el, LeaseSpec({}, 60.0, intent=intent), h, clock=clock)
            b.start()
            await until(lambda: b.state is State.RUNNING, 10)
            # Granted at min and grown at once to the whole (empty) pool: the workers
            # start on all of it.
            assert b.lease is not None and b.lease.size["cpu"] == 4.0
            assert h.started_on == [{"cpu": 4.0}]
            # The growth's RESIZED is an event of its own: on a busy machine it can be
            # heard after RUNNING, so wait for it rather than expect it already there.
            await until(lambda: bool(b.resize_history), 10)
            assert b.resize_history[0][1] is Input.RESIZED

            # A fixed request needs two cores: the block is warned, keeps running, and
            # may use only what is left until the deadline.
            t0 = clock.now()
            want = asyncio.ensure_future(fixed.acquire({"cpu": 2}, 30, timeout=20))
            await until(lambda: bool(h.warned), 10)
            ((whole, to, deadline),) = h.warned
            assert whole == {"cpu": 4.0} and to == {"cpu": 2.0}
            assert deadline is not None and abs(deadline - (t0 + GRACE_S)) < 1e-6
            assert b.state is State.RUNNING and b.usable == {"cpu": 2.0}
            assert b.warned_to == {"cpu": 2.0} and b.resize_deadline == deadline
            assert not want.done()

            # At the deadline the lease shrinks: the block hears the new whole.
            await until(lambda: deadline in clock.deadlines(), 10)
            clock.set(deadline)
            # (The growth's own RESIZED may be heard after RUNNING on a busy machine: the
            # grant's answer already carried it, and hearing it again changes nothing.)
            await until(lambda: bool(h.sizes) and h.sizes[-1] == {"cpu": 2.0}, 10)
            assert all(x == {"cpu": 4.0} for x in h.sizes[:-1]), h.sizes
            assert b.lease.size["cpu"] == 2.0
            assert b.warned_to is None and b.usable == {"cpu": 2.0}
            got = await asyncio.wait_for(want, 10)
            assert got.size["cpu"] == 2.0
            assert b.state is State.RUNNING and states(h) == [
                State.ACQUIRING,
                State.STARTING,
                State.RUNNING,
            ]
            # Resize inputs change no state, and while stopping they change nothing.
            for s in (State.STARTING, State.RUNNING, State.DRAINING, State.STOPPING):
                for inp in (Input.RESIZE_WARNING, Input.RESIZED):
                    assert transition(s, inp) is s
            with pytest.raises(IllegalTransition):
                transition(State.REQUESTED, Input.RESIZED)
            b.cancel()
            await asyncio.wait_for(b.done.wait(), 10)
            assert b.final_state == "released"

    run(scenario(), 40)


def test_a_waiting_block_logs_once_per_reason_and_says_how_long(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        clock = ManualClock(time.time())
        async with (
            serve(tmp_path / "state", parsl_config()) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["capped"], backoff=FAST) as client,
        ):
            other = await client.acquire({"cpu": 2}, 30, blocking=False)  # capped's burst
            b = Block("w", client, spec({"cpu": 2}), Recorder(), retry=Retry(1.0, 5.0), clock=clock)
            b.start()
            for attempt in (1, 2, 3):
                await until(lambda n=attempt: b.retry_at is not None and b.attempts == n)
                # The status line an engine shows: the reason and a readable retry time.
                assert b.refusal.startswith("ABOVE_BURST: ")
                assert re.search(r"again in \d(\.\d)?s\)$", b.refusal), b.refusal
                await until(lambda: clock.next_deadline() == b.retry_at)
                if attempt < 3:
                    clock.set(b.retry_at)
            assert b.refusals == ["ABOVE_BURST"] * 3
            await client.release(other.id)
            b.cancel()
            await b.done.wait()

    with caplog.at_level(logging.INFO, logger="bursar.providers"):
        run(scenario())
    waits = [r for r in caplog.records if "waiting for the broker" in r.getMessage()]
    # Three refusals for the same reason: one INFO line.
    assert len(waits) == 1 and waits[0].levelno == logging.INFO
    assert "ABOVE_BURST" in waits[0].getMessage() and "it expects about" in waits[0].getMessage()


def test_a_block_adopts_a_live_lease_and_its_running_workers(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(time.time())
        async with (
            serve(tmp_path / "state", parsl_config()) as srv,
            AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST) as gone,
            AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST, clock=clock) as c,
        ):
            # What a process now gone left: a lease and the workers it started on it.
            lease = await gone.acquire({"cpu": 1}, 30, blocking=False)
            ended = await gone.acquire({"cpu": 1}, 30, blocking=False)
            await gone.release(ended.id)
            workers = subprocess.Popen(["sleep", "60"], start_new_session=True)
            try:
                with pytest.raises(NotFound):
                    await c.adopted_lease("L999999", 30).start()
                with pytest.raises(FailedPrecondition) as info:
                    await c.adopted_lease(ended.id, 30).start()
                assert info.value.reason == "LEASE_ENDED" and "RELEASED" in info.value.message

                h = Recorder(["false"])  # never run: an adopted block starts no workers
                b = Block("b", c, spec({"cpu": 1}), h, clock=clock)
                handle = c.adopted_lease(lease.id, 30)
                await handle.start()
                b.adopt(handle, ProcessTree(pid=workers.pid))
                await b.answered.wait()
                assert b.state is State.RUNNING and b.adopted and b.lease_id == lease.id
                assert h.steps == [(State.RUNNING, Input.ADOPTED)]
                assert b.workers is not None and b.workers.pid == workers.pid
                # Renewed on the adopter's clock, from the adoption on.
                assert handle.renew_margin_s == 15.0
                renewed = (await c.get_lease(lease.id)).expires_at
                assert renewed > lease.expires_at
                await until(lambda: clock.next_deadline() is not None)
                clock.advance(16.0)
                await until(lambda: handle.renewals == 1, 10)

                # Its workers' exit is seen through a pidfd (the tree has no Popen), and
                # the lease goes back as for any block.
                workers.kill()
                await asyncio.wait_for(b.done.wait(), 10)
                assert states(h)[-2:] == [State.STOPPING, State.ENDED]
                assert b.cause is Cause.EXITED and b.returncode is None
                assert (await c.get_lease(lease.id)).state is LeaseState.RELEASED
            finally:
                workers.kill()
                workers.wait()

    run(scenario(), 30)
