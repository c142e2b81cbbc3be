"""Shared helpers of the local backend's tests: the machine's own CPUs, workers launched
through ``launch_argv``, and their affinity as the kernel reports it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bursar.broker.backends.local import LocalPool, LocalSettings
from bursar.broker.backends.local_discovery import (
    CgroupProbe,
    NodeDevices,
    layout_nodes,
    parse_cpulist,
    read_machine,
)
from bursar.providers.launch import launch_argv
from bursar.testing import poll_until as until  # noqa: F401 (the tests import it from here)

BUSY = [sys.executable, "-c", "while True: pass"]
"""A CPU-bound worker that runs until signalled."""

STUBBORN = ["bash", "-c", "trap '' TERM; while :; do :; done"]
"""A worker that ignores SIGTERM: only the SIGKILL after the grace ends it."""

LOCAL_CAMPAIGNS = """
[policy]
grace_s = 1.0
min_retry_s = 0.3
max_lease_s = 3600

[campaigns.sci]
class = "batch"
cpu = { guarantee = 0, sustained = 64, burst = 64, bucket = "unlimited" }
gpu = { guarantee = 0, sustained = 8, burst = 8, bucket = "unlimited" }
mem_gb = { guarantee = 0, sustained = 500, burst = 500, bucket = "unlimited" }
[campaigns.fill]
class = "opportunistic"
preemptible = true
cpu = { guarantee = 0, sustained = 64, burst = 64, bucket = "unlimited" }
"""


def machine_nodes() -> list[NodeDevices]:
    """This machine's nodes as the backend discovers them (no GPUs asked for)."""
    return layout_nodes(read_machine(gpus=False), split_numa=False)


def local_pool(run_dir: Path, *, grace_s: float = 1.0, poll_s: float = 0.0) -> LocalPool:
    settings = LocalSettings(run_dir=run_dir, kill_grace_s=grace_s, poll_interval_s=poll_s)
    return LocalPool(machine_nodes(), settings, cgroup=CgroupProbe(None, "tests: plan mode"))


def start(allocation: Mapping[str, str], argv: Sequence[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(launch_argv(allocation, argv), stdin=subprocess.DEVNULL)


def cpus_allowed(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpulist(line.split(":", 1)[1])
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def exec_done(p: subprocess.Popen[bytes]) -> bool:
    """True once the wrapper has exec'd the worker (its marker is in the environment)."""
    try:
        return "BURSAR_LEASE_ID" in environ(p.pid)
    except OSError:
        return False


def ignores_term(pid: int) -> bool:
    """True once the process ignores SIGTERM (its bit in SigIgn of /proc/PID/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigIgn:"):
                return bool(int(line.split(":", 1)[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def nproc() -> int:
    return len(os.sched_getaffinity(0))
