"""Token buckets and prepaid leases (docs/concepts.md).

Level T lives in [0, B] unit-seconds and starts full. While a campaign holds u units
the level moves at dT/dt = R - u, capped at B:

* under **prepaid** enforcement the part above R is paid up front for a lease's whole
  span, so the running level only refills, at max(0, R - u);
* under **grant-instant** enforcement the level drains continuously at u - R and is
  only looked at when a lease is granted (the leaky semantics kept for the experiment).

Rate dimensions (fs_bw, inference) have no holding: their level refills at R and each
metered amount is taken from it directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bursar.broker.policy import Enforcement


@dataclass(slots=True)
class Bucket:
    capacity: float | None
    """B in unit-seconds; None means unlimited."""
    rate: float
    """R in units per second."""
    level: float
    at: float

    @classmethod
    def full(cls, capacity: float | None, rate: float, at: float) -> Bucket:
        return cls(capacity, rate, math.inf if capacity is None else float(capacity), at)

    @property
    def unlimited(self) -> bool:
        return self.capacity is None

    def slope(self, held: float, enforcement: Enforcement) -> float:
        if enforcement is Enforcement.PREPAID:
            return max(0.0, self.rate - held)
        return self.rate - held

    def level_at(self, t: float, held: float, enforcement: Enforcement) -> float:
        if self.capacity is None:
            return math.inf
        x = self.level + self.slope(held, enforcement) * (t - self.at)
        return min(float(self.capacity), max(0.0, x))

    def advance(self, t: float, held: float, enforcement: Enforcement) -> None:
        """Bring the level forward to ``t``; call before ``held`` changes."""
        self.level = self.level_at(t, held, enforcement)
        self.at = t

    def take(self, amount: float) -> None:
        if self.capacity is not None:
            self.level = max(0.0, self.level - amount)

    def give(self, amount: float) -> None:
        if self.capacity is not None:
            self.level = min(float(self.capacity), self.level + amount)

    def time_until(self, need: float, held: float, enforcement: Enforcement) -> float | None:
        """Seconds until the level reaches ``need`` at the current holding, or None if never."""
        if self.capacity is None or self.level >= need:
            return 0.0
        if need > self.capacity:
            return None
        s = self.slope(held, enforcement)
        if s <= 0:
            return None
        return (need - self.level) / s


def above_rate(held: float, size: float, rate: float) -> float:
    """How much a lease of ``size`` lifts a campaign holding ``held`` above its rate R."""
    return max(0.0, held + size - rate) - max(0.0, held - rate)
