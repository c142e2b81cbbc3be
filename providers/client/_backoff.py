"""Exponential backoff with jitter, from an injected random number generator.

``Backoff`` is a value (the policy); ``Backoff.delays(rng)`` is one retry sequence. The
client holds one ``random.Random`` (seeded when you pass a seed) and draws every
sequence from it, so that a test, or a simulation, sees the same delays every run.

``Pace`` is the pace of retrying a refusal (a renewal the broker said no to): decorrelated
jitter between a floor and a ceiling, never sooner than the broker's ``retry_after``. Its
floor is what bounds the tries: however the draws fall, two tries are at least
``floor_s`` apart, so a refused renewal cannot flood the broker (or the terminal) in a
lease's last minute.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Backoff", "Pace"]


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


@dataclass(frozen=True, slots=True)
class Pace:
    """Delays between tries of a refused call: "decorrelated jitter" (each delay uniform
    in ``[floor_s, 3 * previous]``, capped at ``ceiling_s``), which spreads many clients
    refused at once as full jitter does while growing about as fast as doubling; never
    below ``floor_s``, nor below the ``retry_after`` the broker gave with the refusal."""

    floor_s: float
    ceiling_s: float

    def __post_init__(self) -> None:
        if not 0 < self.floor_s <= self.ceiling_s:
            raise ValueError("Pace needs 0 < floor_s <= ceiling_s")

    def delays(self, rng: random.Random) -> Iterator[float]:
        """An endless sequence of delays, seconds; the caller waits
        ``max(delay, retry_after)``."""
        previous = self.floor_s
        while True:
            previous = min(self.ceiling_s, rng.uniform(self.floor_s, previous * 3.0))
            yield previous
