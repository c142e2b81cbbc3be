"""The one clock: the manual clock wakes exactly the sleepers due, on any loop or thread."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from functools import partial

import pytest

from bursar.broker.clock import (
    SYSTEM,
    Clock,
    FuncClock,
    ManualClock,
    SystemClock,
    as_clock,
    wait_event_until,
    wait_for,
)
from bursar.testing import apoll_until, poll_until

pytestmark = pytest.mark.timeout(30)


# Polls (real time) until a condition holds: the test's own bound, not its assertion.
until = partial(poll_until, interval_s=0.001)
until_async = partial(apoll_until, interval_s=0.0)


def test_clocks_satisfy_the_protocol() -> None:
    assert isinstance(SYSTEM, Clock)
    assert isinstance(ManualClock(), Clock)
    assert isinstance(FuncClock(time.time), Clock)
    assert as_clock(None) is SYSTEM
    manual = ManualClock(3.0)
    assert as_clock(manual) is manual
    wrapped = as_clock(lambda: 42.0)
    assert isinstance(wrapped, FuncClock) and wrapped.now() == 42.0
    with pytest.raises(TypeError):
        as_clock(5)  # type: ignore[arg-type]


def test_manual_clock_moves_forward_only() -> None:
    clock = ManualClock(100.0)
    assert clock.now() == 100.0
    clock.advance(2.5)
    assert clock.now() == 102.5
    clock.set(110.0)
    assert clock.now() == 110.0
    clock.set(110.0)  # standing still is allowed
    with pytest.raises(ValueError):
        clock.advance(-1)
    with pytest.raises(ValueError):
        clock.set(109.0)
    assert clock.now() == 110.0


def test_async_sleepers_wake_at_exact_times() -> None:
    clock = ManualClock(0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, t: float) -> None:
        await clock.sleep_until(t)
        woke.append((name, clock.now()))

    async def main() -> None:
        tasks = [asyncio.create_task(sleeper(n, t)) for n, t in (("a", 5), ("b", 10), ("c", 7))]
        await until_async(lambda: clock.sleepers() == 3)
        assert clock.next_deadline() == 5 and clock.deadlines() == [5, 7, 10]
        clock.advance(4.999)
        for _ in range(5):
            await asyncio.sleep(0)
        assert woke == [] and clock.sleepers() == 3
        clock.advance(0.001)
        await until_async(lambda: len(woke) == 1)
        assert woke == [("a", 5.0)] and clock.sleepers() == 2
        clock.set(10.0)
        await asyncio.gather(*tasks)
        assert woke[0] == ("a", 5.0)
        assert sorted(woke[1:]) == [("b", 10.0), ("c", 10.0)]
        assert clock.sleepers() == 0 and clock.next_deadline() is None

    asyncio.run(main())


def test_sleep_until_a_past_time_returns_without_waiting() -> None:
    clock = ManualClock(50.0)

    async def main() -> None:
        await clock.sleep_until(50.0)
        await clock.sleep_until(-math.inf)
        assert clock.sleepers() == 0

    asyncio.run(main())


def test_cancelled_sleeper_stops_counting() -> None:
    clock = ManualClock()

    async def main() -> None:
        task = asyncio.create_task(clock.sleep_until(1.0))
        await until_async(lambda: clock.sleepers() == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert clock.sleepers() == 0
        clock.advance(2.0)  # nothing left to wake, and no error from the cancelled future

    asyncio.run(main())


def test_advance_from_another_thread_wakes_sleepers_on_two_loops() -> None:
    """Each sleeper is woken on its own loop, by a thread that runs neither."""
    clock = ManualClock(0.0)
    woke: dict[str, float] = {}
    threads = []

    def run_loop(name: str, t: float) -> None:
        async def main() -> None:
            await clock.sleep_until(t)
            woke[name] = clock.now()

        asyncio.run(main())

    for name, t in (("x", 1.0), ("y", 2.0)):
        th = threading.Thread(target=run_loop, args=(name, t))
        th.start()
        threads.append(th)
    until(lambda: clock.sleepers() == 2)
    clock.advance(1.0)
    threads[0].join(10)
    assert woke == {"x": 1.0}
    assert threads[1].is_alive() and clock.sleepers() == 1
    clock.advance(1.0)
    threads[1].join(10)
    assert woke == {"x": 1.0, "y": 2.0}


def test_thread_waiters_wake_when_their_deadline_passes() -> None:
    clock = ManualClock(0.0)
    results: dict[str, tuple[bool, float]] = {}

    def waiter(name: str, t: float) -> None:
        reached = clock.wait_until(t)
        results[name] = (reached, clock.now())

    threads = {
        n: threading.Thread(target=waiter, args=(n, t)) for n, t in (("early", 3), ("late", 8))
    }
    for th in threads.values():
        th.start()
    until(lambda: clock.sleepers() == 2)
    clock.advance(3.0)
    threads["early"].join(10)
    assert results == {"early": (True, 3.0)}
    assert threads["late"].is_alive()
    clock.advance(10.0)
    threads["late"].join(10)
    assert results["late"] == (True, 13.0)
    assert clock.sleepers() == 0


def test_thread_wait_ends_false_when_stop_is_set() -> None:
    clock = ManualClock(0.0)
    stop = threading.Event()
    result: list[bool] = []
    th = threading.Thread(target=lambda: result.append(clock.wait_until(100.0, stop)))
    th.start()
    until(lambda: clock.sleepers() == 1)
    stop.set()
    th.join(10)
    assert result == [False]
    assert clock.sleepers() == 0
    assert clock.now() == 0.0
    # A stop already set wins even over a time already reached, so a loop driven by
    # ``while wait_until(t, stop)`` ends however far behind the clock it runs.
    assert clock.wait_until(0.0, stop) is False
    assert clock.wait_until(0.0, threading.Event()) is True
    assert clock.wait_until(0.0) is True


def test_wait_event_until_returns_on_the_event_or_the_clock() -> None:
    clock = ManualClock(0.0)

    async def main() -> None:
        event = asyncio.Event()
        task = asyncio.create_task(wait_event_until(clock, event, 5.0))
        await until_async(lambda: clock.sleepers() == 1)
        clock.advance(5.0)
        assert await task is False
        assert clock.sleepers() == 0

        task = asyncio.create_task(wait_event_until(clock, event, 100.0))
        await until_async(lambda: clock.sleepers() == 1)
        event.set()
        assert await task is True
        assert clock.sleepers() == 0  # the clock sleeper was cancelled with it
        assert clock.now() == 5.0

        event.clear()
        task = asyncio.create_task(wait_event_until(clock, event, math.inf))
        for _ in range(5):
            await asyncio.sleep(0)
        assert clock.sleepers() == 0  # an infinite deadline never sleeps on the clock
        event.set()
        assert await task is True

    asyncio.run(main())


def test_wait_for_returns_the_result_or_times_out_on_the_clock() -> None:
    clock = ManualClock(10.0)

    async def main() -> None:
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(wait_for(clock, asyncio.shield(fut), 12.0))
        await until_async(lambda: clock.sleepers() == 1)
        clock.advance(1.0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()
        fut.set_result("granted")
        assert await task == "granted"
        assert clock.sleepers() == 0

        never: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(wait_for(clock, asyncio.shield(never), 12.0))
        await until_async(lambda: clock.sleepers() == 1)
        clock.set(12.0)
        with pytest.raises(TimeoutError):
            await task
        assert not never.done()  # shielded: only the wrapper was cancelled

        inner = asyncio.create_task(asyncio.Event().wait())
        task = asyncio.create_task(wait_for(clock, inner, 20.0))
        await until_async(lambda: clock.sleepers() == 1)
        task.cancel()  # cancelling the caller cancels what it waited for
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait({inner})
        assert inner.cancelled() and clock.sleepers() == 0

        async def boom() -> None:
            raise KeyError("x")

        with pytest.raises(KeyError):
            await wait_for(clock, boom(), math.inf)

    asyncio.run(main())


def test_system_clock_reads_and_sleeps_on_the_wall_clock() -> None:
    clock = SystemClock()
    before = time.time()
    assert before <= clock.now() <= time.time()

    async def main() -> None:
        t = clock.now() + 0.02
        await clock.sleep_until(t)
        assert clock.now() >= t

    asyncio.run(main())
    t = clock.now() + 0.02
    assert clock.wait_until(t) is True
    assert clock.now() >= t
    stop = threading.Event()
    stop.set()
    assert clock.wait_until(clock.now() + 3600, stop) is False


def test_func_clock_follows_its_function() -> None:
    offset = [0.0]
    clock = FuncClock(lambda: time.time() + offset[0])
    offset[0] = 1000.0
    # The function already reads past the deadline: no real wait at all.
    assert clock.wait_until(time.time() + 500.0) is True

    async def main() -> None:
        await clock.sleep_until(time.time() + 500.0)

    asyncio.run(main())
