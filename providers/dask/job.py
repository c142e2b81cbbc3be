"""One Dask job = one Bursar lease: :class:`BursarJob`, dask-jobqueue's ``Job`` whose
"submission" is a lease request and whose workers start on the lease's resources.

Life cycle (one background task per job, on the cluster's event loop)::

    start ──Acquire(non-blocking)──► granted ──ACTIVE──► _start_workers ──► running
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
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dask.utils import parse_bytes
from dask_jobqueue.core import Job, job_parameters
from distributed.core import Status
from distributed.deploy.spec import ProcessInterface

from bursar.providers.client import (
    AsyncBrokerClient,
    Backoff,
    BursarClientError,
    DeadlineExceeded,
    Lease,
    LeaseClass,
    LeaseHandle,
    Refused,
    Tls,
    Unavailable,
)
from bursar.providers.dask.config import CONFIG_NAME, ConfigError, bad, setting, walltime_s
from bursar.providers.launch import launch_argv

if TYPE_CHECKING:
    from bursar.providers.dask.cluster import BursarCluster

__all__ = ["BursarJob", "JobState", "LeaseSession"]

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


def _first(*aws: Awaitable[Any]) -> list[asyncio.Future[Any]]:
    return [asyncio.ensure_future(a) for a in aws]


async def _wait_first(futs: list[asyncio.Future[Any]]) -> None:
    try:
        await asyncio.wait(futs, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in futs:
            if not f.done():
                f.cancel()


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
        config_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        cores, cores_src = setting("cores", kwargs.get("cores"))
        memory, memory_src = setting("memory", kwargs.get("memory"))
        if cores is None or memory is None:
            missing = [k for k, v in (("cores", cores), ("memory", memory)) if v is None]
            raise ConfigError(
                f"BursarCluster needs {' and '.join(missing)} per job (one job is one "
                "lease): pass them, e.g. BursarCluster(cores=4, memory='16GiB'), or set "
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

        super().__init__(scheduler=scheduler, name=name, config_name=config_name, **kwargs)
        if gpus % self.worker_processes:
            raise bad(
                "gpus",
                gpus,
                gpus_src,
                f"a multiple of processes ({self.worker_processes}): each worker process "
                "advertises an equal share",
            )
        self.session = session
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
        self.labels = self._labels()
        self.job_header = self._header()

        # What happened, for users, tests and the benchmark.
        self.state = JobState.REQUESTING
        self.message = "not started"
        self.refusals: list[str] = []
        self.lease_id = ""
        self.end_reason = ""
        self.retired: list[str] | None = None
        """After a graceful retire: the workers the scheduler retired (data moved)."""
        self.t_start: float | None = None
        self.t_granted: float | None = None
        self.t_workers: float | None = None
        self.stdout_path: Path | None = None
        self.stderr_path: Path | None = None
        self._handle: LeaseHandle | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._answered: asyncio.Event | None = None
        self._error: BaseException | None = None
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
            f"# bursar-job: name={self.job_name}",
            *[f"# bursar-lease: label {d}" for d in self.job_extra_directives or []],
        ]
        return "\n".join(
            line for line in lines if not any(skip in line for skip in self.job_directives_skip)
        )

    @property
    def lease(self) -> Lease | None:
        """The job's lease as last reported (None before the grant)."""
        return self._handle.lease if self._handle is not None else None

    @property
    def pid(self) -> int | None:
        """The process (and process group) id of the job's workers; None before they
        start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def worker_names(self) -> list[str]:
        """The names the job's workers register under."""
        if self.worker_processes > 1:
            return [f"{self.name}-{i}" for i in range(self.worker_processes)]
        return [str(self.name)]

    # ------------------------------------------------------------------ ProcessInterface

    async def start(self) -> None:
        """Ask for the lease and return once the broker answered (or after the client's
        call timeout): a refusal leaves the job requesting in the background; an error
        that retrying cannot fix (bad token, unknown campaign, a size no pool can hold)
        is raised."""
        if self.session is None:
            raise RuntimeError("a BursarJob is started by its BursarCluster")
        self.t_start = time.monotonic()
        self._answered = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"bursar job {self.name}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), 30.0)
        if self._error is not None:
            self.status = Status.failed
            raise self._error
        await ProcessInterface.start(self)

    async def close(self) -> None:
        """Stop the workers and release the lease; idempotent."""
        if self._closed:
            return
        self._closed = True
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._stop_workers(3.0)
        await self._release()
        if self.state is not JobState.ENDED:
            self._set(JobState.ENDED, self.end_reason or "closed by the cluster")
        await ProcessInterface.close(self)

    # ------------------------------------------------------------------ life

    def _set(self, state: JobState, message: str) -> None:
        self.state, self.message = state, message
        log.info("job %s: %s (%s)", self.name, state.value, message)

    async def _acquire(self) -> LeaseHandle:
        client = self.session.client()  # type: ignore[union-attr]
        lo, hi = self.retry_bounds
        attempt = 0
        while True:
            attempt += 1
            h = client.held_lease(
                self.lease_size,
                self.duration_s,
                renew_margin_s=self._renew_margin(),
                blocking=False,
                lease_class=self.lease_class,
                labels=self.labels,
            )
            try:
                await h.start()
                return h
            except Refused as exc:
                delay = exc.retry_after if math.isfinite(exc.retry_after) else hi
                delay = min(max(delay, lo), hi)
                self.refusals.append(exc.reason)
                self._set(
                    JobState.REQUESTING,
                    f"refused by the broker: {exc.reason}: {exc.message} "
                    f"(attempt {attempt}; again in {delay:.1f} s)",
                )
            except (Unavailable, DeadlineExceeded) as exc:
                delay = hi
                self._set(JobState.REQUESTING, f"broker unreachable: {exc}; again in {delay} s")
            finally:
                assert self._answered is not None
                self._answered.set()
            await asyncio.sleep(delay)

    def _renew_margin(self) -> float:
        # The client's default (half the duration, at most 60 s before expiry), but well
        # before the point where the job would retire for want of a renewal.
        d = self.duration_s
        return min(max(min(d / 2, 60.0), 2 * self.lease_margin, 1.0), d * 0.9)

    async def _run(self) -> None:
        try:
            try:
                h = await self._acquire()
            except BursarClientError as exc:  # not worth retrying
                self._error = exc
                reason = f"the broker would not take the request: {exc}"
                if self.status is Status.running:  # asked again after a refusal: tell the cluster
                    self._ended(reason, failed=True)
                else:  # the first answer: start() raises it
                    self._set(JobState.ENDED, reason)
                return
            finally:
                assert self._answered is not None
                self._answered.set()
            self._handle, self.lease_id = h, h.id
            self.t_granted = time.monotonic()
            self._set(JobState.STARTING, f"lease {h.id} granted ({h.lease.path.value.lower()})")
            await _wait_first(_first(h.active.wait(), h.ended.wait(), h.preempted.wait()))
            if h.active.is_set() and not (h.ended.is_set() or h.preempted.is_set()):
                await self._start_workers(h.lease)
            await self._watch(h)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug or an OS error: the job failed, say why
            log.exception("job %s failed", self.name)
            await self._stop_workers(0.5)
            await self._release()
            self._ended(f"the job failed: {exc!r}")

    async def _watch(self, h: LeaseHandle) -> None:
        """Wait for the lease or the workers to end; then retire, stop, release, and tell
        the cluster."""
        futs = _first(h.preempted.wait(), h.ended.wait(), self._expiry_guard(h))
        if self._proc is not None:
            futs.append(asyncio.ensure_future(self._proc.wait()))
        await _wait_first(futs)
        if h.ended.is_set():
            ev = h.end_event
            kind = ev.kind.value.lower() if ev is not None else h.lease.state.value.lower()
            cause = ev.cause or ev.lease.end_cause if ev is not None else h.lease.end_cause
            # The resources are gone: nothing to retire to, stop at once.
            await self._stop_workers(0.0)
            await self._release()
            self._ended(f"lease {h.id} {kind}" + (f" ({cause})" if cause else ""))
        elif h.preempted.is_set():
            ev = h.preempt_event
            deadline = ev.deadline if ev is not None and ev.deadline else time.time() + 1.0
            left = max(0.2, deadline - time.time())
            await self._retire(left - min(0.3, left * 0.25))
            await self._stop_workers(max(0.0, min(1.0, deadline - time.time() - 0.1)))
            final = await self._release()
            self._ended(f"lease {h.id} preempted: workers retired, lease {final}")
        elif self._proc is not None and self._proc.returncode is not None:
            rc = self._proc.returncode
            await self._stop_workers(0.5)
            final = await self._release()
            self._ended(f"workers exited with {rc}; lease {h.id} {final}", failed=rc != 0)
        else:  # not renewable: retire before it expires
            left = max(0.2, h.lease.expires_at - time.time())
            await self._retire(min(self.lease_margin, left) * 0.8)
            await self._stop_workers(0.5)
            final = await self._release()
            self._ended(f"lease {h.id} could not be renewed: workers retired, lease {final}")

    async def _expiry_guard(self, h: LeaseHandle) -> None:
        """Returns ``lease_margin`` before the lease expires (renewals move that on).
        ``expires_at`` is on the broker's clock: the margin absorbs a small skew."""
        changed = asyncio.Event()
        h.add_listener(lambda _h: changed.set())
        while True:
            left = h.lease.expires_at - time.time() - self.lease_margin
            if left <= 0:
                return
            changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    def _ended(self, reason: str, failed: bool = False) -> None:
        self.end_reason = reason
        self._set(JobState.ENDED, reason)
        cluster = self.session.cluster if self.session is not None else None
        if cluster is not None and not self._closed:
            cluster._job_ended(self, reason, failed=failed)

    async def _retire(self, budget_s: float) -> None:
        """Retire the job's workers through the scheduler (their data moves to other
        workers), within ``budget_s``."""
        if self._proc is None:
            return
        self._set(JobState.RETIRING, f"retiring {', '.join(self.worker_names)}")
        cluster = self.session.cluster if self.session is not None else None
        if cluster is None:
            return
        self.retired = await cluster._retire_workers(self.worker_names, budget_s)

    async def _release(self) -> str:
        """Release the lease (idempotent); its final state."""
        h = self._handle
        if h is None:
            return "none"
        try:
            final = (await h.release()).state.value.lower()
        except BursarClientError as exc:
            log.warning("job %s: could not release %s: %s", self.name, h.id, exc)
            final = "left to expire"
        with contextlib.suppress(Exception):
            await h.__aexit__(None, None, None)
        return final

    # ------------------------------------------------------------------ worker processes

    def _worker_env(self, lease: Lease) -> dict[str, str]:
        env = dict(os.environ)
        bin_dir = os.path.dirname(sys.executable)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["BURSAR_LEASE_ID"] = lease.id
        env["BURSAR_LEASE_NODES"] = ",".join(lease.nodes)
        env["BURSAR_CAMPAIGN"] = lease.campaign
        env["BURSAR_BROKER"] = self.session.broker if self.session is not None else ""
        env["JOB_ID"] = lease.id
        return env

    def _worker_argv(self, lease: Lease, script: Path) -> list[str]:
        """The command that runs this job's script, and so its workers, on ``lease``'s
        resources. On the simulated pool (and this machine's own), a local ``bash``;
        a backend whose leases live elsewhere (Slurm: ``srun --jobid=N --overlap``)
        wraps it here, and only here."""
        return launch_argv(lease, ["/bin/bash", str(script)])

    async def _start_workers(self, lease: Lease) -> None:
        """Write the job script and start it, in its own process group."""
        base = self.session.logs_dir() / f"{self.name}.{lease.id}"  # type: ignore[union-attr]
        script = base.with_suffix(".sh")
        script.write_text(self.job_script())
        self.stdout_path, self.stderr_path = base.with_suffix(".out"), base.with_suffix(".err")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self._proc = await asyncio.create_subprocess_exec(
                *self._worker_argv(lease, script),
                env=self._worker_env(lease),
                stdout=out,
                stderr=err,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        self.t_workers = time.monotonic()
        self._set(JobState.RUNNING, f"lease {lease.id} on {','.join(lease.nodes) or '?'}")

    async def _stop_workers(self, grace_s: float) -> None:
        """SIGTERM the job's process group (SIGKILL at once when ``grace_s`` is 0); SIGKILL
        what is left after ``grace_s``."""
        proc = self._proc
        if proc is None:
            return
        steps = [(signal.SIGKILL, 5.0)] if grace_s <= 0 else [(signal.SIGTERM, grace_s)]
        steps += [(signal.SIGKILL, 5.0)]
        for sig, wait_s in steps:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), wait_s)
        # The leader may be gone before the rest of its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def logs(self) -> dict[str, str]:
        """The workers' stdout and stderr so far."""
        out = {}
        for kind, path in (("stdout", self.stdout_path), ("stderr", self.stderr_path)):
            if path is not None and path.exists():
                out[kind] = path.read_text(errors="replace")
        return out

    def __repr__(self) -> str:
        return f"<BursarJob {self.name}: {self.state.value}, lease {self.lease_id or '-'}>"


def worker_job(name: str, processes: int) -> str:
    """The job a worker name belongs to (``<job>-<k>`` when a job runs several)."""
    if processes > 1:
        head, _, tail = name.rpartition("-")
        if head and tail.isdigit():
            return head
    return name


class JobOfWorker:
    """Adaptive's ``worker_key``: group workers by job, so that scale-down retires whole
    jobs (picklable: it is sent to the scheduler)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes

    def __call__(self, ws: Any) -> str:
        return worker_job(str(ws.name), self.processes)
