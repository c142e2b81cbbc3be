"""One Dask job = one Bursar lease: :class:`BursarJob`, dask-jobqueue's ``Job`` whose
"submission" is a lease request and whose workers start on the lease's resources.

Its life cycle is a :class:`bursar.providers.block.Block` on the cluster's event loop;
this module says what each step means to Dask::

    start ──Acquire(non-blocking)──► granted ──ACTIVE──► start_workers ──► running
      │  Refused(reason, retry_after): asked again after retry_after (bounded)
      │                                   renewed before each expiry (walltime again)
      ▼
    PREEMPT_WARNING ─► retire the job's workers through the scheduler (their data moves
                       to other workers) within the grace period, stop them, release ─┐
    renewal refused until lease_margin before expiry ─► the same graceful retire ──────┤
    REVOKED / EXPIRED ─► kill the workers at once (the resources are gone) ────────────┤
    the workers exit by themselves ─► release ──────────────────────────────────────────┤
                                                  the cluster closes and replaces the job
    close() (scale-down, cluster close) ─► stop the workers, release; idempotent

An elastic job (``elastic={"min": 1, "max": 4, "work": ..., "deadline": ...}``) holds one
elastic lease of ``min`` to ``max`` units, a unit being the job's size (``cores``,
``memory``, ``gpus``) with ``processes`` workers on it. The broker grows the lease at
once when capacity is spare: on RESIZED the job starts the new units' workers (unit ``k``
> 0 runs the job script with ``--name <job>-u<k>``). It shrinks the lease when others
need the capacity: on RESIZE_WARNING the job retires, through the scheduler (their tasks
and data move), the workers of the units the new size cannot hold, highest units first,
before the warning's deadline, then stops their processes. Unit 0 is never retired by a
resize (``min`` is at least 1), so the job keeps its name's workers for its whole life.

A job works on its own too, as dask-jobqueue's ``Job`` contract expects
(``JobQueueCluster(job_cls=BursarJob)``): without a ``session`` it makes one from the
``jobqueue.bursar`` config (``broker``, ``campaign``, ``token`` or ``$BURSAR_TOKEN``,
``log-directory``) and closes it with the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes
from dask_jobqueue.core import Job, job_parameters
from distributed.core import Status
from distributed.deploy.spec import ProcessInterface

from bursar.providers.block import (
    Block,
    Cause,
    Hooks,
    Input,
    LeaseSpec,
    ProcessTree,
    Retry,
    State,
    in_thread,
)
from bursar.providers.client import (
    AsyncBrokerClient,
    Backoff,
    Intent,
    Lease,
    LeaseClass,
    Tls,
)
from bursar.providers.dask.config import (
    CONFIG_NAME,
    ConfigError,
    bad,
    elastic_setting,
    setting,
    walltime_s,
)
from bursar.providers.elastic import Elastic, units_in
from bursar.providers.launch import launch_argv

if TYPE_CHECKING:
    from bursar.providers.dask.cluster import BursarCluster

__all__ = ["BursarJob", "JobState", "LeaseSession", "Resize"]

log = logging.getLogger("bursar.providers.dask")


class JobState(enum.StrEnum):
    """Where one job is."""

    REQUESTING = "requesting"
    """Asking the broker for a lease (refusals are retried)."""
    STARTING = "starting"
    """Granted; waiting for the lease to become usable (reclaim grace, node boot)."""
    RUNNING = "running"
    """The workers were started on the lease."""
    RETIRING = "retiring"
    """Preempted (or not renewable): the workers are being retired gracefully."""
    ENDED = "ended"
    """Workers stopped, lease released or ended."""


@dataclass(frozen=True)
class Resize:
    """One shrink of an elastic job, as it went: to ``units`` by ``deadline`` (clock
    time), the worker names it retired through the scheduler (``asked``), those the
    scheduler confirmed (``retired``: their data moved), and when it was done."""

    units: int
    deadline: float | None
    asked: list[str]
    retired: list[str]
    done_at: float


class LeaseSession:
    """What a cluster's jobs share: one broker client (created on the cluster's event
    loop, where the jobs run), the log directory, and the way back to the cluster."""

    def __init__(
        self,
        broker: str,
        campaign: str | None,
        token: str | None,
        *,
        tls: Tls = None,
        backoff: Backoff | None = None,
        retry_timeout_s: float | None = 60.0,
        log_directory: str | None = None,
    ) -> None:
        self.broker = broker
        self.campaign = campaign
        self._token = token
        self.tls = tls
        self.backoff = backoff
        self.retry_timeout_s = retry_timeout_s
        self.log_directory = log_directory
        self._client: AsyncBrokerClient | None = None
        self._cluster: Callable[[], BursarCluster | None] = lambda: None

    @classmethod
    def from_config(
        cls,
        broker: str | None = None,
        campaign: str | None = None,
        token: str | None = None,
        *,
        log_directory: str | None = None,
        **kw: Any,
    ) -> LeaseSession:
        """A session from these values, or where they are None from the
        ``jobqueue.bursar`` dask config (``token`` also from ``$BURSAR_TOKEN``)."""
        broker, broker_src = setting("broker", broker)
        host, sep, port = str(broker).rpartition(":")
        if not (isinstance(broker, str) and sep and host and port.isdigit()):
            raise bad("broker", broker, broker_src, '"host:port", e.g. "127.0.0.1:50051"')
        campaign, _ = setting("campaign", campaign)
        token, _ = setting("token", token)
        if token is None:
            token = os.environ.get("BURSAR_TOKEN")
        log_directory, _ = setting("log-directory", log_directory, kwarg="log_directory")
        return cls(broker, campaign, token, log_directory=log_directory, **kw)

    def __repr__(self) -> str:  # no token in logs
        return f"LeaseSession(broker={self.broker!r}, campaign={self.campaign!r})"

    def bind(self, cluster_ref: Callable[[], BursarCluster | None]) -> None:
        self._cluster = cluster_ref

    @property
    def cluster(self) -> BursarCluster | None:
        return self._cluster()

    def client(self) -> AsyncBrokerClient:
        """The shared client (call on the cluster's loop: it binds to the loop)."""
        if self._client is None:
            self._client = AsyncBrokerClient(
                self.broker,
                self._token,
                campaign=self.campaign,
                tls=self.tls,
                backoff=self.backoff,
                retry_timeout_s=self.retry_timeout_s,
            )
        return self._client

    def logs_dir(self) -> Path:
        if self.log_directory is None:
            self.log_directory = tempfile.mkdtemp(prefix="bursar-dask-")
        path = Path(self.log_directory)
        path.mkdir(parents=True, exist_ok=True)
        return path

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


class BursarJob(Job):
    __doc__ = f"""One lease, and the Dask workers started on it.

    Parameters
    ----------
    {job_parameters}
    session : LeaseSession
        The cluster's broker connection (BursarCluster passes it).
    walltime : str or float
        Each lease's duration, "HH:MM:SS" or seconds; the lease is renewed for as long
        again while the job lives.
    gpus : int
        GPUs per job (part of the lease), advertised to each worker process as the
        resource ``GPU`` (``--resources GPU=gpus/processes``).
    lease_class : str
        Lower the campaign's class for these leases ("opportunistic", ...).
    lease_margin : float
        Seconds: when the lease could not be renewed, the workers are retired this long
        before it expires.
    elastic : dict
        An elastic job: ``{{"min": 1, "max": 4, "work": 3600, "deadline": "01:00:00",
        "amdahl": 0.05, "value": 1}}`` (``min`` default 1, ``amdahl`` 0, ``value`` 1).
        One lease of ``min`` to ``max`` units of the job's size (cores, memory, gpus),
        each unit running ``processes`` workers; ``work`` is seconds of work on one unit,
        ``deadline`` from the job's start. The broker grows it when capacity is spare
        (workers start for the new units) and shrinks it when others need it (the lost
        units' workers are retired gracefully before the deadline it announces). Not for
        a preemptible campaign (the broker refuses it).
    """

    config_name = CONFIG_NAME

    def __init__(
        self,
        scheduler: str | None = None,
        name: str | None = None,
        *,
        session: LeaseSession | None = None,
        walltime: str | float | None = None,
        gpus: int | None = None,
        lease_class: str | None = None,
        lease_margin: float | None = None,
        retry_interval: tuple[float, float] | None = None,
        elastic: Mapping[str, Any] | None = None,
        config_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        cores, cores_src = setting("cores", kwargs.get("cores"))
        memory, memory_src = setting("memory", kwargs.get("memory"))
        if cores is None or memory is None:
            missing = [k for k, v in (("cores", cores), ("memory", memory)) if v is None]
            # dask-jobqueue's own wording (what its users search for), with what was given.
            raise ConfigError(
                "You must specify how much cores and memory per job you want to use, for "
                f"example:\ncluster = BursarCluster(cores={cores or 8}, "
                f"memory={memory or '24GB'!r})\n"
                f"given: cores={cores!r}, memory={memory!r} (one job is one lease of that "
                "size); or set "
                + " and ".join(f"jobqueue.{CONFIG_NAME}.{k}" for k in missing)
                + " in a dask config file"
            )
        if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
            raise bad("cores", cores, cores_src, "an integer >= 1")
        try:
            mem_bytes = parse_bytes(memory)
        except (ValueError, TypeError):
            mem_bytes = -1
        if mem_bytes <= 0:
            raise bad("memory", memory, memory_src, 'a positive size such as "4GiB" or "8 GB"')
        processes, proc_src = setting("processes", kwargs.get("processes"))
        if processes is not None and (
            isinstance(processes, bool)
            or not isinstance(processes, int)
            or not 1 <= processes <= cores
        ):
            raise bad("processes", processes, proc_src, f"an integer from 1 to cores ({cores})")
        gpus, gpus_src = setting("gpus", gpus)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise bad("gpus", gpus, gpus_src, "an integer >= 0")
        walltime, wall_src = setting("walltime", walltime)
        try:
            duration = walltime_s(walltime)
        except (ValueError, TypeError):
            raise bad(
                "walltime", walltime, wall_src, '"HH:MM:SS", "MM:SS" or seconds (> 0)'
            ) from None
        margin, margin_src = setting("lease-margin", lease_margin, kwarg="lease_margin")
        if (
            isinstance(margin, bool)
            or not isinstance(margin, int | float)
            or not 0 <= margin < duration / 2
        ):
            raise bad(
                "lease-margin",
                margin,
                margin_src,
                f"seconds, >= 0 and under half the walltime ({duration / 2:g} s)",
            )
        lclass, class_src = setting("lease-class", lease_class, kwarg="lease_class")
        try:
            parsed_class = LeaseClass.parse(lclass) if lclass else None
        except ValueError:
            raise bad(
                "lease-class", lclass, class_src, "interactive, batch, opportunistic"
            ) from None
        bounds, bounds_src = setting("retry-interval", retry_interval, kwarg="retry_interval")
        try:
            lo, hi = (float(b) for b in bounds)
            if not 0 < lo <= hi:
                raise ValueError
        except (TypeError, ValueError):
            raise bad(
                "retry-interval", bounds, bounds_src, "[min_s, max_s], 0 < min_s <= max_s"
            ) from None

        elastic_given, elastic_src = setting("elastic", elastic)
        parsed_elastic = elastic_setting(elastic_given, elastic_src)

        super().__init__(scheduler=scheduler, name=name, config_name=config_name, **kwargs)
        if gpus % self.worker_processes:
            raise bad(
                "gpus",
                gpus,
                gpus_src,
                f"a multiple of processes ({self.worker_processes}): each worker process "
                "advertises an equal share",
            )
        # On its own (JobQueueCluster(job_cls=BursarJob)), the job makes its session
        # from the jobqueue.bursar config, and closes it with itself.
        self._own_session = session is None
        self.session = session if session is not None else LeaseSession.from_config()
        self.walltime = walltime
        self.duration_s = duration
        self.gpus = gpus
        self.lease_class = parsed_class
        self.lease_margin = float(margin)
        self.retry_bounds = (lo, hi)
        if gpus:
            self._command_template += f" --resources GPU={gpus // self.worker_processes}"
        self.lease_size: dict[str, float] = {
            "cpu": float(cores),
            "mem_gb": round(mem_bytes / 1e9, 3),
        }
        if gpus:
            self.lease_size["gpu"] = float(gpus)
        self.elastic: Elastic | None = parsed_elastic
        """An elastic job's range and model (None: one fixed lease of ``lease_size``)."""
        self.labels = self._labels()
        self.job_header = self._header()

        # What happened, for users, tests and the benchmark.
        self.state = JobState.REQUESTING
        self.message = "not started"
        self.end_reason = ""
        self.retired: list[str] | None = None
        """After a graceful retire: the workers the scheduler retired (data moved)."""
        self.t_start: float | None = None
        self.t_granted: float | None = None
        self.t_workers: float | None = None
        self.stdout_path: Path | None = None
        self.stderr_path: Path | None = None
        self.block: Block | None = None
        """The job's lease and workers (from :meth:`start`)."""
        self.units: dict[int, ProcessTree] = {}
        """The workers of each unit of the lease (unit 0: the job's own, ``block.workers``)."""
        self.resizes: list[Resize] = []
        """An elastic job's shrinks, oldest first."""
        self.unit_counts: list[int] = []
        """An elastic job's units with workers, after each change, oldest first."""
        self._grace: float | None = None
        self._closed = False

    # ------------------------------------------------------------------ the script

    def _labels(self) -> dict[str, str]:
        labels = {"engine": "dask", "dask_job": str(self.name)}
        for d in self.job_extra_directives or []:
            key, sep, value = str(d).partition("=")
            if sep and key.strip():
                labels[key.strip()] = value.strip()
        return labels

    def _header(self) -> str:
        size = " ".join(f"{d}={v:g}" for d, v in self.lease_size.items())
        lines = [
            f"# bursar-lease: broker={self.session.broker if self.session else '?'}"
            f" campaign={(self.session.campaign if self.session else None) or '(token)'}",
            f"# bursar-lease: size {size}",
            f"# bursar-lease: duration={self.duration_s:g}s"
            + (f" class={self.lease_class.value.lower()}" if self.lease_class else ""),
            *(
                [
                    f"# bursar-lease: elastic min={self.elastic.min} max={self.elastic.max} "
                    f"units of the size above, work={self.elastic.work:g}s "
                    f"deadline={self.elastic.deadline:g}s"
                ]
                if self.elastic is not None
                else []
            ),
            f"# bursar-job: name={self.job_name}",
            *[f"# bursar-lease: label {d}" for d in self.job_extra_directives or []],
        ]
        return "\n".join(
            line for line in lines if not any(skip in line for skip in self.job_directives_skip)
        )

    @property
    def lease(self) -> Lease | None:
        """The job's lease as last reported (None before the grant)."""
        return self.block.lease if self.block is not None else None

    @property
    def lease_id(self) -> str:
        """The job's lease id ("" while it has none)."""
        return self.block.lease_id if self.block is not None else ""

    @property
    def refusals(self) -> list[str]:
        """The broker's reason for each refused request, oldest first."""
        return self.block.refusals if self.block is not None else []

    @property
    def pid(self) -> int | None:
        """The process (and session) id of the job's workers; None before they start."""
        w = self.block.workers if self.block is not None else None
        return w.pid if w is not None else None

    @property
    def worker_names(self) -> list[str]:
        """The names the job's workers register under (an elastic job's: every unit's
        that has workers, unit 0's when none has yet)."""
        return [n for k in sorted(self.units) or [0] for n in self.unit_worker_names(k)]

    def unit_worker_names(self, k: int) -> list[str]:
        """The names unit ``k``'s workers register under."""
        base = str(self.name) if k == 0 else f"{self.name}-u{k}"
        if self.worker_processes > 1:
            return [f"{base}-{i}" for i in range(self.worker_processes)]
        return [base]

    def units_in(self, size: Mapping[str, float]) -> int:
        """How many whole units of the job's size ``size`` holds."""
        return units_in(self.lease_size, size)

    def intent(self) -> Intent:
        """The elastic job's intent, its deadline from now."""
        assert self.elastic is not None
        return self.elastic.intent(self.lease_size)

    # ------------------------------------------------------------------ ProcessInterface

    async def start(self) -> None:
        """Ask for the lease and return once the broker answered (or after 30 s): a
        refusal leaves the job requesting in the background; an error that retrying
        cannot fix (bad token, unknown campaign, a size no pool can hold) is raised."""
        if self.block is not None:
            raise RuntimeError(f"job {self.name} was started already")
        self.t_start = time.monotonic()
        lo, hi = self.retry_bounds
        self.block = Block(
            str(self.name),
            self.session.client(),
            LeaseSpec(
                self.lease_size,
                self.duration_s,
                renew_margin_s=self._renew_margin(),
                lease_class=self.lease_class,
                labels=self.labels,
                intent=self.intent() if self.elastic is not None else None,
            ),
            _JobHooks(self),
            retry=Retry(lo, hi),
            expiry_margin_s=self.lease_margin,
        )
        self.block.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.block.answered.wait(), 30.0)
        if self._rejected_at_once():
            self.status = Status.failed
            assert self.block.error is not None
            raise self.block.error
        await ProcessInterface.start(self)

    async def close(self) -> None:
        """Stop the workers and release the lease; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.block is not None:
            self.block.cancel()
            await self.block.done.wait()
        if self.state is not JobState.ENDED:
            self._set(JobState.ENDED, self.end_reason or "closed by the cluster")
        if self._own_session:
            await self.session.aclose()
        await ProcessInterface.close(self)

    # ------------------------------------------------------------------ life

    def _set(self, state: JobState, message: str) -> None:
        self.state, self.message = state, message
        log.info("job %s: %s (%s)", self.name, state.value, message)

    def _renew_margin(self) -> float:
        # The client's default (half the duration, at most 60 s before expiry), but well
        # before the point where the job would retire for want of a renewal.
        d = self.duration_s
        return min(max(min(d / 2, 60.0), 2 * self.lease_margin, 1.0), d * 0.9)

    def _rejected_at_once(self) -> bool:
        b = self.block
        return b is not None and b.cause is Cause.REJECTED and b.attempts == 1

    def _ended(self, reason: str, failed: bool = False) -> None:
        self.end_reason = reason
        self._set(JobState.ENDED, reason)
        cluster = self.session.cluster
        if cluster is not None and not self._closed:
            cluster._job_ended(self, reason, failed=failed)

    def _outcome(self, b: Block) -> tuple[str, bool]:
        """Why the job ended, and whether that counts as a failure of its workers."""
        lid, final, cause = b.lease_id, b.final_state, b.cause
        if cause is Cause.REJECTED:
            return f"the broker would not take the request: {b.error}", True
        if cause is Cause.ERROR:
            return f"the job failed: {b.error!r}", False
        if cause is Cause.PREEMPTED:
            return f"lease {lid} preempted: workers retired, lease {final}", False
        if cause is Cause.UNRENEWABLE:
            return f"lease {lid} could not be renewed: workers retired, lease {final}", False
        if cause is Cause.EXITED:
            rc = b.returncode
            return f"workers exited with {rc}; lease {lid} {final}", rc != 0
        if cause is Cause.CANCELLED:
            return self.end_reason or "closed by the cluster", False
        ev, lease = b.end_event, b.lease
        kind = ev.kind.value.lower() if ev is not None else final
        why = (ev.cause or ev.lease.end_cause) if ev is not None else lease and lease.end_cause
        return f"lease {lid} {kind}" + (f" ({why})" if why else ""), False

    async def _retire(self, budget_s: float) -> None:
        """Retire the job's workers through the scheduler (their data moves to other
        workers), within ``budget_s``."""
        if self.pid is None:
            return
        self._set(JobState.RETIRING, f"retiring {', '.join(self.worker_names)}")
        cluster = self.session.cluster
        if cluster is None:
            return
        self.retired = await cluster._retire_workers(self.worker_names, budget_s)

    # ------------------------------------------------------------------ worker processes

    def _worker_env(self, lease: Lease) -> dict[str, str]:
        env = dict(os.environ)
        bin_dir = os.path.dirname(sys.executable)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["BURSAR_LEASE_ID"] = lease.id
        env["BURSAR_LEASE_NODES"] = ",".join(lease.nodes)
        env["BURSAR_CAMPAIGN"] = lease.campaign
        env["BURSAR_BROKER"] = self.session.broker
        env["JOB_ID"] = lease.id
        return env

    def _worker_argv(self, lease: Lease, script: Path) -> list[str]:
        """The command that runs this job's script, and so its workers, on ``lease``'s
        resources. On the simulated pool (and this machine's own), a local ``bash``;
        a backend whose leases live elsewhere (Slurm: ``srun --jobid=N --overlap``)
        wraps it here, and only here."""
        return launch_argv(lease, ["/bin/bash", str(script)])

    def _start_workers(self, lease: Lease) -> ProcessTree:
        """Write the job script and start it, in a session of its own."""
        workers = self._start_unit(0, lease)
        self.t_workers = time.monotonic()
        self._set(JobState.RUNNING, f"lease {lease.id} on {','.join(lease.nodes) or '?'}")
        return workers

    def _start_unit(self, k: int, lease: Lease) -> ProcessTree:
        """Start unit ``k``'s workers: the job script, under the unit's name."""
        tag = "" if k == 0 else f".u{k}"
        stem = f"{self.name}.{lease.id}{tag}"
        logs = self.session.logs_dir()
        # Named whole, not by with_suffix (which would take ".u1" for a suffix).
        script = logs / f"{stem}.sh"
        text = self.job_script()
        if k:
            # The one place the job script names its workers (dask-jobqueue's template).
            text = text.replace(f" --name {self.name} ", f" --name {self.name}-u{k} ", 1)
        script.write_text(text)
        out, err = logs / f"{stem}.out", logs / f"{stem}.err"
        if k == 0:
            self.stdout_path, self.stderr_path = out, err
        env = self._worker_env(lease)
        env["BURSAR_UNIT"] = str(k)
        workers = ProcessTree.start(self._worker_argv(lease, script), env, out, err)
        self.units[k] = workers
        return workers

    async def _grow_to(self, n: int, lease: Lease) -> None:
        """Workers on units 0 to n - 1; what runs on units from ``n`` up stops at once
        (the lease no longer holds them: a shrink whose retire did not finish in time)."""
        for k in range(1, n):
            if k not in self.units:
                self._start_unit(k, lease)
        gone = [k for k in self.units if k >= n and k > 0]
        for k in gone:
            await in_thread(self.units.pop(k).stop, 0.0)
        if not self.unit_counts or self.unit_counts[-1] != len(self.units):
            self.unit_counts.append(len(self.units))
            log.info(
                "job %s: workers on %d units of lease %s", self.name, len(self.units), lease.id
            )

    async def _shrink_to(self, n: int, deadline: float | None, now: Callable[[], float]) -> None:
        """Retire the workers of units ``n`` and up through the scheduler before
        ``deadline``, then stop their processes."""
        going = sorted((k for k in self.units if k >= max(n, 1)), reverse=True)
        if not going:
            return
        names = [w for k in going for w in self.unit_worker_names(k)]
        t = now()
        left = max(0.2, (deadline if deadline is not None else t + 1.0) - t)
        cluster = self.session.cluster
        retired: list[str] = []
        if cluster is not None:
            retired = await cluster._retire_workers(names, left - min(0.3, left * 0.25))
        grace = max(0.0, min(1.0, (deadline or t) - now() - 0.1))
        for k in going:
            tree = self.units.pop(k, None)
            if tree is not None:
                await in_thread(tree.stop, grace)
        self.resizes.append(Resize(n, deadline, names, retired, now()))
        self.unit_counts.append(len(self.units))
        log.info("job %s: retired %s for a shrink to %d units", self.name, retired, n)

    async def _stop_units(self, workers: ProcessTree, grace_s: float) -> None:
        trees = [workers, *(t for k, t in self.units.items() if k > 0)]
        await asyncio.gather(*(in_thread(t.stop, grace_s) for t in trees))

    def logs(self) -> dict[str, str]:
        """The workers' stdout and stderr so far (an elastic job's other units' too)."""
        out = {}
        for kind, path in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            if path is not None and path.exists():
                out[kind] = path.read_text(errors="replace")
                for extra in sorted(path.parent.glob(f"{path.stem}.u*{path.suffix}")):
                    unit = extra.name.removesuffix(path.suffix).rpartition(".")[2]
                    out[f"{kind} {unit}"] = extra.read_text(errors="replace")
        return out

    def __repr__(self) -> str:
        return f"<BursarJob {self.name}: {self.state.value}, lease {self.lease_id or '-'}>"


class _JobHooks(Hooks):
    """What each step of the block's life means to a Dask job."""

    def __init__(self, job: BursarJob) -> None:
        self.job = job

    def changed(self, block: Block, old: State, inp: Input) -> None:
        job = self.job
        if inp is Input.REFUSED:
            job._set(JobState.REQUESTING, f"refused by the broker: {block.refusal}")
        elif inp is Input.UNREACHABLE:
            job._set(
                JobState.REQUESTING,
                f"broker unreachable: {block.last_error}; again in {block.retry.max_s} s",
            )
        elif inp is Input.GRANTED:
            assert block.lease is not None
            job.t_granted = time.monotonic()
            job._set(
                JobState.STARTING,
                f"lease {block.lease_id} granted ({block.lease.path.value.lower()})",
            )
        elif block.state.terminal:
            reason, failed = job._outcome(block)
            if job._rejected_at_once() or block.cause is Cause.CANCELLED:
                job._set(JobState.ENDED, reason)  # start() raises it / closed by the cluster
            else:
                job._ended(reason, failed=failed)

    async def start_workers(self, block: Block, lease: Lease) -> ProcessTree:
        workers = self.job._start_workers(lease)
        if self.job.elastic is not None:
            await self.job._grow_to(self.job.units_in(block.usable), lease)
        return workers

    async def resize(
        self,
        block: Block,
        lease: Lease,
        warned_to: Mapping[str, float],
        deadline: float | None,
    ) -> None:
        await self.job._shrink_to(self.job.units_in(warned_to), deadline, block.clock.now)

    async def resized(self, block: Block, lease: Lease) -> None:
        await self.job._grow_to(self.job.units_in(block.usable), lease)

    async def stop_workers(self, block: Block, workers: ProcessTree, grace_s: float) -> None:
        await self.job._stop_units(workers, grace_s)

    async def drain(self, block: Block, deadline: float | None) -> None:
        job, now = self.job, block.clock.now()
        if block.cause is Cause.UNRENEWABLE:  # retire before it expires
            left = max(0.2, (deadline or now) - now)
            await job._retire(min(job.lease_margin, left) * 0.8)
            return
        deadline = deadline if deadline else now + 1.0
        left = max(0.2, deadline - now)
        await job._retire(left - min(0.3, left * 0.25))
        job._grace = max(0.0, min(1.0, deadline - block.clock.now() - 0.1))

    def stop_grace(self, block: Block) -> float:
        if block.cause in (Cause.REVOKED, Cause.EXPIRED, Cause.RELEASED):
            return 0.0  # the resources are gone: nothing to retire to, stop at once
        if block.cause is Cause.CANCELLED:
            return 3.0
        if block.cause is Cause.PREEMPTED and self.job._grace is not None:
            return self.job._grace
        return 0.5


def worker_job(name: str, processes: int) -> str:
    """The job a worker name belongs to (``<job>-<k>`` when a job runs several; an
    elastic job's unit ``u`` adds ``-u<u>`` before that)."""
    if processes > 1:
        head, _, tail = name.rpartition("-")
        if head and tail.isdigit():
            name = head
    head, _, tail = name.rpartition("-")
    if head and tail[:1] == "u" and tail[1:].isdigit():
        return head
    return name


class JobOfWorker:
    """Adaptive's ``worker_key``: group workers by job, so that scale-down retires whole
    jobs (picklable: it is sent to the scheduler)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes

    def __call__(self, ws: Any) -> str:
        return worker_job(str(ws.name), self.processes)
