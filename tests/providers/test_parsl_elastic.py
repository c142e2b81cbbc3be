"""An elastic Parsl block end to end: a real HighThroughputExecutor whose one block is an
elastic lease from a real broker over gRPC, grown at once to the empty pool (a worker
pool per unit) and shrunk, its extra managers drained before the deadline, when another
campaign's fixed request needs the cores."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_support import ServerThread, server_thread, until
from elastic_support import GRACE_S, elastic_config
from test_parsl_workflow import (
    FAST,
    N,
    check,
    loaded,
    make_provider,
    no_leases_of,
    venv_on_path,  # noqa: F401  (autouse: HTEX starts its processes from PATH)
    workflow,
)

from bursar.providers.client import BrokerClient

pytestmark = pytest.mark.slow

ELASTIC = {"min": 1, "max": 4, "work": 5000, "deadline": 3000, "amdahl": 0.05}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state", cfg=elastic_config()) as s:
        yield s


def test_an_elastic_block_grows_then_drains_the_managers_a_shrink_takes(
    server: ServerThread, tmp_path: Path
) -> None:
    p = make_provider(
        server, "el", resources_per_block={"cpu": 1}, min_blocks=1, max_blocks=1, elastic=ELASTIC
    )
    with loaded(p, tmp_path / "runinfo") as dfk:
        ex = dfk.executors["htex"]

        def managers() -> list[str]:
            return sorted(m["manager"] for m in ex.connected_managers())

        # Granted at one unit and grown at once to the pool's four cores: a pool each.
        until(lambda: len(managers()) == 4, 60, "four managers")
        (job,) = p.resources
        b = p.resources[job]
        lease = b.block.lease
        assert lease is not None and lease.size["cpu"] == 4.0
        extra = [b.manager_id(k, lease) for k in (1, 2, 3)]
        assert set(extra) < set(managers())

        squares, final = workflow(0.15)
        until(lambda: sum(f.done() for f in squares) >= 10, 30, "ten results")
        with BrokerClient(server.address, server.tokens["fixed"], backoff=FAST) as fx:
            t0 = time.time()
            got = fx.acquire({"cpu": 2}, 30, timeout=30)  # waits for the shrink
            assert got.campaign == "fixed"
            until(lambda: bool(b.resizes), 10, "the drain for the shrink")
            (shrink,) = b.resizes
            assert shrink.units == 2 and shrink.deadline is not None
            assert abs(shrink.deadline - (t0 + GRACE_S)) < 1.0
            # The highest units' managers were held, their tasks finished, and their
            # pools stopped before the deadline.
            assert shrink.held == [b.manager_id(3, lease), b.manager_id(2, lease)]
            assert shrink.drained_idle and shrink.done_at <= shrink.deadline
            print(f"shrink done {shrink.deadline - shrink.done_at:.2f} s before its deadline")
            assert sum(f.done() for f in squares) < N, "the shrink came too late"
            until(lambda: len(managers()) == 2, 30, "two managers left")
            assert b.manager_id(1, lease) in managers()
            assert p.status([job])[0].state.name == "RUNNING"
            # The block hears the shrink's RESIZED on its own stream, maybe after the grant.
            until(lambda: b.block.lease.size["cpu"] == 2.0, 10, "the shrink's RESIZED")
            assert b.block.lease.size["cpu"] == 2.0
            check(squares, final)
            lost = sum(r["fail_count"] for r in dfk.tasks.values())
            assert lost == 0
            # The cores come back: the lease grows again, and so do the pools.
            fx.release(got.id)
        until(lambda: len(managers()) == 4, 60, "four managers again")
        assert b.unit_counts == [4, 2, 4] and b.block.lease.size["cpu"] == 4.0
    assert no_leases_of(server, "el")
