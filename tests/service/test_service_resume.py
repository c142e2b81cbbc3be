"""Resuming: the rebuilt simulated pool matches the one that was running, and a journal
failure stops the server instead of letting it drift from what was recorded."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from service_support import config, fails, run, serve

from bursar.broker.backends.simulated import SimulatedPool
from bursar.broker.decisions import Granted
from bursar.broker.events import RequestLease
from bursar.broker.runtime import Runtime, pool_view
from bursar.protos.bursar.v1 import broker_pb2 as pb


def test_resume_backend_rebuilds_the_node_states_the_live_pool_had(tmp_path: Path) -> None:
    with Runtime.open(tmp_path, config(), at=100.0) as b:
        b.submit(RequestLease(101.0, "sci", {"gpu": 8}, 600))  # w000
        b.submit(RequestLease(101.5, "other", {"gpu": 8}, 600))  # w001
        out = b.submit(RequestLease(102.0, "sci", {"gpu": 8}, 600))  # the cold node boots
        cold = next(d for d in out if isinstance(d, Granted))
        b.backend.fail("w001", 102.2)  # a node is lost: other's lease is revoked
        b.catch_up(102.3)
        live = dict(b.backend.node_states())
        assert {s.value for s in live.values()} == {"on", "down", "booting"}
        rebuilt = SimulatedPool(b.engine.pool_spec)
        rebuilt.adopt(*pool_view(b.engine), b.engine.now)
        assert dict(rebuilt.node_states()) == live
        assert dict(rebuilt.placements()) == dict(b.backend.placements())
        assert rebuilt.next_event_time() == pytest.approx(cold.starts_at)
        # It reports the boot at the time the engine planned for, and not before.
        assert rebuilt.due_events(cold.starts_at - 0.01) == []
        (ready,) = rebuilt.due_events(cold.starts_at)
        assert ready.node == "c000" and ready.at == pytest.approx(cold.starts_at)


def test_a_journal_write_failure_stops_the_server(tmp_path: Path) -> None:
    async def scenario() -> None:
        with pytest.raises(ExceptionGroup) as caught:
            async with serve(tmp_path) as c:
                await c.acquire("sci", 8)
                # The disk goes away under the broker.
                c.core.runtime.journal._conn.close()
                d = await fails(c.acquire("sci", 8))
                assert d.code == grpc.StatusCode.UNAVAILABLE and d.reason == "JOURNAL_FAILED"
                d = await fails(c.acquire("sci", 1))
                assert d.code == grpc.StatusCode.UNAVAILABLE
                await c.core.supply_changed(5)  # the timer task fails and ends the server
        assert "journal" in str(caught.value.exceptions[0]).lower()

    run(scenario())


def test_one_server_per_state_directory(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            before = c.journal_len()
            with pytest.raises(ValueError, match="another bursar serve is using"):
                async with serve(tmp_path):
                    pass
            assert c.journal_len() == before
            assert (await c.acquire("sci", 8)).lease.state == pb.LEASE_STATE_ACTIVE
        async with serve(tmp_path) as again:  # released on close
            assert again.journal_len() == before + 1

    run(scenario())
