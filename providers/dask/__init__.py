"""Dask on Bursar leases: ``BursarCluster``, written where one would write
``SLURMCluster``; each dask-jobqueue job is one lease.

See :mod:`bursar.providers.dask.cluster` for what Bursar adds (renewal, graceful
retirement on preemption, immediate replacement of lost leases) and
``bursar.yaml`` for the ``jobqueue.bursar`` config defaults, merged on import."""

from bursar.broker.errors import require

require(
    "dask",
    "distributed",
    "dask_jobqueue",
    "psutil",
    extra="dask",
    feature="the Dask cluster manager (bursar.providers.dask)",
)

# ruff: noqa: E402
from bursar.providers.dask.config import ConfigError as ConfigError
from bursar.providers.dask.config import load_defaults as _load_defaults

_load_defaults()

from bursar.providers.dask.cluster import BursarCluster as BursarCluster
from bursar.providers.dask.job import BursarJob as BursarJob
from bursar.providers.dask.job import JobState as JobState

__all__ = ["BursarCluster", "BursarJob", "ConfigError", "JobState"]
