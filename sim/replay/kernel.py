"""The replay kernel: one event loop that hosts every policy.

Events are job submissions (known in advance, in submit order) and lease ends (a heap).
At each instant the kernel applies every end, then every submission, then asks the
policy which queued jobs start now. Processors (or GPUs) are the capacity.

In strict mode the kernel checks, after every event and in O(1) each: capacity is never
exceeded; no job starts before it is submitted; no lease is held beyond its duration;
every job starts exactly once and ends exactly once; time never goes backwards. The
first violation stops the run with ``InvariantViolation`` naming the event and the state.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

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

    start: list[float]
    end: list[float]
    events: int


def replay(w: Workload, policy: Policy, strict: bool = True) -> Schedule:
    n = len(w)
    cap = w.capacity
    submit, size, hold, dur = w.submit, w.size, w.hold, w.duration
    start = [math.nan] * n
    end = [math.nan] * n
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
            events += 1
            if strict:
                if state[j] != _RUNNING:
                    raise fail("every job ends exactly once", f"end of job {w.job_id[j]}")
                if now > start[j] + dur[j]:  # the same rounding as the end pushed
                    raise fail("no lease beyond its duration", f"end of job {w.job_id[j]}")
            state[j] = _DONE
            end[j] = now
            done += 1
            free += size[j]
            if strict and free > cap:
                raise fail("capacity never exceeded (freed more than held)", f"end {w.job_id[j]}")
            p_finish(j, now)
        while i < n and submit[i] == now:
            state[i] = _QUEUED
            events += 1
            p_submit(i, now)
            i += 1
        for j in p_schedule(now, free):
            if strict:
                if j >= i or submit[j] > now:
                    raise fail("no start before submit", f"start of job {w.job_id[j]} at {now}")
                if state[j] != _QUEUED:
                    raise fail("every job starts exactly once", f"start of job {w.job_id[j]}")
                if hold[j] > dur[j]:
                    raise fail("no lease beyond its duration", f"start of job {w.job_id[j]}")
            state[j] = _RUNNING
            start[j] = now
            free -= size[j]
            if strict and free < 0:
                raise fail("capacity never exceeded", f"start of job {w.job_id[j]} at {now}")
            push(heap, (now + hold[j], j))
    if strict and done != n:
        never = next(w.job_id[j] for j in range(n) if state[j] != _DONE)
        raise fail(
            "every job starts and ends exactly once",
            f"end of trace with {n - done} jobs never run (first: job {never})",
        )
    return Schedule(start, end, events)
