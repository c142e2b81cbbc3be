"""Largest job first with backfill: EASY backfill over a queue ordered by size (most
processors first, then submit order). The head, the largest waiting job, holds the one
reservation; smaller jobs backfill around it, so the large jobs a machine exists for are
not starved by a stream of small ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from bursar.sim.replay.policies.easy import Easy


class Ljf(Easy):
    name: ClassVar[str] = "ljf"

    def order(self) -> Callable[[int], Any] | None:
        size = self.size
        return lambda j: (-size[j], j)
