"""The simulator's kernel: ordering by (time, priority, seq), processes, signals, sources."""

from __future__ import annotations

import pytest

from bursar.sim.kernel import NORMAL, URGENT, Kernel, Signal, Sleep, Wait


def test_callbacks_run_in_time_then_priority_then_fifo_order() -> None:
    k = Kernel()
    seen: list[str] = []
    k.schedule(5.0, lambda: seen.append("t5-a"))
    k.schedule(1.0, lambda: seen.append("t1"))
    k.schedule(5.0, lambda: seen.append("t5-b"))
    k.schedule(5.0, lambda: seen.append("t5-urgent"), URGENT)
    k.schedule(3.0, lambda: seen.append("t3"), NORMAL)
    k.run(10.0)
    assert seen == ["t1", "t3", "t5-urgent", "t5-a", "t5-b"]
    assert k.now == 10.0


def test_run_stops_at_until_and_keeps_later_callbacks() -> None:
    k = Kernel()
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0):
        k.schedule(t, lambda t=t: seen.append(t))
    k.run(2.0)
    assert seen == [1.0, 2.0] and k.now == 2.0 and k.peek() == 3.0
    with pytest.raises(ValueError):
        k.schedule(1.5, lambda: None)


def test_processes_sleep_in_virtual_time_and_return() -> None:
    k = Kernel()
    log: list[tuple[str, float]] = []

    async def worker(name: str, gap: float) -> str:
        for _ in range(3):
            await Sleep(gap)
            log.append((name, k.now))
        return name

    a = k.spawn(worker("a", 2.0))
    b = k.spawn(worker("b", 3.0))
    k.run(100.0)
    # b scheduled its t=6 wake-up (at t=3) before a did (at t=4): first in, first out.
    assert log == [("a", 2.0), ("b", 3.0), ("a", 4.0), ("b", 6.0), ("a", 6.0), ("b", 9.0)]
    assert a.done.fired and a.done.value == "a" and b.done.value == "b"


def test_wait_on_a_signal_and_timeout() -> None:
    k = Kernel()
    sig = Signal()
    got: list[tuple[object, float]] = []

    async def waiter(timeout: float | None) -> None:
        got.append((await Wait(sig, timeout), k.now))

    async def firer() -> None:
        await Sleep(5.0)
        sig.succeed(k, "go")

    k.spawn(waiter(None))
    k.spawn(waiter(2.0))
    k.spawn(firer())
    k.run(10.0)
    assert sorted(got, key=lambda x: x[1]) == [(None, 2.0), ("go", 5.0)]
    with pytest.raises(RuntimeError):
        sig.succeed(k)


def test_a_process_awaiting_something_else_is_an_error() -> None:
    k = Kernel()

    class Foreign:
        def __await__(self):
            yield "not a command"

    async def bad() -> None:
        await Foreign()

    k.spawn(bad())
    with pytest.raises(TypeError, match="await only kernel commands"):
        k.run(1.0)


def test_sources_fire_before_callbacks_at_the_same_time() -> None:
    k = Kernel()
    seen: list[str] = []

    class Src:
        def __init__(self) -> None:
            self.times = [2.0, 4.0]

        def next_time(self) -> float | None:
            return self.times[0] if self.times else None

        def fire(self, t: float) -> None:
            seen.append(f"src@{t}")
            self.times.pop(0)

    k.add_source(Src())
    k.schedule(2.0, lambda: seen.append("cb@2"))
    k.schedule(3.0, lambda: seen.append("cb@3"))
    k.run(3.5)
    assert seen == ["src@2.0", "cb@2", "cb@3"]


def test_same_schedule_same_trace() -> None:
    def trace() -> list[tuple[float, int]]:
        k = Kernel()
        out: list[tuple[float, int]] = []

        async def p(i: int) -> None:
            for j in range(5):
                await Sleep((i * 7 + j * 3) % 4)
                out.append((k.now, i))

        for i in range(6):
            k.spawn(p(i))
        k.run(100.0)
        return out

    assert trace() == trace()
