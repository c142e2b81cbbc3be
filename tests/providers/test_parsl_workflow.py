"""Real Parsl workflows on a real HighThroughputExecutor whose blocks are Bursar leases
from a real broker over gRPC: a reclaim mid-run, a refused block, a broker restart."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import parsl
import pytest
from client_support import ServerThread, server_thread, until
from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.jobs.states import JobState
from parsl_support import group_alive, parsl_config, square, total
from service_support import worker_pythonpath

from bursar.providers.client import AdminClient, Backoff, BrokerClient
from bursar.providers.parsl import BursarProvider, lease_error_handler, lease_retry_handler

pytestmark = pytest.mark.slow

FAST = Backoff(initial_s=0.05, max_s=0.5)
TESTS = worker_pythonpath()
N = 100


@pytest.fixture(autouse=True)
def venv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # HTEX starts interchange.py (and the workers process_worker_pool.py) from PATH.
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state", cfg=parsl_config()) as s:
        yield s


def make_provider(server: ServerThread, campaign: str, **kw: Any) -> BursarProvider:
    kw.setdefault("resources_per_block", {"cpu": 2})
    return BursarProvider(
        broker=server.address,
        campaign=campaign,
        token=server.tokens[campaign],
        backoff=FAST,
        walltime=20,
        max_retry_s=1.0,
        worker_init=f"export PYTHONPATH={TESTS}{os.pathsep}$PYTHONPATH",
        **kw,
    )


def htex_config(provider: BursarProvider, run_dir: Path) -> Config:
    return Config(
        executors=[
            HighThroughputExecutor(
                label="htex",
                address="127.0.0.1",
                cores_per_worker=1,
                heartbeat_period=1,
                heartbeat_threshold=3,
                block_error_handler=lease_error_handler,
                provider=provider,
            )
        ],
        run_dir=str(run_dir),
        strategy="simple",
        strategy_period=0.2,
        max_idletime=60,
        retries=4,
        retry_handler=lease_retry_handler,
    )


@contextmanager
def loaded(provider: BursarProvider, run_dir: Path) -> Iterator[Any]:
    dfk = parsl.load(htex_config(provider, run_dir))
    try:
        yield dfk
    finally:
        dfk.cleanup()
        parsl.clear()
        provider.close()
        for b in provider.resources.values():
            if b.proc is not None:
                assert not group_alive(b.proc.pid), f"{b.job_id} left processes behind"


def workflow(sleep_s: float) -> tuple[list[Future[int]], Future[int]]:
    """N squares, N/10 partial sums depending on them, one total of the sums."""
    sq, tot = python_app(square), python_app(total)
    squares = [sq(i, sleep_s) for i in range(N)]
    sums = [tot(*squares[i : i + 10]) for i in range(0, N, 10)]
    return squares, tot(*sums)


def check(squares: list[Future[int]], final: Future[int]) -> None:
    assert final.result(timeout=90) == sum(i * i for i in range(N))
    assert [f.result() for f in squares] == [i * i for i in range(N)]


def no_leases_of(server: ServerThread, campaign: str) -> bool:
    with AdminClient(server.address, server.admin_token) as admin:
        return admin.get_campaign(campaign).leases == 0


def blocks(p: BursarProvider, state: JobState) -> list[str]:
    jobs = list(p.resources)
    return [j for j, st in zip(jobs, p.status(jobs), strict=True) if st.state is state]


def test_a_reclaimed_block_is_replaced_and_every_task_completes(
    server: ServerThread, tmp_path: Path
) -> None:
    p = make_provider(server, "wf", init_blocks=2, max_blocks=2)
    with loaded(p, tmp_path / "runinfo") as dfk:
        squares, final = workflow(0.15)
        until(lambda: len(blocks(p, JobState.RUNNING)) == 2, 30, "two running blocks")
        until(lambda: sum(f.done() for f in squares) >= 10, 30, "ten results")
        with BrokerClient(server.address, server.tokens["hi"], backoff=FAST) as hi:
            grab = hi.acquire({"cpu": 2}, 30, blocking=False)  # reclaims one wf lease
            until(lambda: blocks(p, JobState.CANCELLED), 10, "the reclaimed block torn down")
            (victim,) = blocks(p, JobState.CANCELLED)
            assert p.ended_by_broker(victim)
            assert "preempted" in p.status([victim])[0].message
            # Drained: its managers were held and their tasks finished within the grace.
            drained = p.resources[victim].drained_idle
            # Parsl asks for a replacement; the pool is full while hi holds its cores.
            until(lambda: any(p.refusals(j) for j in p.resources), 10, "a refused replacement")
            pending = blocks(p, JobState.PENDING)
            assert pending and "refused" in p.status(pending)[0].message
            hi.release(grab.id)
        check(squares, final)
        lost = sum(r["fail_count"] for r in dfk.tasks.values())
        print(f"drained idle: {drained}; task failures: {lost}")
        assert drained, "the preempted block's tasks did not finish within the grace period"
        assert lost == 0
        replacements = [j for j in p.resources if p.refusals(j) and p.lease_id(j)]
        assert replacements, "no replacement lease was negotiated"
    assert no_leases_of(server, "wf")


def test_a_refused_block_stays_pending_while_the_workflow_runs(
    server: ServerThread, tmp_path: Path
) -> None:
    # "capped" may hold 2 cores at once: the second block is refused ABOVE_BURST.
    p = make_provider(server, "capped", init_blocks=2, max_blocks=2)
    seen: list[str] = []
    stop = threading.Event()

    def watch_pending() -> None:
        while not stop.wait(0.1):
            seen.extend(st.message for st in p.status(blocks(p, JobState.PENDING)))

    with loaded(p, tmp_path / "runinfo"):
        t = threading.Thread(target=watch_pending, daemon=True)
        t.start()
        squares, final = workflow(0.0)
        check(squares, final)
        stop.set()
        t.join()
        assert any("ABOVE_BURST" in m for m in seen), seen[-3:]
        assert len(blocks(p, JobState.RUNNING)) == 1
    assert no_leases_of(server, "capped")


def test_the_workflow_survives_a_broker_restart(server: ServerThread, tmp_path: Path) -> None:
    p = make_provider(server, "wf", init_blocks=1, max_blocks=1)
    state_dir, port = server.state_dir, server.port
    with loaded(p, tmp_path / "runinfo"):
        squares, final = workflow(0.05)
        until(lambda: sum(f.done() for f in squares) >= 10, 30, "ten results")
        server.stop()
        time.sleep(1.0)
        with server_thread(state_dir, cfg=parsl_config(), port=port) as again:
            check(squares, final)
            (job,) = p.resources
            assert p.status([job])[0].state is JobState.RUNNING
            lease = p.lease_id(job)
            p.cancel([job])
            with BrokerClient(again.address, again.tokens["wf"]) as c:
                assert c.get_lease(lease).state.value == "RELEASED"
            assert no_leases_of(again, "wf")
