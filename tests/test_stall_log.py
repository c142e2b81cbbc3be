"""The stall log names the service's own work in a spell that held the event loop: a
backlog of calls deciding one after another is told apart from a spell nobody explains."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from bursar.broker.service import stalls


class _Journal:
    def append(self) -> None: ...

    def commit(self) -> None:
        _busy(0.01)

    def update_index(self) -> None: ...


class _Runtime:
    def __init__(self) -> None:
        self.journal = _Journal()

    def submit(self) -> None:
        _busy(0.02)
        self.catch_up()  # nested: counted in the outer call only

    def catch_up(self) -> None:
        _busy(0.005)


class _Metrics:
    def refresh(self) -> None: ...


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_backlog_of_decisions_is_named_in_the_spell_it_held(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = _Runtime()
    probes = stalls.StallLog()
    probes.install(runtime, _Metrics())  # type: ignore[arg-type]

    async def main() -> None:
        beat = asyncio.create_task(probes.run())
        await asyncio.sleep(0.03)  # the heartbeat is asleep: what follows holds the loop
        for _ in range(4):
            runtime.submit()
        runtime.journal.commit()
        await asyncio.sleep(0.05)
        beat.cancel()
        await beat

    with caplog.at_level(logging.WARNING, logger=stalls.__name__):
        asyncio.run(main())
        probes.uninstall()
    held = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    assert held, caplog.text
    assert "work: decide 4 calls" in held[0]
    assert "commit 1 calls" in held[0]
    assert "; longest " in held[0] and "ms, runtime.submit" in held[0]
    # Uninstalled, the objects are as they were.
    assert "submit" not in vars(runtime) and "commit" not in vars(runtime.journal)
