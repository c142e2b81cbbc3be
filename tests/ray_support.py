"""Helpers for the Ray provider tests: a small CPU pool, the example cluster YAML made
local, and a Ray head started and cleaned up by PID.

Only one Ray cluster runs on a host at a time (these tests run serially) and `ray stop`
is never used: `bursar.providers.ray.local_head` stops a head's processes by PID.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from ray.autoscaler.tags import (
    NODE_KIND_WORKER,
    STATUS_UNINITIALIZED,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)
from service_support import config, worker_pythonpath

from bursar.broker.config import Config
from bursar.providers.ray.local_head import LocalHead, local_head

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ray-cluster.yaml"

# One warm node of 2 cores; grace 1 s, so that a reclaim takes about a second.
RAY_POOL = """
[pool]
boot_latency_s = 0.5
[pool.groups.n]
count = 1
warm = 1
gpu = 0
cpu = 2
mem_gb = 8
[policy]
grace_s = 1.0
min_retry_s = 0.3
max_lease_s = 3600
[policy.warm_headroom]
cpu = 0

# The Ray cluster's campaign: the backfill tier (preemptible), may hold the whole node.
[campaigns.ray]
class = "opportunistic"
preemptible = true
[campaigns.ray.cpu]
sustained = 2
burst = 2
[campaigns.ray.mem_gb]
sustained = 8
burst = 8

# A higher class that reclaims the backfill tier's cores.
[campaigns.hi]
class = "interactive"
[campaigns.hi.cpu]
sustained = 2
burst = 2

# At most one core at once (ABOVE_BURST beyond).
[campaigns.capped]
class = "batch"
[campaigns.capped.cpu]
sustained = 1
burst = 1

# A tiny bucket: one 2-second lease's worth of tokens and no refill (renewals refused).
[campaigns.poor]
class = "batch"
[campaigns.poor.cpu]
sustained = 0
burst = 1
bucket = 2.5
"""


def ray_config() -> Config:
    return config(RAY_POOL)


def cluster_yaml(
    path: Path,
    *,
    broker: str,
    token_file: Path,
    state_dir: Path,
    campaign: str = "ray",
    **provider: Any,
) -> Path:
    """The example cluster YAML, made local: this broker and campaign, a 3-second
    idle timeout, at most two workers of {CPU: 1, memory: 1 GiB, bursar_node: 1}."""
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["cluster_name"] = f"bursar-test-{uuid.uuid4().hex[:6]}"
    cfg["max_workers"] = 2
    cfg["idle_timeout_minutes"] = 0.05
    cfg["provider"].update(
        broker=broker,
        campaign=campaign,
        token_file=str(token_file),
        state_dir=str(state_dir),
        max_retry_s=1,
        stop_grace_s=1,
        lease_duration_s=60,
        # The tests read no task output: one Python process less per node.
        ray_start_args=["--include-log-monitor=false"],
        **provider,
    )
    cfg["available_node_types"]["cpu_worker"]["max_workers"] = 2
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextmanager
def ray_head(
    cluster: Path, *, v2: bool, state_dir: Path | None = None, log_dir: Path
) -> Iterator[LocalHead]:
    """A head with ``cluster`` as its autoscaling config (updates every second), its
    monitor's logs kept in ``log_dir``; Ray's workers find the tests' remote functions
    on PYTHONPATH."""
    pythonpath = os.pathsep.join(
        p for p in (worker_pythonpath(), os.environ.get("PYTHONPATH", "")) if p
    )
    with local_head(
        cluster,
        v2=v2,
        state_dir=state_dir,
        log_path=log_dir / "ray-head.log",
        keep_logs=log_dir,
        env={"PYTHONPATH": pythonpath},
    ) as head:
        yield head


# Stands in for `ray start --block`: records its environment, then waits to be stopped.
FAKE_NODE = (
    "import json, os, sys, time\n"
    "out = os.path.join(sys.argv[1], os.environ['BURSAR_RAY_NODE_ID'])\n"
    "open(out + '.tmp', 'w').write(json.dumps({**os.environ, 'PID': str(os.getpid())}))\n"
    "os.replace(out + '.tmp', out)\n"
    "sys.exit(int(sys.argv[2])) if len(sys.argv) > 2 else time.sleep(600)\n"
)


def worker_tags(request: str = "req-1") -> dict[str, str]:
    return {
        TAG_RAY_NODE_KIND: NODE_KIND_WORKER,
        TAG_RAY_USER_NODE_TYPE: "cpu_worker",
        TAG_RAY_NODE_STATUS: STATUS_UNINITIALIZED,
        TAG_RAY_LAUNCH_REQUEST: request,
    }
