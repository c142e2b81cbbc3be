"""BursarCluster end to end: real Dask computations on workers started on leases from a
real broker over gRPC, through a reclaim, a lost node, refusals and close()."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import pytest
from client_support import server_thread
from dask_jobqueue import JobQueueCluster
from dask_support import FAST_DASK, dask_config, prologue, slow_square, until
from distributed import Client
from parsl_support import group_alive
from service_support import Client as Server
from service_support import run, serve

from bursar.providers.client import (
    AdminClient,
    AsyncAdminClient,
    AsyncBrokerClient,
    Backoff,
    BrokerClient,
    LeasePath,
    Unauthenticated,
)
from bursar.providers.dask import BursarCluster, BursarJob, JobState

pytestmark = pytest.mark.slow

FAST = Backoff(initial_s=0.05, max_s=0.5)
N = 120


@asynccontextmanager
async def cluster_on(srv: Server, campaign: str = "wf", **kw: Any) -> AsyncIterator[BursarCluster]:
    kw.setdefault("cores", 1)
    kw.setdefault("memory", "1GB")
    kw.setdefault("walltime", 30)
    async with BursarCluster(
        broker=srv.address,
        campaign=campaign,
        token=srv.tokens[campaign],
        asynchronous=True,
        scheduler_options={"dashboard_address": ":0", "host": "127.0.0.1"},
        job_script_prologue=prologue(),
        backoff=FAST,
        retry_interval=(0.1, 0.5),
        **kw,
    ) as cluster:
        yield cluster


async def campaign_leases(srv: Server, campaign: str) -> int:
    async with AsyncAdminClient(srv.address, srv.admin_token, backoff=FAST) as admin:
        return (await admin.get_campaign(campaign)).leases


def running(cluster: BursarCluster) -> list[str]:
    return [n for n, j in cluster.jobs.items() if j.state is JobState.RUNNING]


def test_adaptive_work_survives_a_reclaim_with_no_lost_result(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path / "state", dask_config()) as srv:
            async with (
                cluster_on(srv, gpus=1) as cluster,
                Client(cluster, asynchronous=True) as client,
            ):
                assert cluster.dashboard_link.startswith("http://127.0.0.1:")
                cluster.adapt(
                    minimum_jobs=1, maximum_jobs=2, interval="100ms", target_duration="1s"
                )
                futs = client.map(slow_square, range(N), sleep_s=0.1)
                arr = client.persist(da.arange(40_000, chunks=2_000).reshape(200, 200))
                await until(lambda: len(cluster.scheduler_info["workers"]) == 2, 40, "2 workers")
                await until(lambda: sum(f.done() for f in futs) >= 20, 30, "20 results")
                # A GPU of the lease is a worker resource.
                assert await client.submit(slow_square, 7, 0.0, resources={"GPU": 1}) == 49

                async with AsyncBrokerClient(srv.address, srv.tokens["hi"], backoff=FAST) as hi:
                    grab = await hi.acquire({"cpu": 3}, 30, blocking=False)
                    assert grab.path is LeasePath.RECLAIM  # one wf lease is reclaimed
                    assert sum(f.done() for f in futs) < N, "the reclaim came too late"
                    await until(lambda: cluster.ended_jobs, 10, "the preempted job ended")
                    (victim,) = cluster.ended_jobs
                    assert "preempted" in victim.end_reason
                    assert victim.pid is not None and not group_alive(victim.pid)
                    # Retired through the scheduler (its results moved), before the revoke.
                    assert victim.retired == [victim.name]
                    # Its replacement asks at once and is refused while hi holds the cores.
                    await until(
                        lambda: any(j.refusals for j in cluster.jobs.values()), 10, "a refusal"
                    )
                    (replacement,) = [j for j in cluster.jobs.values() if j.refusals]
                    await hi.release(grab.id)
                # Granted once hi lets go (work is left, so Adaptive keeps two jobs).
                await until(lambda: bool(replacement.lease_id), 10, "the replacement lease")
                assert sum(f.done() for f in futs) < N, "the work ended before the replacement"

                total = await client.compute(arr.sum())
                results = await client.gather(futs)
                assert results == [i * i for i in range(N)]
                assert total == sum(range(40_000))
                assert all(f.status == "finished" for f in futs)
                leases = cluster.lease_ids()
                assert leases
            # Every lease the cluster held is released; none of the campaign is left.
            assert await campaign_leases(srv, "wf") == 0
            async with AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST) as wf:
                for lid in leases:
                    assert (await wf.get_lease(lid)).state.value == "RELEASED"

    with dask.config.set(FAST_DASK):
        run(scenario(), 100)


def test_a_revoked_job_with_two_processes_is_replaced_at_once(tmp_path: Path) -> None:
    # distributed#9102: SpecCluster never closes a job of grouped workers that died;
    # here the lease watch replaces it, long before lost-worker-timeout (60 s).
    async def scenario() -> None:
        async with serve(tmp_path / "state", dask_config()) as srv:
            async with (
                cluster_on(srv, cores=2, processes=2, memory="2GB") as cluster,
                Client(cluster, asynchronous=True) as client,
            ):
                cluster.scale(jobs=1)
                await until(lambda: len(cluster.scheduler_info["workers"]) == 2, 40, "2 workers")
                futs = client.map(slow_square, range(100), sleep_s=0.05)
                await until(lambda: sum(f.done() for f in futs) >= 10, 30, "10 results")
                (victim,) = cluster.jobs.values()
                assert victim.lease is not None
                t_lost = time.monotonic()
                for node in victim.lease.nodes:
                    srv.core.runtime.backend.fail(node, srv.core.now(), repair_after_s=0.5)
                srv.core._wake.set()
                assert sum(f.done() for f in futs) < 100, "the loss came too late"
                await until(lambda: victim in cluster.ended_jobs, 10, "the revoked job closed")
                assert "revoked" in victim.end_reason
                # Replaced at once: the new job asks while the node is still down.
                await until(
                    lambda: len(cluster.jobs) == 1 and victim.name not in cluster.jobs,
                    20,
                    "the replacement job",
                )
                (replacement,) = cluster.jobs.values()
                assert replacement.t_start is not None and replacement.t_start - t_lost < 5.0

                def names() -> set[str]:
                    return {d["name"] for d in cluster.scheduler_info["workers"].values()}

                await until(
                    lambda: names() == set(replacement.worker_names),
                    30,
                    "the replacement's workers",
                )
                assert await client.gather(futs) == [i * i for i in range(100)]
                print(
                    f"replacement asked {replacement.t_start - t_lost:.2f} s and its workers "
                    f"registered {time.monotonic() - t_lost:.1f} s after the loss; refusals: "
                    f"{replacement.refusals}"
                )
            assert await campaign_leases(srv, "wf") == 0

    with dask.config.set({**FAST_DASK, "distributed.deploy.lost-worker-timeout": "60s"}):
        run(scenario(), 100)


def test_a_lease_that_cannot_be_renewed_is_given_back_before_it_expires(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path / "state", dask_config()) as srv:
            async with cluster_on(srv, "poor", walltime=4, lease_margin=1.0) as cluster:
                cluster.scale(jobs=1)
                await until(lambda: cluster.ended_jobs, 20, "the job given back")
                (job,) = cluster.ended_jobs
                assert "could not be renewed" in job.end_reason
                assert job.lease is not None and job.lease.state.value == "RELEASED"
                # Its replacement asks at once; the empty bucket refuses it.
                await until(
                    lambda: any("BUCKET_EMPTY" in j.refusals for j in cluster.jobs.values()),
                    10,
                    "the replacement refused",
                )
            assert await campaign_leases(srv, "poor") == 0

    run(scenario(), 60)


def test_sync_close_releases_every_lease_including_a_refused_jobs(tmp_path: Path) -> None:
    with server_thread(tmp_path / "state", cfg=dask_config()) as srv:
        cluster = BursarCluster(
            cores=2,
            processes=1,
            memory="1GB",
            nanny=False,
            walltime="00:00:30",
            broker=srv.address,
            campaign="wf",
            token=srv.tokens["wf"],
            scheduler_options={"dashboard_address": ":0", "host": "127.0.0.1"},
            log_directory=str(tmp_path / "logs"),
            job_script_prologue=prologue(),
            backoff=FAST,
            retry_interval=(0.1, 0.3),
        )
        with cluster:
            script = cluster.job_script()
            assert cluster.scheduler_address in script
            assert "# bursar-lease: size cpu=2 mem_gb=1" in script
            cluster.scale(jobs=3)  # the pool holds two: the third is refused, and asks again
            cluster.wait_for_workers(2, timeout=60)
            with Client(cluster) as client:
                assert client.submit(slow_square, 3, 0.0).result(timeout=30) == 9
            refused = [j for j in cluster.jobs.values() if j.refusals]
            assert len(refused) == 1 and not refused[0].lease_id
            assert refused[0].state is JobState.REQUESTING
            logs = cluster.get_logs()
            assert any(k.startswith("Job ") and "stderr" in k for k in logs), list(logs)
            leases = cluster.lease_ids()
            assert len(leases) == 2
            pids = [j.pid for j in cluster.jobs.values() if j.pid is not None]
            assert len(pids) == 2
        cluster.close()  # again: nothing left to do
        assert not any(group_alive(pid) for pid in pids), "worker processes left behind"
        with AdminClient(srv.address, srv.admin_token) as admin:
            assert admin.get_campaign("wf").leases == 0
        with BrokerClient(srv.address, srv.tokens["wf"]) as wf:
            assert {wf.get_lease(lid).state.value for lid in leases} == {"RELEASED"}


def test_an_unusable_token_fails_the_job_start(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path / "state", dask_config()) as srv:
            srv.tokens["wf"] = "not-a-token"
            async with cluster_on(srv) as cluster:
                cluster.scale(jobs=1)
                with pytest.raises(Unauthenticated):
                    await cluster
                assert not cluster.lease_ids()

    run(scenario(), 60)


def test_a_bursar_job_works_on_its_own_from_the_jobqueue_config(tmp_path: Path) -> None:
    # dask-jobqueue's Job contract: JobQueueCluster(job_cls=BursarJob) builds each job from
    # the jobqueue.bursar config section alone (no BursarCluster, no session passed).
    async def scenario() -> None:
        async with serve(tmp_path / "state", dask_config()) as srv:
            settings = {
                "broker": srv.address,
                "campaign": "wf",
                "token": srv.tokens["wf"],
                "cores": 1,
                "memory": "1GB",
                "walltime": 30,
                "job-script-prologue": prologue(),
                "log-directory": str(tmp_path / "logs"),
            }
            with dask.config.set({f"jobqueue.bursar.{k}": v for k, v in settings.items()}):
                async with (
                    JobQueueCluster(
                        job_cls=BursarJob,
                        asynchronous=True,
                        scheduler_options={"dashboard_address": ":0", "host": "127.0.0.1"},
                    ) as cluster,
                    Client(cluster, asynchronous=True) as client,
                ):
                    assert "# bursar-lease: size cpu=1 mem_gb=1" in cluster.job_script()
                    cluster.scale(jobs=1)
                    await client.wait_for_workers(1, timeout=40)
                    assert await client.submit(slow_square, 4, 0.0) == 16
                    (job,) = cluster.workers.values()
                    assert isinstance(job, BursarJob) and job.state is JobState.RUNNING
                    assert job.lease is not None and job.lease.labels["engine"] == "dask"
                    assert job.stdout_path is not None
                    assert job.stdout_path.parent == tmp_path / "logs"
                    lease_id = job.lease_id
            assert await campaign_leases(srv, "wf") == 0
            async with AsyncBrokerClient(srv.address, srv.tokens["wf"], backoff=FAST) as wf:
                assert (await wf.get_lease(lease_id)).state.value == "RELEASED"

    with dask.config.set(FAST_DASK):
        run(scenario(), 60)
