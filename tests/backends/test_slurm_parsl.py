"""A real Parsl workflow (HighThroughputExecutor) through Bursar on a real Slurm cluster:
each block is a lease, each lease a Slurm allocation, and the workers run inside it as
``srun --overlap`` steps. Mid-run an admin cancels one block's allocation: its lease is
revoked, Parsl gets a replacement block, and every task completes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import parsl
import pytest
from client_support import until
from parsl.app.app import python_app
from parsl.config import Config
from parsl.executors import HighThroughputExecutor
from parsl.jobs.states import JobState
from parsl_support import square, total
from service_support import worker_pythonpath
from slurm_support import (
    job_prefix_fixture,  # noqa: F401  (fixtures: job_prefix, slurm_cluster)
    job_state,
    jobs_named,
    slurm_broker,
    slurm_cluster_fixture,  # noqa: F401
    squeue,
)

from bursar.providers.client import Backoff, BrokerClient
from bursar.providers.parsl import BursarProvider, lease_error_handler, lease_retry_handler

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

TESTS = worker_pythonpath()
N = 40


@pytest.fixture(autouse=True)
def venv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # HTEX starts interchange.py (and srun the workers, process_worker_pool.py) from PATH.
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_parsl_workflow_on_slurm_survives_a_revoked_block(tmp_path: Path, job_prefix: str) -> None:
    with slurm_broker(tmp_path / "state", job_prefix) as served:
        provider = BursarProvider(
            broker=served.address,
            campaign="wf",
            token=served.tokens["wf"],
            backoff=Backoff(initial_s=0.05, max_s=0.5),
            resources_per_block={"cpu": 2},
            init_blocks=2,
            min_blocks=0,
            max_blocks=2,
            walltime=60,
            max_retry_s=1.0,
            worker_init=f"export PYTHONPATH={TESTS}{os.pathsep}$PYTHONPATH",
        )
        config = Config(
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
            run_dir=str(tmp_path / "runinfo"),
            strategy="simple",
            strategy_period=0.2,
            max_idletime=60,
            retries=4,
            retry_handler=lease_retry_handler,
        )
        dfk = parsl.load(config)
        try:
            sq, tot = python_app(square), python_app(total)
            squares = [sq(i, 0.1) for i in range(N)]
            final = tot(*[tot(*squares[i : i + 10]) for i in range(0, N, 10)])

            def running() -> list[str]:
                jobs = list(provider.resources)
                states = provider.status(jobs)
                return [
                    j for j, st in zip(jobs, states, strict=True) if st.state is JobState.RUNNING
                ]

            until(lambda: len(running()) == 2, 60, "two running blocks")
            until(lambda: sum(f.done() for f in squares) >= 5, 60, "five results")
            # Both blocks are Slurm allocations, and the workers are steps inside them.
            first = running()[0]
            lease = provider.lease_id(first)
            (job,) = jobs_named(f"{job_prefix}-{lease}")
            # An admin cancels the block's allocation mid-run.
            import subprocess

            subprocess.run(["scancel", str(job["job_id"])], check=True)
            until(lambda: provider.ended_by_broker(first), 20, "the block's lease to be revoked")
            with BrokerClient(served.address, served.tokens["wf"]) as c:
                ended = c.get_lease(lease)
            assert ended.state.value == "REVOKED" and "outside the broker" in ended.end_cause
            assert final.result(timeout=120) == sum(i * i for i in range(N))
            assert [f.result() for f in squares] == [i * i for i in range(N)]
            replacements = [j for j in provider.resources if j != first and provider.lease_id(j)]
            assert len(replacements) >= 2, "Parsl got no replacement block"
        finally:
            dfk.cleanup()
            parsl.clear()
            provider.close()
        until(
            lambda: (
                not [
                    j
                    for j in squeue()
                    if str(j["name"]).startswith(job_prefix) and j["job_state"] == "RUNNING"
                ]
            ),
            20,
            "every allocation to be cancelled after the workflow",
        )
        assert job_state(int(job["job_id"])) != "RUNNING"
