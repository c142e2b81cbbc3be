"""An elastic BursarCluster job end to end: real Dask workers on an elastic lease from a
real broker over gRPC, grown at once on an empty pool and shrunk, with a graceful retire
before the deadline, when another campaign's fixed request needs the cores."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import dask
import pytest
from dask_support import FAST_DASK, slow_square, until
from distributed import Client
from elastic_support import GRACE_S, elastic_config
from service_support import run, serve
from test_dask_cluster import FAST, campaign_leases, cluster_on

from bursar.providers.client import AsyncBrokerClient
from bursar.providers.dask import BursarJob

pytestmark = pytest.mark.slow

N = 200
ELASTIC = {"min": 1, "max": 4, "work": 5000, "deadline": 3000, "amdahl": 0.05}


def test_an_elastic_job_grows_then_retires_the_workers_a_shrink_takes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path / "state", elastic_config()) as srv:
            async with (
                cluster_on(srv, "el", cores=1, memory="1GB", elastic=ELASTIC) as cluster,
                Client(cluster, asynchronous=True) as client,
            ):
                assert "# bursar-lease: elastic min=1 max=4" in cluster.job_script()
                cluster.scale(jobs=1)

                def names() -> set[str]:
                    return {str(d["name"]) for d in cluster.scheduler_info["workers"].values()}

                # Granted at one unit and grown at once to the empty pool's four cores:
                # a worker per unit.
                await until(lambda: len(names()) == 4, 60, "4 workers")
                (job,) = cluster.jobs.values()
                assert isinstance(job, BursarJob) and job.lease is not None
                assert job.lease.size == {"cpu": 4.0, "mem_gb": 4.0}
                assert names() == {job.name, *(f"{job.name}-u{k}" for k in (1, 2, 3))}

                futs = client.map(slow_square, range(N), sleep_s=0.05)
                await until(lambda: sum(f.done() for f in futs) >= 20, 30, "20 results")
                async with AsyncBrokerClient(srv.address, srv.tokens["fixed"], backoff=FAST) as fx:
                    t0 = time.time()
                    want = asyncio.ensure_future(
                        fx.acquire({"cpu": 2, "mem_gb": 2}, 30, timeout=30)
                    )
                    await until(lambda: bool(job.resizes), 20, "the retire for the shrink")
                    (shrink,) = job.resizes
                    assert shrink.units == 2 and shrink.deadline is not None
                    assert abs(shrink.deadline - (t0 + GRACE_S)) < 1.0
                    # The highest units go, retired through the scheduler (their data
                    # moved) and stopped before the deadline.
                    assert sorted(shrink.asked) == sorted(f"{job.name}-u{k}" for k in (2, 3))
                    assert sorted(shrink.retired) == sorted(shrink.asked)
                    assert shrink.done_at <= shrink.deadline
                    print(
                        f"shrink done {shrink.deadline - shrink.done_at:.2f} s before its deadline"
                    )
                    assert sum(f.done() for f in futs) < N, "the shrink came too late"
                    got = await asyncio.wait_for(want, 30)
                    assert got.campaign == "fixed"
                    await until(lambda: job.lease.size["cpu"] == 2.0, 10, "the shrunk lease")
                    # The cluster hears of the retired workers' removal on a stream of its own.
                    left = {job.name, f"{job.name}-u1"}
                    await until(lambda: names() == left, 10, "the retired workers removed")
                    assert names() == left
                    assert await client.gather(futs) == [i * i for i in range(N)]
                    assert all(f.status == "finished" for f in futs)
                    assert job.unit_counts == [4, 2]
                    assert not cluster.ended_jobs
                    # The cores come back: the lease grows again, and so do the workers.
                    await fx.release(got.id)
                await until(lambda: len(names()) == 4, 60, "4 workers again")
                assert job.unit_counts == [4, 2, 4]
                lease_id = job.lease_id
            assert await campaign_leases(srv, "el") == 0
            async with AsyncBrokerClient(srv.address, srv.tokens["el"], backoff=FAST) as el:
                assert (await el.get_lease(lease_id)).state.value == "RELEASED"

    with dask.config.set(FAST_DASK):
        run(scenario(), 120)
