"""Helpers for the Parsl provider tests: a small CPU pool whose campaigns exercise each
lease outcome, served over gRPC on a thread (the provider's client is synchronous)."""

from __future__ import annotations

import os
import time

from service_support import config

from bursar.broker.config import Config

# One warm node of 4 cores; grace 1 s so that a reclaim takes about a second.
PARSL_POOL = """
[pool]
boot_latency_s = 0.5
[pool.groups.n]
count = 1
warm = 1
gpu = 2
cpu = 4
mem_gb = 16
[policy]
grace_s = 1.0
min_retry_s = 0.3
max_lease_s = 3600
[policy.warm_headroom]
gpu = 0
cpu = 0

# The workflow's campaign: the backfill tier (preemptible), may hold the whole node.
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
sustained = 2
burst = 2

# A batch campaign capped at 2 cores at once (ABOVE_BURST beyond).
[campaigns.capped]
class = "batch"
[campaigns.capped.cpu]
sustained = 2
burst = 2

# A higher class that reclaims the backfill tier's cores.
[campaigns.hi]
class = "interactive"
[campaigns.hi.cpu]
sustained = 4
burst = 4

# A tiny bucket: one lease's worth of tokens and no refill, so renewals are refused.
[campaigns.poor]
class = "batch"
[campaigns.poor.cpu]
sustained = 0
burst = 1
bucket = 2.5
"""


def parsl_config() -> Config:
    return config(PARSL_POOL)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of the process group ``pgid`` (Linux /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def group_alive(pgid: int, wait_s: float = 3.0) -> bool:
    """True if processes of the group ``pgid`` are still there after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


# The workflow's functions, importable by the workers (their PYTHONPATH holds tests/).


def square(x: int, sleep_s: float = 0.0) -> int:
    if sleep_s:
        time.sleep(sleep_s)
    return x * x


def total(*xs: int) -> int:
    return sum(xs)
