"""``BursarCluster``: a dask-jobqueue cluster whose jobs are Bursar leases.

Written where one would write ``SLURMCluster(...)``::

    from bursar.providers.dask import BursarCluster
    from dask.distributed import Client

    cluster = BursarCluster(
        cores=4, memory="16GiB", processes=2, gpus=0, walltime="00:30:00",
        broker="127.0.0.1:50051", campaign="sci", token=TOKEN,
    )
    cluster.adapt(minimum_jobs=0, maximum_jobs=8)
    client = Client(cluster)

What Bursar adds to dask-jobqueue's behaviour:

* **Each job is one lease** of ``{"cpu": cores, "mem_gb": memory, "gpu": gpus}`` (memory
  in decimal GB, ``"16GiB"`` is 17.18); its
  workers start when the lease is usable, as a local process group on the simulated pool
  (``BursarJob._worker_argv`` is the one place a remote backend would wrap).
* **Walltime is the lease's duration, and the lease is renewed** while the job lives
  (Bursar's choice over ``--lifetime``: workers are not restarted every walltime, and a
  refused renewal is retried). If renewals keep failing, the job's workers are retired
  gracefully ``lease_margin`` seconds before the lease expires, and the job replaced.
* **Preemption is graceful:** on a PREEMPT_WARNING the job's workers are retired through
  the scheduler (their results move to other workers) within the grace period, then the
  lease is released and the job replaced.
* **A lost lease is replaced at once:** on REVOKED/EXPIRED the job's processes are
  killed, the job closed and a new one requested, without waiting for
  ``distributed.deploy.lost-worker-timeout``; the same holds for ``processes > 1``,
  where SpecCluster alone never notices (distributed#9102).
* **close() releases every lease**, idempotently; leases of a crashed client expire
  after their walltime.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

import dask
from dask_jobqueue.core import JobQueueCluster, cluster_parameters, job_parameters
from distributed.core import Status
from distributed.deploy.adaptive import Adaptive

from bursar.providers.client import Backoff, Tls
from bursar.providers.dask.job import BursarJob, JobOfWorker, LeaseSession, worker_job

__all__ = ["BursarCluster"]

log = logging.getLogger("bursar.providers.dask")

_MAX_FAILED_IN_A_ROW = 3
"""Jobs whose workers exit with an error, one after another, before replacing stops."""


class BursarCluster(JobQueueCluster):
    __doc__ = f"""Dask workers on Bursar leases: one job is one lease.

    Parameters
    ----------
    broker : str
        ``host:port`` of the broker (``bursar serve``).
    campaign : str
        The campaign the leases are charged to (default: the token's).
    token : str
        The campaign's token (default: ``jobqueue.bursar.token``, then ``$BURSAR_TOKEN``).
    walltime, gpus, lease_class, lease_margin, retry_interval
        See :class:`BursarJob`.
    tls, backoff, retry_timeout_s
        For the broker client (see ``bursar.providers.client.AsyncBrokerClient``).
    {job_parameters}
    {cluster_parameters}

    Defaults come from the ``jobqueue.bursar`` dask config section (shipped in
    ``bursar.yaml``).
    """

    job_cls = BursarJob

    def __init__(
        self,
        n_workers: int = 0,
        *,
        broker: str | None = None,
        campaign: str | None = None,
        token: str | None = None,
        tls: Tls = None,
        backoff: Backoff | None = None,
        retry_timeout_s: float | None = 60.0,
        log_directory: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.session = LeaseSession.from_config(
            broker,
            campaign,
            token,
            tls=tls,
            backoff=backoff,
            retry_timeout_s=retry_timeout_s,
            log_directory=log_directory,
        )
        log_directory = self.session.log_directory
        self.session.bind(weakref.ref(self))
        self.ended_jobs: list[BursarJob] = []
        """Jobs that ended while the cluster ran (preempted, revoked, expired, exited),
        oldest first; each was replaced unless the cluster was scaling down."""
        self._failed_in_a_row = 0
        self._closing_session = False
        super().__init__(
            n_workers,
            session=self.session,
            log_directory=log_directory,
            **kwargs,
        )

    # ------------------------------------------------------------------ dask-jobqueue

    def new_worker_spec(self) -> dict[str, dict[str, Any]]:
        # Never reuse a name: a replaced job's workers may still be registered under it.
        while True:
            name = self._new_worker_name(self._i)
            self._i += 1
            if name not in self.worker_spec and name not in self.workers:
                return {name: self.new_spec}

    def _processes(self) -> int:
        if "_worker_processes" not in self.__dict__:
            self.__dict__["_worker_processes"] = self._dummy_job.worker_processes
        return int(self.__dict__["_worker_processes"])

    def adapt(self, *args: Any, **kwargs: Any) -> Adaptive:
        """Scale with the scheduler's load (``minimum``/``maximum`` workers, or
        ``minimum_jobs``/``maximum_jobs``; ``interval``, ``wait_count``,
        ``target_duration``: see ``distributed.Adaptive``). With ``processes > 1`` the
        workers are grouped by job, so that scale-down retires whole leases."""
        processes = self._processes()
        if processes > 1:
            kwargs.setdefault("worker_key", JobOfWorker(processes))
        return super().adapt(*args, **kwargs)

    @property
    def jobs(self) -> dict[str, BursarJob]:
        """The live jobs, by name."""
        return {n: j for n, j in self.workers.items() if isinstance(j, BursarJob)}

    def lease_ids(self) -> list[str]:
        """The leases the cluster's live jobs hold."""
        return [j.lease_id for j in self.jobs.values() if j.lease_id]

    # ------------------------------------------------------------------ lease events

    def _job_ended(self, job: BursarJob, reason: str, *, failed: bool = False) -> None:
        """A job's lease or workers ended on their own: close it and, unless the
        cluster is shrinking or closing, put a fresh job in its place now."""
        self.ended_jobs.append(job)
        name = job.name
        if self.status in (Status.closing, Status.closed) or name not in self.worker_spec:
            return
        self._failed_in_a_row = self._failed_in_a_row + 1 if failed else 0
        spec = self.worker_spec.pop(name)
        if self._failed_in_a_row < _MAX_FAILED_IN_A_ROW:
            name_new, _ = next(iter(self.new_worker_spec().items()))
            self.worker_spec[name_new] = spec
            log.info("job %s ended (%s): replaced by %s", name, reason, name_new)
        else:
            log.error(
                "job %s ended (%s): %d jobs in a row lost their workers to errors; not "
                "replacing it (see cluster.get_logs())",
                name,
                reason,
                self._failed_in_a_row,
            )
        self.loop.add_callback(self._correct_state)

    async def _retire_workers(self, names: list[str], budget_s: float) -> list[str]:
        """Retire ``names`` through the scheduler (their data moves to other workers)
        within ``budget_s``; the names it retired."""
        if self.scheduler_comm is None or self.status is not Status.running:
            return []
        amm_s = dask.utils.parse_timedelta(
            dask.config.get("distributed.scheduler.active-memory-manager.interval")
        )
        if budget_s < 2 * amm_s:
            log.warning(
                "retiring %s within %.2f s, but the scheduler moves data every %.2f s: lower "
                "distributed.scheduler.active-memory-manager.interval for short grace periods",
                names,
                budget_s,
                amm_s,
            )
        try:
            out = await asyncio.wait_for(
                self.scheduler_comm.retire_workers(names=names, close_workers=True, remove=True),
                max(0.05, budget_s),
            )
        except (TimeoutError, OSError) as exc:
            log.warning("could not retire %s in %.2f s: %r", names, budget_s, exc)
            return []
        return [str(ws.get("name", a)) for a, ws in (out or {}).items()]

    def _update_worker_status(self, op: str, msg: Any) -> None:
        # SpecCluster looks a departed worker's name up in `workers` to close its job
        # after lost-worker-timeout; with processes > 1 the names carry suffixes and it
        # never matches (distributed#9102). Map them to the job, and close and replace
        # the job once none of its workers is left.
        if op == "remove":
            processes = self._processes()
            name = str(self.scheduler_info["workers"].get(msg, {}).get("name", ""))
            job_name = worker_job(name, processes)
            if processes > 1 and job_name != name:
                delay = dask.utils.parse_timedelta(
                    dask.config.get("distributed.deploy.lost-worker-timeout")
                )

                def check() -> None:
                    job = self.workers.get(job_name)
                    left = [
                        d
                        for d in self.scheduler_info["workers"].values()
                        if worker_job(str(d.get("name")), processes) == job_name
                    ]
                    if isinstance(job, BursarJob) and not left and not job._closed:
                        job.end_reason = "its workers left the scheduler"
                        self._job_ended(job, job.end_reason)

                asyncio.get_running_loop().call_later(delay, check)
        super()._update_worker_status(op, msg)

    # ------------------------------------------------------------------ logs, close

    async def _get_logs(
        self, cluster: bool = True, scheduler: bool = True, workers: Any = True
    ) -> Any:
        logs = await super()._get_logs(cluster=cluster, scheduler=scheduler, workers=workers)
        if cluster:
            from distributed.utils import Log

            for name, job in [*((j.name, j) for j in self.ended_jobs), *self.jobs.items()]:
                for kind, text in job.logs().items():
                    logs[f"Job {name} {kind}"] = Log(text)
        return logs

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            # Jobs closed above released their leases; a job still requesting when the
            # scheduler went away is closed here too.
            for job in list(self._created):
                if isinstance(job, BursarJob):
                    await job.close()
            await self.session.aclose()

    def __repr__(self) -> str:
        try:
            address = self.scheduler_address
        except (AttributeError, ValueError):
            address = "not started"
        return (
            f"BursarCluster({self._name!r}, {address!r}, "
            f"broker={self.session.broker!r}, campaign={self.session.campaign!r}, "
            f"jobs={len(self.worker_spec)}, workers={len(self.scheduler_info['workers'])})"
        )
