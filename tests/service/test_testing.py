"""bursar.testing: the poll that fails with what it last saw, the clock that jumps when
the loop is idle, and a real broker on a thread driven by it."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg
from bursar.testing import AutojumpClock, apoll_until, local_broker, on_thread, poll_until


def test_poll_until_returns_the_first_true_value() -> None:
    seen = iter([0, None, "", "ready"])
    assert poll_until(lambda: next(seen), 5, interval_s=0) == "ready"


def test_poll_until_fails_with_what_it_last_saw() -> None:
    with pytest.raises(AssertionError) as e:
        poll_until(lambda: None, 0.05)
    assert "the condition: not reached within 0.05 s; last seen: None" in str(e.value)
    counts = iter([{"pending": 3}, {"pending": 2}])
    last = {"pending": 1}
    with pytest.raises(AssertionError, match=r"queue drained: .* last seen: \{'pending': 1\}"):
        poll_until(lambda: next(counts, last), 0.05, "queue drained", ok=lambda c: not c["pending"])
    assert poll_until(lambda: {"pending": 0}, 1, ok=lambda c: not c["pending"]) == {"pending": 0}


def test_apoll_until_awaits_a_coroutine_check() -> None:
    async def scenario() -> str:
        box: list[str] = []
        asyncio.get_running_loop().call_later(0.05, box.append, "done")

        async def check() -> str | None:
            return box[0] if box else None

        return await apoll_until(check, 5, "the callback")

    assert asyncio.run(scenario()) == "done"


def test_the_autojump_clock_runs_an_hour_of_sleeps_in_order_at_once() -> None:
    clock = AutojumpClock(1000.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, t: float) -> None:
        await clock.sleep_until(t)
        woke.append((name, clock.now()))

    async def scenario() -> None:
        await asyncio.gather(sleeper("c", 4600.0), sleeper("a", 1060.0), sleeper("b", 1900.0))

    start = time.monotonic()
    asyncio.run(scenario())
    assert woke == [("a", 1060.0), ("b", 1900.0), ("c", 4600.0)]
    assert time.monotonic() - start < 5  # an hour of sleeps, no real waiting


def test_the_autojump_clock_waits_while_the_loop_is_busy() -> None:
    clock = AutojumpClock(0.0)

    async def scenario() -> float:
        sleeper = asyncio.ensure_future(clock.sleep_until(60.0))
        for _ in range(20):  # work on the loop that touches the clock each turn
            clock.advance(0.5)
            await asyncio.sleep(0)
        assert not sleeper.done() and clock.now() == 10.0
        await sleeper
        return clock.now()

    assert asyncio.run(scenario()) == 60.0
    with pytest.raises(ValueError):
        AutojumpClock(0.0, threshold_s=-1)


def test_a_real_broker_expires_a_lease_on_the_autojump_clock() -> None:
    # A 10-minute lease ends on the broker's own timer, on its thread's loop, with no
    # advance from the test and no real ten minutes.
    clock = AutojumpClock(1_750_000_000.0, threshold_s=0.05)
    with local_broker(clock=clock) as b:
        channel = grpc.insecure_channel(b.address)
        stub = pbg.BrokerStub(channel)
        md = (("authorization", f"Bearer {b.tokens['sci']}"),)
        got = stub.Acquire(pb.AcquireRequest(size={"cpu": 1}, duration_s=600), metadata=md)
        lease_id = got.lease.lease_id

        def state() -> int:
            req = pb.GetLeaseRequest(lease_id=lease_id)
            return stub.GetLease(req, metadata=md).state

        poll_until(state, 20, "the lease expired", ok=lambda s: s == pb.LEASE_STATE_EXPIRED)
        assert clock.now() >= got.lease.expires_at
        channel.close()


def test_on_thread_raises_a_failure_to_start_in_the_caller() -> None:
    @asynccontextmanager
    async def broken() -> Any:
        raise OSError("port in use")
        yield

    with pytest.raises(RuntimeError, match="did not start: OSError") as e, on_thread(broken):
        pass
    assert isinstance(e.value.__cause__, OSError)
