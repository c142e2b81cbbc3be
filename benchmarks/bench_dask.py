"""Dask worker start through Bursar against a plain local SpecCluster worker, in the
same run.

    .venv/bin/python benchmarks/bench_dask.py [--trials 5]

Worker start is the time from ``cluster.scale(1)`` until the scheduler has the worker
registered. Three clusters, each started once, then scaled 0 → 1 → 0 ``--trials``
times, the kinds interleaved trial by trial:

* ``SpecCluster``: the plain local baseline, a ``distributed.Nanny`` spec (the nanny in
  this process, its worker a spawned process), as ``LocalCluster`` does it;
* ``jobqueue local``: dask-jobqueue's own ``LocalCluster``, whose job script starts
  ``python -m distributed.cli.dask_worker`` (nanny and worker) as a local process;
* ``BursarCluster``: the same job script, started on a 1-core lease from a broker served
  in-process over gRPC on loopback; its breakdown shows the lease's share (request
  sent → lease granted → workers' process started).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from dask_jobqueue.local import LocalCluster as JobqueueLocalCluster
from distributed import Client, Nanny, Scheduler, SpecCluster
from rich.progress import Progress

from bursar.broker.service.local import local_broker
from bursar.providers.dask import BursarCluster

SCHEDULER = {"dashboard_address": ":0", "host": "127.0.0.1"}


def spec_cluster() -> SpecCluster:
    return SpecCluster(
        scheduler={"cls": Scheduler, "options": SCHEDULER},
        worker={"cls": Nanny, "options": {"nthreads": 1, "memory_limit": "1GB"}},
        silence_logs="error",
    )


def jobqueue_cluster() -> Any:
    return JobqueueLocalCluster(
        cores=1, processes=1, memory="1GB", scheduler_options=SCHEDULER, silence_logs="error"
    )


def bursar_cluster(address: str, token: str) -> BursarCluster:
    return BursarCluster(
        cores=1,
        processes=1,
        memory="1GB",
        broker=address,
        campaign="sci",
        token=token,
        scheduler_options=SCHEDULER,
        silence_logs="error",
    )


def one_start(cluster: Any, client: Client, lease_s: list[float]) -> float:
    """scale(1) → one worker registered, seconds; then back to none. For a
    BursarCluster, the lease's share goes to ``lease_s``."""
    t0 = time.perf_counter()
    cluster.scale(1)
    client.wait_for_workers(1, timeout=120)
    took = time.perf_counter() - t0
    if isinstance(cluster, BursarCluster):
        (job,) = cluster.jobs.values()
        assert job.t_start is not None and job.t_granted is not None
        lease_s.append(job.t_granted - job.t_start)
    cluster.scale(0)
    deadline = time.monotonic() + 60
    while client.scheduler_info()["workers"] or cluster.workers:
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not go away")
        time.sleep(0.05)
    return took


def summary(xs: list[float]) -> str:
    return f"median {statistics.median(xs):6.2f} s  (min {min(xs):.2f}, max {max(xs):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Dask worker start through Bursar vs a plain local SpecCluster worker."
    )
    p.add_argument("--trials", type=int, default=5, help="starts per cluster (default 5)")
    args = p.parse_args(argv)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "error"  # for the worker processes

    times: dict[str, list[float]] = {"SpecCluster": [], "jobqueue local": [], "BursarCluster": []}
    lease_s: list[float] = []
    with local_broker() as broker:
        makers: dict[str, Callable[[], Any]] = {
            "SpecCluster": spec_cluster,
            "jobqueue local": jobqueue_cluster,
            "BursarCluster": lambda: bursar_cluster(broker.address, broker.tokens["sci"]),
        }
        clusters = {name: make() for name, make in makers.items()}
        clients = {name: Client(c) for name, c in clusters.items()}
        try:
            with Progress(transient=True) as bar:
                task = bar.add_task("worker starts", total=args.trials * len(clusters))
                for _ in range(args.trials):
                    for name, cluster in clusters.items():
                        times[name].append(one_start(cluster, clients[name], lease_s))
                        bar.advance(task)
        finally:
            for name in clusters:
                clients[name].close()
                clusters[name].close()

    print(f"Dask worker start (scale(1) → worker registered), {args.trials} trials each:")
    for name, xs in times.items():
        print(f"  {name:<15} {summary(xs)}")
    base = statistics.median(times["SpecCluster"])
    jq = statistics.median(times["jobqueue local"])
    bursar = statistics.median(times["BursarCluster"])
    print(f"  of which the lease (Acquire over gRPC, granted): {summary(lease_s)}")
    print(f"ratio BursarCluster / SpecCluster:    {bursar / base:.2f}x")
    print(f"ratio BursarCluster / jobqueue local: {bursar / jq:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
