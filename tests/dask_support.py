"""Helpers for the Dask cluster tests: a small CPU pool served over real gRPC, and the
functions the workers run (importable: the workers' PYTHONPATH holds tests/)."""

from __future__ import annotations

import os
import time

from service_support import config, worker_pythonpath

from bursar.broker.config import Config
from bursar.testing import apoll_until as until  # noqa: F401 (the tests import it from here)

# Two warm nodes of 2 cores; a reclaim's grace period is 2.5 s.
DASK_POOL = """
[pool]
boot_latency_s = 0.3
[pool.groups.n]
count = 2
warm = 2
gpu = 2
cpu = 2
mem_gb = 8
[policy]
grace_s = 2.5
min_retry_s = 0.2
max_lease_s = 3600
[policy.warm_headroom]
gpu = 0
cpu = 0

# The workflow's campaign: the backfill tier (preemptible), may hold the whole pool.
[campaigns.wf]
class = "opportunistic"
preemptible = true
[campaigns.wf.cpu]
sustained = 4
burst = 4
[campaigns.wf.mem_gb]
sustained = 16
burst = 16
[campaigns.wf.gpu]
sustained = 4
burst = 4

# A tiny bucket and no refill: one 4 s lease of a core, then renewals are refused.
[campaigns.poor]
class = "batch"
[campaigns.poor.cpu]
sustained = 0
burst = 1
bucket = 5
[campaigns.poor.mem_gb]
sustained = 1
burst = 1

# A higher class that reclaims the backfill tier's cores.
[campaigns.hi]
class = "interactive"
[campaigns.hi.cpu]
sustained = 4
burst = 4
"""


def dask_config() -> Config:
    return config(DASK_POOL)


FAST_DASK = {
    # Retiring a worker waits for the active memory manager to move its data; its
    # default 2 s interval would not fit in the test pool's grace period.
    "distributed.scheduler.active-memory-manager.interval": "200ms",
}


def prologue() -> list[str]:
    return [f"export PYTHONPATH={worker_pythonpath()}{os.pathsep}$PYTHONPATH"]


# The functions the workers run.


def slow_square(x: int, sleep_s: float = 0.05) -> int:
    time.sleep(sleep_s)
    return x * x
