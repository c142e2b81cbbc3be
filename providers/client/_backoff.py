"""Exponential backoff with jitter, from an injected random number generator.

``Backoff`` is a value (the policy); ``Backoff.delays(rng)`` is one retry sequence. The
client holds one ``random.Random`` (seeded when you pass a seed) and draws every
sequence from it, so that a test, or a simulation, sees the same delays every run.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays ``initial_s, initial_s * multiplier, ...`` capped at ``max_s``, each reduced
    by a random fraction of up to ``jitter`` (0: no jitter; 1: "full jitter", uniform in
    [0, cap)), so that many clients reconnecting to a restarted broker spread out."""

    initial_s: float = 0.1
    max_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError("Backoff needs 0 < initial_s <= max_s")
        if self.multiplier < 1:
            raise ValueError("Backoff.multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("Backoff.jitter must be in [0, 1]")

    def delays(self, rng: random.Random) -> Iterator[float]:
        """An endless sequence of delays, seconds."""
        cap = self.initial_s
        while True:
            yield cap * (1.0 - self.jitter * rng.random())
            cap = min(self.max_s, cap * self.multiplier)
