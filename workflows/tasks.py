"""The science task model: GPUs, compute time, value, I/O and inference.

A task computes for ``duration_s`` in ``STEPS`` equal steps; after each step it reads
and writes ``io_mb / STEPS`` MB (metered ``fs_bw``) and asks for ``tokens / STEPS``
inference tokens (metered ``inference``). Metering throttles at the source: what is not
granted now is waited for, so I/O throttling slows a task down. A task that is still
running when its lease ends is lost, with its value. Its record says whether its compute
time alone fitted the lease (``compute_fits``), which tells a loss to I/O waits apart from
a lease that was too short for the task whatever its I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bursar.workflows.api import Ctx, Lease

__all__ = ["STEPS", "Task", "TaskResult", "run_task", "task_set"]

STEPS = 3
TIME_EPS_S = 1e-6
"""Tolerance on comparisons with a lease's end: a task is timed as a sum of sleeps, which
may land a rounding error past an end that was computed as one addition."""
MAX_METER_CALLS = 12
"""Per step and dimension: a throttled task asks again at most this often, then waits
out the rest at the wait the broker last gave (keeps the event count sane)."""


@dataclass(frozen=True, slots=True)
class Task:
    id: int
    gpus: float
    duration_s: float
    """Compute time, without I/O waits."""
    value: float
    """Science units produced when it completes."""
    io_mb: float
    tokens: float

    @property
    def value_per_gpu_hour(self) -> float:
        return self.value / (self.gpus * self.duration_s / 3600.0)

    @property
    def io_rate(self) -> float:
        """MB/s it reads and writes while it runs unthrottled."""
        return self.io_mb / self.duration_s


@dataclass(frozen=True, slots=True)
class TaskResult:
    task: Task
    started: float
    ended: float
    done: bool
    io_wait_s: float
    lease_end: float
    """The lease's end as the task last knew it (after any renewal)."""

    @property
    def compute_fits(self) -> bool:
        """Whether the task would have finished within ``lease_end`` without its I/O waits."""
        return self.started + self.task.duration_s <= self.lease_end + TIME_EPS_S


def task_set(seed: int, n: int = 240) -> list[Task]:
    """The same task list for a given seed (adaptive and naive get identical copies)."""
    rng = random.Random(f"tasks-{seed}")
    out = []
    for i in range(n):
        gpus = rng.choice((16.0, 32.0, 32.0, 64.0))
        duration = float(rng.randrange(600, 1500, 60))
        # Value density spans the price range (base 1 credit/GPU-h, up to e^2 at a full pool).
        density = 10 ** rng.uniform(-0.3, 1.1)
        io_per_gpu = rng.choice((0.5, 2.0, 4.0, 8.0))  # MB/s per GPU
        out.append(
            Task(
                id=i,
                gpus=gpus,
                duration_s=duration,
                value=round(density * gpus * duration / 3600.0, 3),
                io_mb=io_per_gpu * gpus * duration,
                tokens=rng.choice((0.0, 0.5, 1.0)) * gpus * duration / 10.0,
            )
        )
    return out


async def _metered(ctx: Ctx, dim: str, amount: float) -> float:
    """Consume ``amount`` of a rate dimension; returns the seconds spent waiting for it.

    A throttled grant comes with how long the rest will take (at the burst rate, or at
    the sustained rate for what the bucket cannot cover). The task uses what it was
    granted for as long as a piece that size of the rest takes at that pace, then asks for
    the rest; on its last call it waits out the whole rest. It so waits about as long as
    the broker says the rest takes, whatever the meter window. (Sleeping the whole wait
    before each piece would wait it again for every piece that one window allows.)"""
    waited = 0.0
    rest = amount
    for call in range(MAX_METER_CALLS):
        r = await ctx.meter(dim, rest)
        rest -= r.granted
        if rest <= 1e-6:
            return waited
        last = call == MAX_METER_CALLS - 1
        wait = r.wait_s if last else r.wait_s * min(1.0, r.granted / rest)
        wait = min(max(wait, 1.0), 3600.0)
        await ctx.sleep(wait)
        waited += wait
    return waited


async def run_task(ctx: Ctx, task: Task, lease: Lease, *, renew: bool = False) -> TaskResult:
    """Run ``task`` on ``lease`` (which must be active); lost if the lease ends first.

    With ``renew``, an I/O-aware agent extends the lease when throttling has pushed the
    task's projected end past it (a refused renewal is retried at the next step)."""
    from bursar.workflows.api import Refused

    t0 = ctx.now()
    io_wait = 0.0
    step = task.duration_s / STEPS
    for k in range(STEPS):
        await ctx.sleep(step)
        if ctx.now() > lease.expires_at + TIME_EPS_S:
            break
        if task.io_mb > 0:
            io_wait += await _metered(ctx, "fs_bw", task.io_mb / STEPS)
        if task.tokens > 0:
            io_wait += await _metered(ctx, "inference", task.tokens / STEPS)
        left = (STEPS - k - 1) * step * 1.25 + 60.0
        if renew and k < STEPS - 1 and ctx.now() + left > lease.expires_at:
            try:
                lease = await ctx.renew(lease, left)
            except Refused:
                continue
    t1 = ctx.now()
    res = TaskResult(task, t0, t1, t1 <= lease.expires_at + TIME_EPS_S, io_wait, lease.expires_at)
    ctx.record(
        "task",
        id=task.id,
        gpus=task.gpus,
        value=task.value,
        done=res.done,
        io_wait_s=io_wait,
        started=t0,
        ended=t1,
        duration_s=task.duration_s,
        lease_end=res.lease_end,
        compute_fits=res.compute_fits,
    )
    return res
