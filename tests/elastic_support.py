"""Helpers for the elastic-lease tests of the workflow plugins: a small CPU pool whose
campaigns may hold elastic leases (a preemptible campaign may not), and the intent they
ask with."""

from __future__ import annotations

from collections.abc import Mapping

from service_support import config

from bursar.broker.config import Config
from bursar.providers.client import Intent

GRACE_S = 1.5
"""A shrink's grace period in the pool below: a warning's deadline is this long after it."""

# Warm nodes of 2 cores ({nodes} of them).
ELASTIC_POOL = """
[pool]
boot_latency_s = 0.3
[pool.groups.n]
count = {nodes}
warm = {nodes}
gpu = 0
cpu = 2
mem_gb = 8
[policy]
grace_s = {grace_s}
min_retry_s = 0.2
max_lease_s = 3600
[policy.warm_headroom]
cpu = 0

# The elastic job's campaign: may hold the whole pool.
[campaigns.el]
class = "batch"
[campaigns.el.cpu]
sustained = 4
burst = 4
bucket = 100000
[campaigns.el.mem_gb]
sustained = 16
burst = 16
bucket = 100000

# Another campaign with a fixed request that needs what the elastic lease grew into.
[campaigns.fixed]
class = "batch"
[campaigns.fixed.cpu]
sustained = 2
burst = 2
bucket = 100000
[campaigns.fixed.mem_gb]
sustained = 8
burst = 8
bucket = 100000
"""


def elastic_config(nodes: int = 2) -> Config:
    """The pool with ``nodes`` warm nodes of 2 cores and 8 GB, a grace of ``GRACE_S``."""
    return config(ELASTIC_POOL.format(nodes=nodes, grace_s=GRACE_S))


def cpu_intent(
    lo: int = 1, hi: int = 4, unit: Mapping[str, float] | None = None, **kw: object
) -> Intent:
    """``lo`` to ``hi`` units of ``unit`` (one core), far from its deadline."""
    u = dict(unit or {"cpu": 1.0})
    return Intent(
        min={d: v * lo for d, v in u.items()},
        max={d: v * hi for d, v in u.items()},
        step=u,
        work=kw.pop("work", 5_000.0),  # type: ignore[arg-type]
        deadline_s=kw.pop("deadline_s", 3_000.0),  # type: ignore[arg-type]
        amdahl=kw.pop("amdahl", 0.05),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )
