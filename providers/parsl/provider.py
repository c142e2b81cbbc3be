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

The life cycle is :class:`bursar.providers.block.Block`'s; this module translates it to
Parsl's ``ExecutionProvider`` (``submit``, ``status``, ``cancel``) and drains through HTEX.

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

An elastic block (``elastic={"min": 1, "max": 4, "work": ..., "deadline": ...}``, see
:class:`bursar.providers.elastic.Elastic`) is one elastic lease of ``min`` to ``max``
units of ``resources_per_block`` (``nodes_per_block`` 1). Each unit runs one worker pool
(an HTEX manager, with the unit's ``PARSL_CORES``, ``PARSL_MEMORY_GB`` and GPUs); unit
``k`` > 0's manager has the id ``<job id>.<lease id>.u<k>``. Parsl sees one block,
RUNNING throughout, whose managers come and go with the lease: a RESIZED (grown) starts
pools for the new units; a RESIZE_WARNING puts the managers of the units the new size
cannot hold on hold (highest units first: no new tasks), gives their tasks until shortly
before the deadline to finish, then stops those pools (a task still running fails
ManagerLost and is retried, as after a preemption). Parsl's strategy counts blocks, not
managers: an elastic block's extra capacity is the broker's to give, not Parsl's to ask.

At shutdown Parsl cancels every block, which releases its lease, except when the
executor has gone bad (Parsl issue #2961). Call :meth:`BursarProvider.close` after
``dfk.cleanup()`` to release whatever is left and stop the client; a lease nobody renews
expires on its own after ``walltime`` anyway.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from parsl.executors.high_throughput.errors import ManagerLost
from parsl.jobs.error_handlers import simple_error_handler
from parsl.jobs.states import JobState, JobStatus
from parsl.launchers import SingleNodeLauncher
from parsl.launchers.base import Launcher
from parsl.providers.base import ExecutionProvider
from parsl.providers.errors import SubmitException

from bursar.providers.block import (
    Block,
    Cause,
    Hooks,
    Input,
    LeaseSpec,
    LoopThread,
    ProcessTree,
    Retry,
    State,
    in_thread,
)
from bursar.providers.client import (
    AsyncBrokerClient,
    Backoff,
    BursarClientError,
    Lease,
    LeaseClass,
    Supply,
    Tls,
    check_token,
)
from bursar.providers.elastic import ALLOWED, Elastic, units_in
from bursar.providers.launch import is_local, is_slurm, launch_argv

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
"""How often a drain asks the executor whether the block's tasks are done (HTEX has no
event for it)."""


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


PLACED_DIMS = ("gpu", "cpu", "mem_gb")
"""The dimensions a lease holds (``bursar.v1.Lease.size``'s keys)."""


def walltime_s(walltime: str | float) -> float:
    """``"HH:MM:SS"`` (or ``"MM:SS"``, or seconds) in seconds, as Parsl's providers take it."""
    if isinstance(walltime, int | float):
        return float(walltime)
    try:
        parts = [float(p) for p in str(walltime).split(":")]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts):
        raise ValueError(
            f"walltime must be 'HH:MM:SS' (e.g. '00:10:00', as Parsl's providers take it) "
            f"or seconds, got {walltime!r}"
        )
    secs = 0.0
    for p in parts:
        secs = secs * 60 + p
    return secs


_TERMINAL = (JobState.CANCELLED, JobState.COMPLETED, JobState.FAILED, JobState.TIMEOUT)


@dataclass(frozen=True)
class Resize:
    """One shrink of an elastic block, as it went: to ``units`` by ``deadline`` (clock
    time), the managers put on hold (``held``), whether their tasks finished before their
    pools stopped (``drained_idle``), and when it was done."""

    units: int
    deadline: float | None
    held: list[str]
    drained_idle: bool
    done_at: float


class _Block(Hooks):
    """One Parsl block: a :class:`Block` (its lease and workers) and what Parsl is told
    about it (``JobState`` and a message), kept up to date by the block's hooks."""

    def __init__(
        self, provider: BursarProvider, job_id: str, job_name: str, command: str, tpn: int
    ) -> None:
        self.provider = provider
        self.job_id = job_id
        self.job_name = job_name
        self.command = command
        self.tasks_per_node = tpn
        self.state = JobState.PENDING
        self.message = "requesting a lease"
        self.exit_code: int | None = None
        self.stdout_path: str | None = None
        self.stderr_path: str | None = None
        self.drained_idle: bool | None = None
        """After a preemption: whether the block's tasks finished before its workers stopped."""
        self.submitted_at = time.monotonic()
        self.started_at: float | None = None
        """Monotonic time the workers were launched."""
        self._grace: float | None = None
        self._script_dir: str | None = None
        self.units: dict[int, ProcessTree] = {}
        """The worker pool of each unit of the lease (unit 0: ``block.workers``)."""
        self.resizes: list[Resize] = []
        """An elastic block's shrinks, oldest first."""
        self.unit_counts: list[int] = []
        """An elastic block's units with a pool, after each change, oldest first."""
        p = provider
        self.block = Block(
            job_id,
            p._client,  # type: ignore[arg-type]  (made by submit, before its lock)
            LeaseSpec(
                p.resources_per_block,
                p.duration_s,
                renew_margin_s=p.renew_margin_s,
                lease_class=p.lease_class,
                labels={"engine": "parsl", "parsl_job": job_name, **p.labels},
                intent=p.elastic.intent(p.resources_per_block) if p.elastic else None,
            ),
            self,
            retry=Retry(p.min_retry_s, p.max_retry_s),
        )

    # What the tests and the error handler read.

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        w = self.block.workers
        return w.popen if w is not None else None

    @property
    def attempts(self) -> int:
        return self.block.attempts

    @property
    def refusals(self) -> list[str]:
        return self.block.refusals

    @property
    def ended_by_broker(self) -> bool:
        return self.block.ended_by_broker

    @property
    def lease_id(self) -> str:
        return self.block.lease_id

    @property
    def terminal(self) -> bool:
        return self.state in _TERMINAL

    def _set(self, state: JobState, message: str, exit_code: int | None = None) -> None:
        with self.provider._lock:
            if self.terminal:
                return
            self.state, self.message = state, message
            if exit_code is not None:
                self.exit_code = exit_code
        log.info("block %s: %s (%s)", self.job_id, state.name, message)

    # ------------------------------------------------------------------ the block's hooks

    async def size(self, block: Block) -> Mapping[str, float] | None:
        p = self.provider
        if p.size_from_supply is None:
            return None
        try:
            supply = await p._get_client().supply()
        except BursarClientError as exc:  # ask for the full size; the answer says why
            log.warning("block %s: no supply signals (%s)", self.job_id, exc)
            return None
        return dict(p.size_from_supply(supply, p.resources_per_block)) or None

    def changed(self, block: Block, old: State, inp: Input) -> None:
        n, lid = block.attempts, block.lease_id
        if inp is Input.REFUSED:
            self._set(JobState.PENDING, f"lease refused by the broker: {block.refusal}")
        elif inp is Input.UNREACHABLE:
            self._set(
                JobState.PENDING,
                f"broker unreachable: {block.last_error} (attempt {n}; again in "
                f"{block.retry.max_s:.1f} s)",
            )
        elif inp is Input.GRANTED:
            assert block.lease is not None
            self._set(JobState.PENDING, f"lease {lid} granted ({block.lease.state.value})")
        elif block.state is State.DRAINING and old is not State.DRAINING:
            self._set(
                JobState.RUNNING if self.proc is not None else JobState.PENDING,
                f"lease {lid} preempted by the broker: draining",
            )
        elif block.state.terminal:
            self._set(*self._outcome(block))

    def _outcome(self, block: Block) -> tuple[JobState, str, int | None]:
        lid, final, cause = block.lease_id, block.final_state, block.cause
        if block.state is State.FAILED:
            if cause is Cause.REJECTED:
                return (
                    JobState.FAILED,
                    f"the broker would not take the request: {block.error}",
                    None,
                )
            return JobState.FAILED, f"the provider failed: {block.error!r}", None
        if cause is Cause.CANCELLED:
            if not lid:
                return JobState.CANCELLED, "cancelled before a lease was granted", None
            return JobState.CANCELLED, f"cancelled by Parsl; lease {lid} {final}", None
        if cause is Cause.PREEMPTED:
            ev = block.preempt_event
            why = f" for {ev.for_request}" if ev is not None and ev.for_request else ""
            return (
                JobState.CANCELLED,
                f"lease {lid} preempted by the broker{why}: workers drained, lease {final}",
                None,
            )
        if cause in (Cause.EXPIRED, Cause.REVOKED, Cause.RELEASED):
            ev = block.end_event
            why = f": {ev.cause or ev.lease.end_cause}" if ev is not None else ""
            if cause is Cause.EXPIRED:
                return JobState.TIMEOUT, f"lease {lid} expired{why}", None
            if cause is Cause.REVOKED:
                return JobState.CANCELLED, f"lease {lid} revoked by the broker{why}", None
            return JobState.CANCELLED, f"lease {lid} released elsewhere", None
        rc = block.returncode
        if rc == 0:
            return JobState.COMPLETED, f"workers exited; lease {lid} {final}", 0
        return JobState.FAILED, f"workers exited with {rc}; lease {lid} {final}", rc

    async def start_workers(self, block: Block, lease: Lease) -> ProcessTree:
        workers = self._start_unit(0, lease)
        self.started_at = time.monotonic()
        self._set(JobState.RUNNING, f"lease {lease.id} on {','.join(lease.nodes) or '?'}")
        if self.provider.elastic is not None:
            await self._grow_to(units_in(self.provider.resources_per_block, block.usable), lease)
        return workers

    def manager_id(self, k: int, lease: Lease) -> str:
        """The HTEX manager id of unit ``k`` > 0's pool (unit 0's is Parsl's own)."""
        return f"{self.job_id}.{lease.id}.u{k}"

    def _start_unit(self, k: int, lease: Lease) -> ProcessTree:
        p = self.provider
        if self._script_dir is None:  # one directory for all the block's units
            self._script_dir = p.script_dir or tempfile.mkdtemp(prefix="bursar-parsl-")
        script_dir = self._script_dir
        os.makedirs(script_dir, exist_ok=True)
        command = self._command(lease, k)
        if k:
            command += f" --uid {self.manager_id(k, lease)}"
        launch = p.launcher(command, self.tasks_per_node, p.nodes_per_block)
        base = os.path.join(script_dir, f"{self.job_id}.{lease.id}" + (f".u{k}" if k else ""))
        with open(base + ".sh", "w") as f:
            f.write(f"{p.worker_init}\n{launch}\n")
        if k == 0:
            self.stdout_path, self.stderr_path = base + ".out", base + ".err"
        workers = ProcessTree.start(
            # On Slurm: srun --jobid=... --overlap, inside the lease's allocation.
            launch_argv(lease, ["/bin/bash", base + ".sh"]),
            self._environment(lease),
            base + ".out",
            base + ".err",
        )
        self.units[k] = workers
        return workers

    async def _grow_to(self, n: int, lease: Lease) -> None:
        """Pools on units 0 to n - 1; a pool on a unit the lease no longer holds (a
        shrink whose drain did not finish in time) stops at once."""
        for k in range(1, n):
            if k not in self.units:
                self._start_unit(k, lease)
        for k in [k for k in self.units if k >= n and k > 0]:
            await in_thread(self.units.pop(k).stop, 0.0)
        if not self.unit_counts or self.unit_counts[-1] != len(self.units):
            self.unit_counts.append(len(self.units))
            self._set(JobState.RUNNING, f"lease {lease.id} on {len(self.units)} units")

    async def resize(
        self,
        block: Block,
        lease: Lease,
        warned_to: Mapping[str, float],
        deadline: float | None,
    ) -> None:
        n = units_in(self.provider.resources_per_block, warned_to)
        going = sorted((k for k in self.units if k >= max(n, 1)), reverse=True)
        if not going:
            return
        now = block.clock.now()
        left = self.provider.drain_timeout_s if deadline is None else deadline - now
        t_end = now + max(0.1, left * 0.8)
        held = [self.manager_id(k, lease) for k in going]
        idle = await in_thread(self._drain_managers, block, held, t_end - min(0.5, left * 0.2))
        grace = max(0.0, min(self.provider.drain_timeout_s, t_end - block.clock.now()))
        for k in going:
            tree = self.units.pop(k, None)
            if tree is not None:
                await in_thread(tree.stop, grace)
        self.resizes.append(Resize(n, deadline, held, idle, block.clock.now()))
        self.unit_counts.append(len(self.units))
        self._set(JobState.RUNNING, f"lease {lease.id} shrinking to {n} units")

    async def resized(self, block: Block, lease: Lease) -> None:
        await self._grow_to(units_in(self.provider.resources_per_block, block.usable), lease)

    async def stop_workers(self, block: Block, workers: ProcessTree, grace_s: float) -> None:
        trees = [workers, *(t for k, t in self.units.items() if k > 0)]
        await asyncio.gather(*(in_thread(t.stop, grace_s) for t in trees))

    def _drain_managers(self, block: Block, managers: list[str], until: float) -> bool:
        """Put ``managers`` on hold and wait, until clock time ``until``, for their tasks
        to finish (HTEX has no event for it). True if they did."""
        ex = self.provider._executor
        if ex is None:
            return False
        try:
            for m in managers:
                ex._hold_manager(m)
            while True:
                mine = [m for m in ex.connected_managers() if m["manager"] in managers]
                if not any(m["tasks"] for m in mine):
                    return True
                if block.clock.now() >= until:
                    return False
                time.sleep(_POLL_S)
        except Exception as exc:  # the executor is shutting down, say
            log.warning("block %s: could not drain %s: %r", self.job_id, managers, exc)
            return False

    async def drain(self, block: Block, deadline: float | None) -> None:
        # Stop sending the block tasks and let those in flight finish, for most of the
        # grace period; then its workers stop (what still runs fails ManagerLost and is
        # retried elsewhere).
        p, now = self.provider, block.clock.now()
        left = p.drain_timeout_s if deadline is None else deadline - now
        t_end = now + max(0.1, left * 0.8)
        self.drained_idle = False
        self.drained_idle = await in_thread(self._drain_htex, block, t_end - min(0.5, left * 0.2))
        self._grace = max(0.1, min(p.drain_timeout_s, t_end - block.clock.now()))

    def _drain_htex(self, block: Block, until: float) -> bool:
        """Put the block's managers on hold (through the attached executor) and wait,
        until clock time ``until``, for their tasks to finish. True if they did."""
        ex = self.provider._executor
        block_id = ex.job_ids_to_block.get(self.job_id) if ex is not None else None
        if block_id is None or self.proc is None:
            return False
        try:
            ex._hold_block(block_id)
            while True:
                mine = [m for m in ex.connected_managers() if m["block_id"] == block_id]
                if not any(m["tasks"] for m in mine):
                    return True
                if block.clock.now() >= until:
                    return False
                time.sleep(_POLL_S)
        except Exception as exc:  # the executor is shutting down, say
            log.warning("block %s: could not drain through the executor: %r", self.job_id, exc)
            return False

    def stop_grace(self, block: Block) -> float:
        if block.cause is Cause.CANCELLED:
            return self.provider.drain_timeout_s
        if block.cause is Cause.PREEMPTED and self._grace is not None:
            return self._grace
        return 0.5

    def settle_s(self, block: Block, returncode: int) -> float:
        # On Slurm the workers die with their allocation (cancelled by an admin, a node
        # lost) a poll before the broker reports the lease revoked: wait for that report
        # rather than call the block failed. The local backend ends a lease's workers the
        # same way (SIGTERM from the broker as the lease ends), a moment before the report.
        lease = block.lease
        ended_by_pool = lease is not None and (is_slurm(lease) or is_local(lease))
        return SLURM_SETTLE_S if returncode != 0 and ended_by_pool else 0.0

    # ------------------------------------------------------------------ worker processes

    def _environment(self, lease: Lease) -> dict[str, str]:
        p = self.provider
        # An elastic block's pools each run on one unit, whatever the lease holds now.
        size = p.resources_per_block if p.elastic is not None else lease.size
        per_node = {d: v / p.nodes_per_block for d, v in size.items()}
        env = dict(os.environ)
        bin_dir = os.path.dirname(sys.executable)  # process_worker_pool.py lives there
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["BURSAR_LEASE_ID"] = lease.id
        env["BURSAR_LEASE_NODES"] = ",".join(lease.nodes)
        env["BURSAR_CAMPAIGN"] = lease.campaign
        env["BURSAR_BROKER"] = p.broker
        env["JOBNAME"] = self.job_name
        if per_node.get("cpu"):
            env["PARSL_CORES"] = str(max(1, math.floor(per_node["cpu"])))
        if per_node.get("mem_gb"):
            env["PARSL_MEMORY_GB"] = f"{per_node['mem_gb']:g}"
        return env

    def _command(self, lease: Lease, unit: int = 0) -> str:
        p, command = self.provider, self.command
        size = p.resources_per_block if p.elastic is not None else lease.size
        gpus = int(size.get("gpu", 0) / p.nodes_per_block)
        if gpus and re.search(r"--available-accelerators\s*$", command):
            # Unit k of an elastic block has the k-th share of the lease's GPUs.
            first = unit * gpus
            command = command.rstrip() + " " + " ".join(str(first + i) for i in range(gpus))
        return command


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
    and ``tls`` for the client; ``poll_interval`` (``status_polling_interval``);
    ``elastic`` (a mapping of ``min``, ``max``, ``work``, ``deadline``, ``amdahl``,
    ``value``: each block is one elastic lease of ``min`` to ``max`` units of
    ``resources_per_block``, a worker pool per unit; see the module's docstring).
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
        elastic: Mapping[str, Any] | None = None,
    ) -> None:
        size = dict(resources_per_block or {"cpu": 1})
        unknown = sorted(d for d in size if d not in PLACED_DIMS)
        if unknown:
            raise ValueError(
                f"resources_per_block: unknown dimension(s) {', '.join(map(repr, unknown))}; "
                f"allowed: {', '.join(PLACED_DIMS)}"
            )
        if not size or any(v <= 0 for v in size.values()):
            raise ValueError(f"resources_per_block must hold positive units, got {size!r}")
        if nodes_per_block < 1:
            raise ValueError("nodes_per_block must be at least 1")
        try:
            self.elastic = Elastic.parse(elastic) if elastic is not None else None
        except ValueError as exc:
            raise ValueError(f"elastic must be {ALLOWED}; got {elastic!r} ({exc})") from None
        if self.elastic is not None and (nodes_per_block != 1 or size_from_supply is not None):
            raise ValueError(
                "an elastic block is one lease of units of resources_per_block: "
                "nodes_per_block must be 1 and size_from_supply unset (the broker sizes it)"
            )
        self.broker = broker
        self.campaign = campaign
        # As the CLI, Dask and Ray do: the environment's token when none is given.
        self._token = token if token is not None else os.environ.get("BURSAR_TOKEN") or None
        if self._token is not None:
            check_token(self._token, "token")
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
        self._loop: LoopThread | None = None
        self._client: AsyncBrokerClient | None = None
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
        loop = self._get_loop()
        self._get_client()
        with self._lock:
            self._count += 1
            job_id = f"{job_name}.{self._count}"
            b = _Block(self, job_id, job_name, command, tasks_per_node)
            self.resources[job_id] = b
        loop.soon(b.block.start)
        loop.wait_set([b.block.answered], self.submit_timeout_s)
        if b.block.cause is Cause.REJECTED and b.block.attempts == 1:
            with self._lock:
                del self.resources[job_id]
            raise SubmitException(
                job_name, f"the broker would not take the request: {b.block.error}"
            ) from b.block.error
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
        live = [b for b in blocks if b is not None]
        if live and self._loop is not None:
            for b in live:
                self._loop.soon(b.block.cancel)
            self._loop.wait_set([b.block.done for b in live], self.drain_timeout_s + 10.0)
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
        live = [j for j, b in list(self.resources.items()) if not b.block.done.is_set()]
        if live:
            self.cancel(live)
        loop, client = self._loop, self._client
        self._loop = self._client = None
        if loop is not None:
            if client is not None:
                try:
                    loop.call(client.close(), 10)
                except Exception as exc:  # closing anyway
                    log.warning("could not close the broker client: %r", exc)
            loop.close()

    # ------------------------------------------------------------------ plumbing

    def _get_loop(self) -> LoopThread:
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread(f"bursar-parsl {self.broker}")
            return self._loop

    def _get_client(self) -> AsyncBrokerClient:
        with self._lock:
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
