"""The replay kernel: one event loop that hosts every policy.

Events are job submissions (known in advance, in submit order) and job ends (a heap).
At each instant the kernel applies every end, then every submission, then asks the
policy which queued jobs start now. Processors (or GPUs) are the capacity.

A job holds its processors for its recorded runtime (``Workload.hold``), whatever it
asked for: a job that ran past its requested time still ran. The requested time is the
policies' estimate only. One policy may end a running job earlier: the broker kills a
job whose lease it would not renew, at the lease's expiry (a policy with ``kills`` set
says so through ``killed`` after each ``schedule``); such a job ends then and is listed
in ``Schedule.killed``. A policy may also refuse a job at its submission (the broker, for
a job larger than the pool can ever give its campaign beside the other campaigns'
guarantees): ``submit`` returns False, and the job never runs; it is listed in
``Schedule.refused`` with no start and no end.

In strict mode the kernel checks, after every event and in O(1) each: capacity is never
exceeded; no job starts before it is submitted; no job is held beyond its recorded
runtime; only a running job is killed, and not in the past; every job not refused
starts exactly once and ends exactly once; time never goes backwards; under a facility
power cap (``Workload.power``), the facility's draw never exceeds the cap. The first
violation stops the run with ``InvariantViolation`` naming the event and the state.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections.abc import MutableSequence
from dataclasses import dataclass, field

from bursar.sim.replay.mapping import Workload
from bursar.sim.replay.policies.base import Policy

_QUEUED, _RUNNING, _DONE = 1, 2, 3


class InvariantViolation(AssertionError):
    """A replay broke a rule it must always keep; the message has the event and the state."""

    def __init__(self, rule: str, event: str, state: dict[str, object]) -> None:
        detail = ", ".join(f"{k}={v}" for k, v in state.items())
        super().__init__(f"invariant broken: {rule}; event: {event}; state: {detail}")
        self.rule = rule
        self.event = event
        self.state = state


@dataclass(frozen=True, slots=True)
class Schedule:
    """When each job (workload index) started and ended, and how many events ran."""

    start: MutableSequence[float]
    end: MutableSequence[float]
    events: int
    killed: list[int] = field(default_factory=list)
    """Jobs a policy ended before their recorded runtime, in the order it did so."""
    refused: list[int] = field(default_factory=list)
    """Jobs a policy refused at their submission (never run: start and end are NaN)."""


def replay(w: Workload, policy: Policy, strict: bool = True) -> Schedule:
    n = len(w)
    cap = w.capacity
    submit, size, hold = w.submit, w.size, w.hold
    # Compact columns (8 bytes a job): the one per-job state a replay keeps besides the
    # workload's, so a long trace costs little beyond the jobs in flight.
    start = array("d", [math.nan]) * n
    end = array("d", [math.nan]) * n
    state = bytearray(n)  # 0 = not submitted yet, then _QUEUED, _RUNNING, _DONE
    heap: list[tuple[float, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    free = cap
    now = -math.inf
    i = 0
    events = 0
    done = 0
    inf = math.inf
    timed = policy.timed
    p_submit, p_finish, p_schedule = policy.submit, policy.finish, policy.schedule
    p_killed = policy.killed if policy.kills else None
    # A killed job's new end; the end pushed at its start is then stale and skipped.
    cut: dict[int, float] = {}
    killed: list[int] = []
    refused: list[int] = []
    # Under a power cap: the running jobs' draw above idle, against the cap's budget.
    watts = w.power.extra_w if w.power is not None else None
    budget = w.power.budget_w if w.power is not None else math.inf
    drawn = 0.0

    def fail(rule: str, event: str) -> InvariantViolation:
        running = sum(1 for s in state if s == _RUNNING)
        queued = sum(1 for s in state if s == _QUEUED)
        return InvariantViolation(
            rule,
            event,
            {
                "now": now,
                "free": free,
                "capacity": cap,
                "running": running,
                "queued": queued,
                "submitted": i,
                "done": done,
                "policy": policy.name,
            },
        )

    while True:
        t_sub = submit[i] if i < n else inf
        t_end = heap[0][0] if heap else inf
        t = t_sub if t_sub < t_end else t_end
        if timed:
            wake = policy.wakeup()
            if wake is not None and wake < t:
                t = wake
        if t == inf:
            break
        if strict and t < now:
            raise fail("time never goes backwards", f"next event at {t}")
        now = t
        while heap and heap[0][0] == now:
            _, j = pop(heap)
            if cut and cut.get(j, now) != now:
                continue
            events += 1
            if strict:
                if state[j] != _RUNNING:
                    raise fail("every job ends exactly once", f"end of job {w.job_id[j]}")
                if now > start[j] + hold[j]:  # the same rounding as the end pushed
                    raise fail(
                        "no job held beyond its recorded runtime", f"end of job {w.job_id[j]}"
                    )
            state[j] = _DONE
            end[j] = now
            done += 1
            free += size[j]
            if watts is not None:
                drawn -= watts[j]
            if strict and free > cap:
                raise fail("capacity never exceeded (freed more than held)", f"end {w.job_id[j]}")
            p_finish(j, now)
        while i < n and submit[i] == now:
            state[i] = _QUEUED
            events += 1
            if p_submit(i, now) is False:
                state[i] = _DONE
                done += 1
                refused.append(i)
            i += 1
        for j in p_schedule(now, free):
            if strict:
                if j >= i or submit[j] > now:
                    raise fail("no start before submit", f"start of job {w.job_id[j]} at {now}")
                if state[j] != _QUEUED:
                    raise fail("every job starts exactly once", f"start of job {w.job_id[j]}")
            state[j] = _RUNNING
            start[j] = now
            free -= size[j]
            if strict and free < 0:
                raise fail("capacity never exceeded", f"start of job {w.job_id[j]} at {now}")
            if watts is not None:
                drawn += watts[j]
                if strict and drawn > budget:
                    raise fail(
                        "power cap never exceeded",
                        f"start of job {w.job_id[j]} at {now} (draw above idle {drawn:g} W, "
                        f"budget {budget:g} W)",
                    )
            push(heap, (now + hold[j], j))
        if p_killed is not None:
            for j, at in p_killed():
                if strict:
                    event = f"kill of job {w.job_id[j]} at {at}"
                    if state[j] != _RUNNING or j in cut:
                        raise fail("only a running job is killed, once", event)
                    if at < now:
                        raise fail("time never goes backwards", event)
                    if at > start[j] + hold[j]:
                        raise fail("no job held beyond its recorded runtime", event)
                if at < start[j] + hold[j]:
                    cut[j] = at
                    killed.append(j)
                    push(heap, (at, j))
    if strict and done != n:
        never = next(w.job_id[j] for j in range(n) if state[j] != _DONE)
        raise fail(
            "every job starts and ends exactly once",
            f"end of trace with {n - done} jobs never run (first: job {never})",
        )
    return Schedule(start, end, events, killed, refused)
