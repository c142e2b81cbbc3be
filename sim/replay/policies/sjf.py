"""Shortest job first with backfill: EASY backfill over a queue ordered by requested
duration (shortest first, then submit order); the head, the shortest waiting job, holds
the one reservation, so a long job is not passed over forever once it heads the queue."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bursar.sim.replay.policies.easy import Easy


class Sjf(Easy):
    name: ClassVar[str] = "sjf"

    def order(self) -> Callable[[int], Any] | None:
        dur = self.dur
        return lambda j: (dur[j], j)
