"""FIFO, strict: jobs start in submit order; nothing starts before an earlier-submitted job."""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from bursar.sim.replay.mapping import ReplayConfig, Workload


class Fifo:
    name: ClassVar[str] = "fifo"
    timed: ClassVar[bool] = False
    kills: ClassVar[bool] = False

    def __init__(self, w: Workload, config: ReplayConfig | None = None) -> None:
        self.size = w.size
        self.queue: deque[int] = deque()

    def submit(self, j: int, now: float) -> None:
        self.queue.append(j)

    def finish(self, j: int, now: float) -> None:
        pass

    def schedule(self, now: float, free: int) -> list[int]:
        q, size = self.queue, self.size
        out = []
        while q and size[q[0]] <= free:
            j = q.popleft()
            free -= size[j]
            out.append(j)
        return out

    def killed(self) -> list[tuple[int, float]]:
        return []

    def wakeup(self) -> float | None:
        return None
