"""A real Dask computation through Bursar on a real Slurm cluster: each BursarCluster job is
a lease, each lease a Slurm allocation, the workers ``srun --overlap`` steps inside it.
Mid-run a higher campaign reclaims one job's lease: the job retires, its lease is revoked
after the grace period (its allocation cancelled), a replacement comes up and every
result arrives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dask
import pytest
from client_support import until as wait_until
from dask_support import FAST_DASK, prologue, slow_square, until
from distributed import Client
from slurm_support import (
    job_prefix_fixture,  # noqa: F401  (fixtures: job_prefix, slurm_cluster)
    jobs_named,
    slurm_broker,
    slurm_cluster_fixture,  # noqa: F401
    squeue,
)

from bursar.providers.client import AsyncBrokerClient, Backoff, LeasePath
from bursar.providers.dask import BursarCluster

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

FAST = Backoff(initial_s=0.05, max_s=0.5)
N = 60


def test_dask_on_slurm_survives_a_reclaimed_job(tmp_path: Path, job_prefix: str) -> None:
    with slurm_broker(tmp_path / "state", job_prefix, grace_s=2.5) as served:

        async def scenario() -> None:
            async with (
                BursarCluster(
                    walltime=60,
                    cores=1,
                    memory="1GB",
                    broker=served.address,
                    campaign="fill",
                    token=served.tokens["fill"],
                    asynchronous=True,
                    scheduler_options={"dashboard_address": ":0", "host": "127.0.0.1"},
                    job_script_prologue=prologue(),
                    backoff=FAST,
                    retry_interval=(0.1, 0.5),
                    log_directory=str(tmp_path / "logs"),
                ) as cluster,
                Client(cluster, asynchronous=True) as client,
            ):
                cluster.scale(jobs=2)
                await until(lambda: len(cluster.scheduler_info["workers"]) == 2, 60, "2 workers")
                # Each job's workers are steps of its lease's Slurm allocation.
                leases = cluster.lease_ids()
                assert len(leases) == 2
                for lid in leases:
                    assert len(jobs_named(f"{job_prefix}-{lid}")) == 1
                futs = client.map(slow_square, range(N), sleep_s=0.1)
                await until(lambda: sum(f.done() for f in futs) >= 10, 30, "10 results")
                async with AsyncBrokerClient(
                    served.address, served.tokens["sci"], backoff=FAST
                ) as sci:
                    # All CPUs but one: one of the two Dask leases must be reclaimed.
                    grab = await sci.acquire({"cpu": 127}, 60, blocking=False)
                    assert grab.path is LeasePath.RECLAIM
                    await until(lambda: cluster.ended_jobs, 20, "the preempted job to end")
                    (victim,) = cluster.ended_jobs
                    assert "preempted" in victim.end_reason
                    victim_lease = victim.lease_id
                    await until(
                        lambda: not jobs_named(f"{job_prefix}-{victim_lease}"),
                        20,
                        "the revoked lease's allocation to be cancelled",
                    )
                    await sci.release(grab.id)
                results = await asyncio.wait_for(client.gather(futs), 90)
                assert results == [i * i for i in range(N)]
                assert len(cluster.lease_ids()) >= 1

        with dask.config.set(FAST_DASK):
            asyncio.run(asyncio.wait_for(scenario(), 150))

        def running() -> list[dict[str, object]]:
            return [
                j
                for j in squeue()
                if str(j["name"]).startswith(job_prefix) and j["job_state"] == "RUNNING"
            ]

        # Release answers at the journal commit; the broker's actuator cancels the Slurm
        # allocation right after, off the request path. A lease the cluster failed to
        # release would hold its allocation for its whole 60 s walltime, so 20 s tells
        # the two apart.
        wait_until(lambda: not running(), 20, "every allocation to be cancelled after close")
