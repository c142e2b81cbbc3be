"""The stall log names the service's own work in a spell that held the event loop: a
backlog of calls deciding one after another is told apart from a spell nobody explains."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from service_support import START, config

from bursar.broker.events import RequestLease
from bursar.broker.runtime import HeldBack, Runtime
from bursar.broker.service import stalls
from bursar.broker.service.metrics import Metrics

CALLS = 2000


def test_a_backlog_of_decisions_is_named_in_the_spell_it_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Runtime.open(tmp_path, config(), at=START) as rt:
        rt.deferral = HeldBack(rt)
        probes = stalls.StallLog()
        probes.install(rt, Metrics())

        async def main() -> None:
            beat = asyncio.create_task(probes.run())
            await asyncio.sleep(0.03)  # the heartbeat is asleep: what follows holds the loop
            for i in range(CALLS):
                rt.submit(RequestLease(START + 1 + i / 1000, "sci", {"gpu": 1}, 600))
            await asyncio.sleep(0.05)
            beat.cancel()
            await beat

        with caplog.at_level(logging.WARNING, logger=stalls.__name__):
            asyncio.run(main())
            probes.uninstall()
        # Uninstalled, the runtime and its journal are as they were (the entries are
        # committed on the way out).
        assert "submit" not in vars(rt) and "commit" not in vars(rt.journal)
    # The burst is one spell (a busy machine may add others, with no work in them).
    held = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    held = [m for m in held if "work: decide 0 calls" not in m]
    assert len(held) == 1, caplog.text
    # Each submit caught up with the clock first: that call is counted in the submit only.
    assert f"work: decide {CALLS} calls" in held[0]
    assert f"append {CALLS} calls" in held[0] and "commit 0 calls" in held[0]
    assert "; longest " in held[0] and "ms, runtime.submit RequestLease, 1 decisions" in held[0]
