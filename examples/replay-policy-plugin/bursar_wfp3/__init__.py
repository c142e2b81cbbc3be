"""WFP3: EASY backfill over a queue ordered by the WFP priority, a bursar replay plug-in.

The priority of a waiting job at instant ``now`` is ``(wait / requested time) ** 3 *
size`` (Tang et al., "Fault-aware, utility-based job scheduling on Blue Gene/P systems",
2009: the "WFP" utility), highest first, ties in submit order: a job's claim grows with
the cube of its wait measured in its own requested time, scaled by the processors it
needs, so large jobs that have waited long overtake small recent ones, and no job waits
forever. The head of that queue holds EASY's one reservation; the rest backfill around it
(the built-in ``Easy``, whose queue this policy orders).

The priority changes with time, so the queue is re-sorted at every pass that looks at it
(every submission and every end), as the built-in fair-share policy does.

A plug-in sees the workload read-only and returns decisions only: the kernel that hosts
it starts the jobs, checks the invariants and computes every metric.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bursar.sim.replay.policies.easy import Easy

__all__ = ["Wfp3"]
__version__ = "0.1.0"

MIN_REQUEST_S = 1.0
"""A requested time below this counts as this: a zero request has no finite priority."""


class Wfp3(Easy):
    name: ClassVar[str] = "wfp3"

    def __init__(self, w: Any, config: Any = None) -> None:
        super().__init__(w, config)
        self.submitted = w.submit

    def submit(self, j: int, now: float) -> None:
        # Every submission changes the order: the pass that follows is a full one.
        self.queue.append(j)
        self.fresh.append(j)
        self.dirty = True

    def order(self) -> Callable[[int], Any] | None:
        return None  # the queue is sorted in ``schedule``, by the priority at that instant

    def schedule(self, now: float, free: int) -> list[int]:
        if self.queue and (self.dirty or self.recheck_at <= now):
            sub, dur, size = self.submitted, self.dur, self.size
            floor = MIN_REQUEST_S

            def key(j: int) -> tuple[float, int]:
                r = dur[j] if dur[j] > floor else floor
                return (-(((now - sub[j]) / r) ** 3) * size[j], j)

            self.queue.sort(key=key)
        return super().schedule(now, free)
