"""A Parsl execution provider whose blocks are Bursar leases.

A config swap: only the provider block differs from a LocalProvider config::

    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from bursar.providers.parsl import (
        HEARTBEAT_PERIOD, HEARTBEAT_THRESHOLD, RETRIES, BursarProvider,
        lease_error_handler, lease_retry_handler,
    )

    config = Config(
        executors=[
            HighThroughputExecutor(
                label="htex",
                heartbeat_period=HEARTBEAT_PERIOD,        # 2 s
                heartbeat_threshold=HEARTBEAT_THRESHOLD,  # 10 s, not Parsl's 120 s
                block_error_handler=lease_error_handler,
                provider=BursarProvider(
                    broker="127.0.0.1:50051", campaign="sci", token=TOKEN,
                    resources_per_block={"cpu": 4, "mem_gb": 8},
                    init_blocks=1, min_blocks=0, max_blocks=4,
                    walltime="00:10:00",                  # the lease's duration
                ),
            )
        ],
        retries=RETRIES,                    # 3
        retry_handler=lease_retry_handler,  # a lost manager costs 0.25 of a retry
    )

Life cycle of one block (one block is one lease)::

    submit ──Acquire(non-blocking)──► granted ──ACTIVE──► workers started ──► RUNNING
       │                                │                        │
       └─ Refused(reason, retry_after): PENDING, message = the reason; asked again
          after retry_after (bounded by [min_retry_s, max_retry_s])
                                        │ renewed renew_margin_s before each expiry
    PREEMPT_WARNING ─► drain: the block's managers are put on hold (no new tasks) and
                       their tasks given most of the grace period to finish; then the
                       pool is stopped (SIGTERM, SIGKILL), the lease released ─► CANCELLED
    REVOKED ─► workers killed ─► CANCELLED          EXPIRED ─► workers killed ─► TIMEOUT
    cancel() (scale-in, shutdown) ─► workers stopped, lease released ─► CANCELLED
    the worker pool exits by itself: 0 ─► COMPLETED, else FAILED (the lease is released)

A lease the broker ended is never reported FAILED: Parsl's default block error handler
would then mark the whole executor bad. A lease ended before its block's workers
connected is still rewritten to MISSING by HTEX, which the default handler counts as a
failure; :func:`lease_error_handler` leaves out the blocks whose lease the broker ended
and applies Parsl's ``simple_error_handler`` to the rest; it also hands the provider the
executor, which draining needs.

Workers run as local processes on the simulated pool, and as steps of the lease's
allocation (``srun --jobid=N --overlap``, see :mod:`bursar.providers.launch`) when the
broker runs on Slurm: the launcher's command runs under ``bash`` in its own process
group, with ``PARSL_CORES`` and ``PARSL_MEMORY_GB`` taken from the lease's ``cpu`` and
``mem_gb`` (per node), the lease's GPUs as the pool's ``--available-accelerators`` (when
the executor names none), and ``BURSAR_LEASE_ID``,
``BURSAR_LEASE_NODES``, ``BURSAR_CAMPAIGN`` and ``BURSAR_BROKER`` in the environment.

Tasks on a block that is torn down fail only when the interchange misses the manager's
heartbeats for ``heartbeat_threshold`` seconds (Parsl's default: 120 s) and are then
retried only if the config allows it. Hence the recommended settings above:
``heartbeat_period=HEARTBEAT_PERIOD`` (2 s), ``heartbeat_threshold=HEARTBEAT_THRESHOLD``
(10 s), ``retries=RETRIES`` (3) and ``retry_handler=lease_retry_handler``, which charges a
task a quarter of a retry for a lost manager (a revoked lease is not the task's fault)
and a whole one for anything else.

At shutdown Parsl cancels every block, which releases its lease, except when the
executor has gone bad (Parsl issue #2961). Call :meth:`BursarProvider.close` after
``dfk.cleanup()`` to release whatever is left and stop the client; a lease nobody renews
expires on its own after ``walltime`` anyway.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from parsl.executors.high_throughput.errors import ManagerLost
from parsl.jobs.error_handlers import simple_error_handler
from parsl.jobs.states import JobState, JobStatus
from parsl.launchers import SingleNodeLauncher
from parsl.launchers.base import Launcher
from parsl.providers.base import ExecutionProvider
from parsl.providers.errors import SubmitException

from bursar.providers.client import (
    Backoff,
    BrokerClient,
    BursarClientError,
    DeadlineExceeded,
    LeaseClass,
    LeaseEventKind,
    Refused,
    Supply,
    SyncLeaseHandle,
    Tls,
    Unavailable,
)
from bursar.providers.launch import is_slurm, launch_argv

SLURM_SETTLE_S = 10.0
"""How long a block whose workers exited on Slurm waits for the broker to say whether its
lease was revoked (the broker polls Slurm every ``[slurm] poll_interval_s``)."""

__all__ = [
    "HEARTBEAT_PERIOD",
    "HEARTBEAT_THRESHOLD",
    "MANAGER_LOST_COST",
    "RETRIES",
    "BursarProvider",
    "fit_to_warm",
    "lease_error_handler",
    "lease_retry_handler",
]

log = logging.getLogger("bursar.providers.parsl")

HEARTBEAT_PERIOD = 2
"""Recommended ``HighThroughputExecutor(heartbeat_period=...)`` on leased capacity."""
HEARTBEAT_THRESHOLD = 10
"""Recommended ``heartbeat_threshold``: tasks of a torn-down block fail (and are retried)
this many seconds after it went away."""
RETRIES = 3
"""Recommended ``Config(retries=...)``, with :func:`lease_retry_handler`."""
MANAGER_LOST_COST = 0.25
"""What :func:`lease_retry_handler` charges a task for a lost manager."""

_POLL_S = 0.05


def lease_retry_handler(exception: BaseException, task_record: Any) -> float:
    """``Config(retry_handler=...)``: a lost manager (its lease revoked or expired) costs
    :data:`MANAGER_LOST_COST` of a retry; any other failure costs one."""
    return MANAGER_LOST_COST if isinstance(exception, ManagerLost) else 1.0


def lease_error_handler(executor: Any, status: dict[str, JobStatus]) -> None:
    """``HighThroughputExecutor(block_error_handler=...)``: Parsl's
    ``simple_error_handler`` over the blocks whose lease the broker did *not* end.

    HTEX rewrites a terminal block that never connected to MISSING, which the simple
    handler counts as a failure; a lease reclaimed before its workers registered is not
    one."""
    provider = executor.provider
    if isinstance(provider, BursarProvider):
        provider.attach(executor)
        to_job = executor.blocks_to_job_id
        status = {b: s for b, s in status.items() if not provider.ended_by_broker(to_job.get(b))}
    if status:
        simple_error_handler(executor, status)


def fit_to_warm(supply: Supply, size: Mapping[str, float]) -> dict[str, float]:
    """``size_from_supply`` that shrinks a block to the warm capacity the caller may take
    now (``available_warm`` per dimension), so that it starts at once instead of waiting;
    when nothing is warm in some dimension it asks for the full size (and is told why
    and when to retry)."""
    out = {}
    for d, want in size.items():
        warm = supply.dims[d].available_warm if d in supply.dims else want
        if warm < 1e-9:
            return dict(size)
        out[d] = min(want, math.floor(warm) if d == "cpu" else warm)
    return out if all(v > 0 for v in out.values()) else dict(size)


def walltime_s(walltime: str | float) -> float:
    """``"HH:MM:SS"`` (or ``"MM:SS"``, or seconds) in seconds."""
    if isinstance(walltime, int | float):
        return float(walltime)
    parts = [float(p) for p in walltime.split(":")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"walltime must be HH:MM:SS, got {walltime!r}")
    secs = 0.0
    for p in parts:
        secs = secs * 60 + p
    return secs


@dataclass(eq=False)
class _Block:
    """One block: its lease, its worker processes, what Parsl is told about it."""

    job_id: str
    job_name: str
    command: str
    tasks_per_node: int
    state: JobState = JobState.PENDING
    message: str = "requesting a lease"
    exit_code: int | None = None
    handle: SyncLeaseHandle | None = None
    lease_id: str = ""
    proc: subprocess.Popen[bytes] | None = None
    attempts: int = 0
    refusals: list[str] = field(default_factory=list)
    """The broker's reason for each refused request, oldest first."""
    ended_by_broker: bool = False
    drained_idle: bool | None = None
    """After a preemption: whether the block's tasks finished before its workers stopped."""
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    """Monotonic time the workers were launched."""
    stdout_path: str | None = None
    stderr_path: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    wake: threading.Event = field(default_factory=threading.Event)
    answered: threading.Event = field(default_factory=threading.Event)
    """Set once the first request has an answer (or failed to get one)."""
    error: BaseException | None = None
    """An error that retrying cannot fix, from the first request."""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def terminal(self) -> bool:
        return self.state in (
            JobState.CANCELLED,
            JobState.COMPLETED,
            JobState.FAILED,
            JobState.TIMEOUT,
        )


class BursarProvider(ExecutionProvider):
    """Blocks as Bursar leases, workers as local processes on the leased resources.

    Parsl's knobs: ``init_blocks``, ``min_blocks``, ``max_blocks``, ``nodes_per_block``,
    ``parallelism``, ``launcher`` (default ``SingleNodeLauncher``), ``worker_init`` (shell
    lines run before the launcher's command), ``walltime`` (``"HH:MM:SS"``: each lease's
    duration; the lease is renewed for that long again while the block lives).

    Bursar's: ``broker`` (``host:port``), ``campaign`` and its ``token``;
    ``resources_per_block`` (the lease size, e.g. ``{"cpu": 4, "mem_gb": 8, "gpu": 1}``,
    split evenly over ``nodes_per_block``); ``size_from_supply`` (optional: called before
    each request with the broker's supply signals and ``resources_per_block``, returns
    this block's size, e.g. :func:`fit_to_warm`; the workers get ``PARSL_CORES`` from the
    lease they got); ``lease_class`` (may lower the campaign's
    class, e.g. ``"opportunistic"``); ``renew_margin_s`` (renew this long before expiry;
    default: half the duration, at most 60 s); ``labels`` for the leases;
    ``min_retry_s``/``max_retry_s`` (bounds on the wait before asking again after a
    refusal); ``drain_timeout_s`` (how long a draining pool gets after SIGTERM before
    SIGKILL, also bounded by the preemption deadline); ``submit_timeout_s`` (the longest
    ``submit`` waits for the broker's first answer); ``retry_timeout_s``, ``backoff``
    and ``tls`` for the client; ``poll_interval`` (``status_polling_interval``).
    """

    def __init__(
        self,
        *,
        broker: str,
        campaign: str | None = None,
        token: str | None = None,
        resources_per_block: Mapping[str, float] | None = None,
        size_from_supply: Callable[[Supply, Mapping[str, float]], Mapping[str, float]]
        | None = None,
        lease_class: LeaseClass | str | None = None,
        renew_margin_s: float | None = None,
        labels: Mapping[str, str] | None = None,
        init_blocks: int = 1,
        min_blocks: int = 0,
        max_blocks: int = 1,
        nodes_per_block: int = 1,
        parallelism: float = 1.0,
        launcher: Launcher | None = None,
        worker_init: str = "",
        walltime: str | float = "00:10:00",
        min_retry_s: float = 0.5,
        max_retry_s: float = 10.0,
        drain_timeout_s: float = 2.0,
        submit_timeout_s: float = 5.0,
        retry_timeout_s: float | None = 60.0,
        backoff: Backoff | None = None,
        tls: Tls = None,
        poll_interval: int = 1,
    ) -> None:
        size = dict(resources_per_block or {"cpu": 1})
        if not size or any(v <= 0 for v in size.values()):
            raise ValueError(f"resources_per_block must hold positive units, got {size!r}")
        if nodes_per_block < 1:
            raise ValueError("nodes_per_block must be at least 1")
        self.broker = broker
        self.campaign = campaign
        self._token = token
        self.resources_per_block = size
        self.size_from_supply = size_from_supply
        self.lease_class = LeaseClass.parse(lease_class) if lease_class else None
        self.renew_margin_s = renew_margin_s
        self.labels = dict(labels or {})
        self.init_blocks = init_blocks
        self.min_blocks = min_blocks
        self.max_blocks = max_blocks
        self.nodes_per_block = nodes_per_block
        self.parallelism = parallelism
        self.launcher = launcher if launcher is not None else SingleNodeLauncher()
        self.worker_init = worker_init
        self.walltime = walltime
        self.duration_s = walltime_s(walltime)
        self.min_retry_s = min_retry_s
        self.max_retry_s = max_retry_s
        self.drain_timeout_s = drain_timeout_s
        self.submit_timeout_s = submit_timeout_s
        self.retry_timeout_s = retry_timeout_s
        self.backoff = backoff
        self.tls = tls
        self.poll_interval = poll_interval
        self.script_dir: str | None = None
        per_node = {d: v / nodes_per_block for d, v in size.items()}
        self.cores_per_node: int | None = (
            max(1, math.floor(per_node["cpu"])) if "cpu" in per_node else None
        )
        self.mem_per_node: float | None = per_node.get("mem_gb")
        self.gpus_per_node = int(per_node.get("gpu", 0))
        self.resources: dict[str, _Block] = {}
        self._lock = threading.Lock()
        self._client: BrokerClient | None = None
        self._executor: Any = None
        self._count = 0

    def __repr__(self) -> str:  # no token in Parsl's logs
        return (
            f"BursarProvider(broker={self.broker!r}, campaign={self.campaign!r}, "
            f"resources_per_block={self.resources_per_block!r}, "
            f"lease_class={self.lease_class and self.lease_class.value!r}, "
            f"init_blocks={self.init_blocks}, min_blocks={self.min_blocks}, "
            f"max_blocks={self.max_blocks}, nodes_per_block={self.nodes_per_block}, "
            f"walltime={self.walltime!r})"
        )

    # ------------------------------------------------------------------ Parsl's interface

    @property
    def label(self) -> str:
        return "bursar"

    @property
    def status_polling_interval(self) -> int:
        return self.poll_interval

    def submit(self, command: str, tasks_per_node: int, job_name: str = "parsl.auto") -> str:
        """Ask for a lease (non-blocking) and return the block's id: a refused request
        leaves the block PENDING, with the broker's reason as its message, and is asked
        again after the broker's retry_after. Waits at most ``submit_timeout_s`` for the
        broker's first answer (Parsl calls this on its polling thread); an unreachable
        broker leaves the block PENDING too. Errors that retrying cannot fix (a bad
        token, a size the pool can never hold) raise ``SubmitException``."""
        with self._lock:
            self._count += 1
            job_id = f"{job_name}.{self._count}"
            b = _Block(job_id, job_name, command, tasks_per_node)
            self.resources[job_id] = b
        threading.Thread(
            target=self._run, args=(b,), name=f"bursar-parsl {job_id}", daemon=True
        ).start()
        b.answered.wait(self.submit_timeout_s)
        if b.error is not None:
            with self._lock:
                del self.resources[job_id]
            raise SubmitException(
                job_name, f"the broker would not take the request: {b.error}"
            ) from b.error
        return job_id

    def status(self, job_ids: list[Any]) -> list[JobStatus]:
        out = []
        for job_id in job_ids:
            b = self.resources.get(job_id)
            if b is None:
                out.append(JobStatus(JobState.UNKNOWN, f"no block {job_id!r} here"))
                continue
            with self._lock:
                out.append(
                    JobStatus(
                        b.state,
                        b.message,
                        exit_code=b.exit_code,
                        stdout_path=b.stdout_path,
                        stderr_path=b.stderr_path,
                    )
                )
        return out

    def cancel(self, job_ids: list[Any]) -> list[bool]:
        """Stop the blocks' workers and release their leases; idempotent. Returns once
        done (or after ``drain_timeout_s`` + 10 s)."""
        blocks = [self.resources.get(j) for j in job_ids]
        for b in blocks:
            if b is not None:
                b.cancelled.set()
                b.wake.set()
        for b in blocks:
            if b is not None:
                b.done.wait(self.drain_timeout_s + 10.0)
        return [b is not None for b in blocks]

    # ------------------------------------------------------------------ Bursar's additions

    def attach(self, executor: Any) -> None:
        """Let the provider drain preempted blocks through ``executor`` (HTEX: hold their
        managers, wait for their tasks); :func:`lease_error_handler` calls this. Without
        it, a preempted block's workers are just stopped."""
        self._executor = executor

    def ended_by_broker(self, job_id: Any) -> bool:
        """True when the block's lease was revoked, reclaimed or expired (not a failure
        of the block)."""
        b = self.resources.get(job_id) if job_id is not None else None
        return b is not None and b.ended_by_broker

    def refusals(self, job_id: Any) -> list[str]:
        """The broker's reasons for refusing the block's requests so far, oldest first."""
        b = self.resources.get(job_id)
        return list(b.refusals) if b is not None else []

    def lease_id(self, job_id: Any) -> str:
        """The block's lease id ("" while it has none)."""
        b = self.resources.get(job_id)
        return b.lease_id if b is not None else ""

    def close(self) -> None:
        """Cancel every block still alive and close the client. Parsl cancels the blocks
        at shutdown, except when the executor went bad: call this after
        ``dfk.cleanup()`` to be sure no lease is left to expire on its own."""
        live = [j for j, b in list(self.resources.items()) if not b.done.is_set()]
        if live:
            self.cancel(live)
        if self._client is not None:
            self._client.close()
            self._client = None

    # ------------------------------------------------------------------ one block

    def _get_client(self) -> BrokerClient:
        with self._lock:
            if self._client is None:
                self._client = BrokerClient(
                    self.broker,
                    self._token,
                    campaign=self.campaign,
                    tls=self.tls,
                    backoff=self.backoff,
                    retry_timeout_s=self.retry_timeout_s,
                )
            return self._client

    def _set(self, b: _Block, state: JobState, message: str, **kw: Any) -> None:
        with self._lock:
            if b.terminal:
                return
            b.state, b.message = state, message
            for k, v in kw.items():
                setattr(b, k, v)
        log.info("block %s: %s (%s)", b.job_id, state.name, message)

    def _try_acquire(self, b: _Block) -> float | None:
        """One non-blocking Acquire. None: granted (``b.handle`` is set); otherwise the
        seconds to wait before asking again."""
        size: Mapping[str, float] = self.resources_per_block
        if self.size_from_supply is not None:
            try:
                size = dict(self.size_from_supply(self._get_client().supply(), size)) or size
            except BursarClientError as exc:  # ask for the full size; the answer says why
                log.warning("block %s: no supply signals (%s)", b.job_id, exc)
        h = self._get_client().held_lease(
            size,
            self.duration_s,
            renew_margin_s=self.renew_margin_s,
            on_preempt=lambda ev: b.wake.set(),
            blocking=False,
            lease_class=self.lease_class,
            labels={"engine": "parsl", "parsl_job": b.job_name, **self.labels},
        )
        b.attempts += 1
        try:
            h.__enter__()
        except Refused as exc:
            delay = exc.retry_after if math.isfinite(exc.retry_after) else self.max_retry_s
            delay = min(max(delay, self.min_retry_s), self.max_retry_s)
            b.refusals.append(exc.reason)
            self._set(
                b,
                JobState.PENDING,
                f"lease refused by the broker: {exc.reason}: {exc.message} "
                f"(attempt {b.attempts}; again in {delay:.1f} s)",
            )
            return delay
        except (Unavailable, DeadlineExceeded) as exc:
            self._set(
                b,
                JobState.PENDING,
                f"broker unreachable: {exc} (attempt {b.attempts}; again in "
                f"{self.max_retry_s:.1f} s)",
            )
            return self.max_retry_s
        b.handle, b.lease_id = h, h.id
        self._set(b, JobState.PENDING, f"lease {h.id} granted ({h.lease.state.value})")
        return None

    def _wait(self, b: _Block, cond: Callable[[], bool], timeout: float | None = None) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        while not (cond() or b.cancelled.is_set()):
            if end is not None and time.monotonic() >= end:
                return
            b.wake.wait(_POLL_S)
            b.wake.clear()

    def _run(self, b: _Block) -> None:
        try:
            try:
                delay = self._try_acquire(b)
            except BursarClientError as exc:  # not worth retrying: submit() raises it
                b.error = exc
                self._set(b, JobState.FAILED, f"the broker would not take the request: {exc}")
                return
            finally:
                b.answered.set()
            self._life(b, delay)
        except Exception as exc:  # a bug or an OS error: the block failed, say why
            log.exception("block %s failed", b.job_id)
            self._stop_workers(b, 0.5)
            self._release(b)
            self._set(b, JobState.FAILED, f"the provider failed: {exc!r}")
        finally:
            b.done.set()

    def _life(self, b: _Block, delay: float | None) -> None:
        while delay is not None:
            b.cancelled.wait(delay)
            if b.cancelled.is_set():
                self._set(b, JobState.CANCELLED, "cancelled before a lease was granted")
                return
            delay = self._try_acquire(b)
        h = b.handle
        assert h is not None
        self._wait(b, lambda: h.active.is_set() or h.ended.is_set() or h.preempted.is_set())
        if not (b.cancelled.is_set() or h.ended.is_set() or h.preempted.is_set()):
            self._launch(b, h)

        def over() -> bool:
            return (
                h.ended.is_set()
                or h.preempted.is_set()
                or (b.proc is not None and b.proc.poll() is not None)
            )

        self._wait(b, over)
        if b.proc is not None and b.proc.poll() not in (None, 0) and is_slurm(h.lease):
            # On Slurm the workers die with their allocation (cancelled by an admin, a node
            # lost) a poll before the broker reports the lease revoked: wait for that report
            # rather than call the block failed.
            self._wait(b, h.ended.is_set, timeout=SLURM_SETTLE_S)
        if b.cancelled.is_set():
            self._stop_workers(b, self.drain_timeout_s)
            final = self._release(b)
            self._set(b, JobState.CANCELLED, f"cancelled by Parsl; lease {b.lease_id} {final}")
        elif h.preempted.is_set() and not h.ended.is_set():
            ev = h.preempt_event
            deadline = ev.deadline if ev is not None and ev.deadline else None
            left = self.drain_timeout_s if deadline is None else deadline - time.time()
            b.ended_by_broker = True
            self._set(
                b,
                JobState.PENDING if b.proc is None else b.state,
                f"lease {b.lease_id} preempted by the broker: draining",
            )
            # Stop sending it tasks and let those in flight finish, for most of the grace
            # period; then stop the workers (what is still running fails ManagerLost and
            # is retried elsewhere).
            t_end = time.monotonic() + max(0.1, left * 0.8)
            idle = self._drain(b, t_end - min(0.5, left * 0.2))
            self._stop_workers(b, max(0.1, min(self.drain_timeout_s, t_end - time.monotonic())))
            b.drained_idle = idle
            final = self._release(b)
            self._set(
                b,
                JobState.CANCELLED,
                f"lease {b.lease_id} preempted by the broker"
                f"{f' for {ev.for_request}' if ev is not None and ev.for_request else ''}: "
                f"workers drained, lease {final}",
            )
        elif h.ended.is_set():
            ev = h.end_event
            kind = ev.kind if ev is not None else None
            b.ended_by_broker = kind is not LeaseEventKind.RELEASED
            self._stop_workers(b, 0.5)
            cause = f": {ev.cause or ev.lease.end_cause}" if ev is not None else ""
            if kind is LeaseEventKind.EXPIRED:
                self._set(b, JobState.TIMEOUT, f"lease {b.lease_id} expired{cause}")
            elif kind is LeaseEventKind.REVOKED:
                self._set(b, JobState.CANCELLED, f"lease {b.lease_id} revoked by the broker{cause}")
            else:
                self._set(b, JobState.CANCELLED, f"lease {b.lease_id} released elsewhere")
            self._release(b)
        else:  # the worker pool exited by itself
            assert b.proc is not None
            rc = b.proc.returncode
            self._stop_workers(b, 0.5)  # anything it left behind in its group
            final = self._release(b)
            if rc == 0:
                self._set(
                    b,
                    JobState.COMPLETED,
                    f"workers exited; lease {b.lease_id} {final}",
                    exit_code=0,
                )
            else:
                self._set(
                    b,
                    JobState.FAILED,
                    f"workers exited with {rc}; lease {b.lease_id} {final}",
                    exit_code=rc,
                )

    def _drain(self, b: _Block, until: float) -> bool:
        """Put the block's managers on hold (through the attached executor) and wait,
        until the monotonic time ``until``, for their tasks to finish. True if they did."""
        ex = self._executor
        block_id = ex.job_ids_to_block.get(b.job_id) if ex is not None else None
        if block_id is None or b.proc is None:
            return False
        try:
            ex._hold_block(block_id)
            while True:
                mine = [m for m in ex.connected_managers() if m["block_id"] == block_id]
                if not any(m["tasks"] for m in mine):
                    return True
                if time.monotonic() >= until:
                    return False
                time.sleep(_POLL_S)
        except Exception as exc:  # the executor is shutting down, say
            log.warning("block %s: could not drain through the executor: %r", b.job_id, exc)
            return False

    def _release(self, b: _Block) -> str:
        """Release the block's lease (idempotent) and stop following it; its final state."""
        h = b.handle
        if h is None:
            return "none"
        try:
            final = h.release().state.value.lower()
        except BursarClientError as exc:
            log.warning("block %s: could not release %s: %s", b.job_id, b.lease_id, exc)
            final = "left to expire"
        with contextlib.suppress(Exception):
            h.__exit__(None, None, None)
        return final

    # ------------------------------------------------------------------ worker processes

    def _environment(self, b: _Block, h: SyncLeaseHandle) -> dict[str, str]:
        lease = h.lease
        per_node = {d: v / self.nodes_per_block for d, v in lease.size.items()}
        env = dict(os.environ)
        bin_dir = os.path.dirname(sys.executable)  # process_worker_pool.py lives there
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["BURSAR_LEASE_ID"] = lease.id
        env["BURSAR_LEASE_NODES"] = ",".join(lease.nodes)
        env["BURSAR_CAMPAIGN"] = lease.campaign
        env["BURSAR_BROKER"] = self.broker
        env["JOBNAME"] = b.job_name
        if per_node.get("cpu"):
            env["PARSL_CORES"] = str(max(1, math.floor(per_node["cpu"])))
        if per_node.get("mem_gb"):
            env["PARSL_MEMORY_GB"] = f"{per_node['mem_gb']:g}"
        return env

    def _command(self, b: _Block, h: SyncLeaseHandle) -> str:
        command = b.command
        gpus = int(h.lease.size.get("gpu", 0) / self.nodes_per_block)
        if gpus and re.search(r"--available-accelerators\s*$", command):
            command = command.rstrip() + " " + " ".join(str(i) for i in range(gpus))
        return command

    def _launch(self, b: _Block, h: SyncLeaseHandle) -> None:
        script_dir = self.script_dir or tempfile.mkdtemp(prefix="bursar-parsl-")
        os.makedirs(script_dir, exist_ok=True)
        launch = self.launcher(self._command(b, h), b.tasks_per_node, self.nodes_per_block)
        script = f"{self.worker_init}\n{launch}\n"
        base = os.path.join(script_dir, f"{b.job_id}.{h.id}")
        with open(base + ".sh", "w") as f:
            f.write(script)
        b.stdout_path, b.stderr_path = base + ".out", base + ".err"
        with open(b.stdout_path, "wb") as out, open(b.stderr_path, "wb") as err:
            proc = subprocess.Popen(
                # On Slurm: srun --jobid=... --overlap, inside the lease's allocation.
                launch_argv(h.lease, ["/bin/bash", base + ".sh"]),
                env=self._environment(b, h),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        b.proc = proc
        b.started_at = time.monotonic()
        self._set(b, JobState.RUNNING, f"lease {h.id} on {','.join(h.lease.nodes) or '?'}")

    def _stop_workers(self, b: _Block, grace_s: float) -> None:
        """SIGTERM the block's process group; SIGKILL what is left after ``grace_s``."""
        proc = b.proc
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
            if sig is signal.SIGTERM:
                # The leader is gone; make sure the rest of its group is too.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
