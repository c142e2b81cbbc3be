"""Helpers for the Ray provider tests: a small CPU pool, the example cluster YAML made
local, and a Ray head started and cleaned up by PID.

Only one Ray cluster runs on a host at a time (these tests run serially) and `ray stop`
is never used: it kills every Ray process on the host. Every process a test's head
starts (the head's daemons, the monitor, the raylets the provider starts, their
workers) inherits a marker in its environment; cleanup collects them by that marker and
by the provider's records, and signals those PIDs only.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from service_support import config

from bursar.broker.config import Config
from bursar.providers.ray.raylet import Proc, node_processes, proc_start, stop_processes
from bursar.providers.ray.store import all_records

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "ray-cluster.yaml"
MARK_ENV = "BURSAR_RAY_TEST_MARK"

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


def until(check: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s} s")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def short_tmp(prefix: str) -> Path:
    """A directory with a short path: Ray's unix sockets live under its temp dir, and a
    socket path may not exceed 107 bytes."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


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


def marked(mark: str) -> set[Proc]:
    """Live processes whose environment holds ``MARK_ENV=mark``."""
    needle = f"{MARK_ENV}={mark}".encode()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        start = proc_start(int(entry))
        if start is not None:
            out.add(Proc(int(entry), start))
    return out


def kill_recorded(mark: str, state_dir: Path | None) -> set[Proc]:
    """Stop the processes carrying ``mark`` and those the provider recorded in
    ``state_dir`` (with their trees); returns what was signalled."""
    procs = marked(mark)
    if state_dir is not None:
        for r in all_records(state_dir):
            procs |= node_processes(r.proc, r.node_id)
    for p in list(procs):
        procs |= node_processes(p)
    # A test's cluster needs no graceful stop (and Ray's agents ignore SIGTERM anyway).
    return stop_processes(procs, 0.3) if procs else set()


@dataclass(frozen=True)
class RayHead:
    address: str
    temp_dir: Path
    mark: str
    log: Path

    def monitor_log(self) -> str:
        logs = self.temp_dir / "session_latest" / "logs"
        return "".join(
            p.read_text(errors="replace") for p in sorted(logs.glob("monitor*")) if p.is_file()
        )


@contextmanager
def ray_head(
    cluster: Path, *, v2: bool, state_dir: Path | None = None, log_dir: Path
) -> Iterator[RayHead]:
    """``ray start --head --autoscaling-config=cluster`` on free local ports (autoscaler
    v1, or v2 with ``RAY_enable_autoscaler_v2=1``; updates every second); stopped by
    PID on exit, and the temp dir removed."""
    mark = uuid.uuid4().hex
    temp_dir = short_tmp("bray-")
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            MARK_ENV: mark,
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_enable_autoscaler_v2": "1" if v2 else "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            # The head as the provider lists it (provider.head_node_id, head_node_type):
            # autoscaler v2 matches Ray nodes to the provider's by these.
            "RAY_CLOUD_INSTANCE_ID": "head",
            "RAY_NODE_TYPE_NAME": "head",
            # Ray's workers import the tests' remote functions by module name.
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
    )
    ray = str(Path(sys.executable).parent / "ray")
    log = log_dir / "ray-head.log"
    cmd = [
        ray,
        "start",
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=0",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
        "--dashboard-agent-listen-port=0",
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--object-store-memory=100000000",
        f"--autoscaling-config={cluster}",
        "--disable-usage-stats",
    ]
    head = RayHead(f"127.0.0.1:{port}", temp_dir, mark, log)
    try:
        with open(log, "wb") as out:
            subprocess.run(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=90, check=True
            )
        yield head
    finally:
        kill_recorded(mark, state_dir)
        # Keep the autoscaler's logs with the test's files (pytest keeps the last runs').
        for path in (temp_dir / "session_latest" / "logs").glob("monitor*"):
            shutil.copy(path, log_dir / path.name)
        shutil.rmtree(temp_dir, ignore_errors=True)
