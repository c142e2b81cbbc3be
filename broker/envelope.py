"""Campaign envelopes: what a campaign may hold, how fast, and at which class.

An envelope is given per dimension: ``guarantee`` units that must always
be obtainable within a bounded latency, a ``sustained`` rate R that costs no tokens, a
``burst`` ceiling on units held at once, and a ``bucket`` of B unit-seconds (``None``
means unlimited). The class rank and the preemptible flag hold for the whole campaign.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from bursar.broker import dims


class LeaseClass(enum.Enum):
    """Admission class; a higher rank is considered first."""

    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    INTERACTIVE = "interactive"
    BATCH = "batch"
    OPPORTUNISTIC = "opportunistic"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {LeaseClass.INTERACTIVE: 2, LeaseClass.BATCH: 1, LeaseClass.OPPORTUNISTIC: 0}

CAMPAIGN_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
"""A campaign name, matched whole (fullmatch: `$` would let a final newline through)."""


def _amount(x: object) -> bool:
    """A finite number >= 0 (a bool is no number here, though Python counts it one)."""
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and x >= 0


@dataclass(frozen=True, slots=True)
class DimEnvelope:
    """The four numbers that bound one campaign in one dimension."""

    guarantee: float = 0.0
    sustained: float = 0.0
    burst: float = 0.0
    bucket: float | None = None  # unit-seconds; None = unlimited

    def problems(self, dim: str) -> list[str]:
        """Each field's type and range first; the relation between fields only when every
        field is a number (comparing a malformed one would raise, not report)."""
        out = []
        for name in ("guarantee", "sustained", "burst"):
            x = getattr(self, name)
            if not _amount(x):
                out.append(f"{dim}.{name} must be a finite number >= 0 (got {x!r})")
        if self.bucket is not None and not _amount(self.bucket):
            out.append(
                f"{dim}.bucket must be a finite number >= 0 or unlimited (got {self.bucket!r})"
            )
        if not out and self.guarantee > self.burst:
            out.append(
                f"{dim}.guarantee ({self.guarantee}) may not exceed {dim}.burst ({self.burst})"
            )
        return out


@dataclass(frozen=True, slots=True)
class CampaignSpec:
    """A campaign as the admin declares it."""

    name: str
    envelopes: Mapping[str, DimEnvelope] = field(default_factory=dict)
    lease_class: LeaseClass = LeaseClass.BATCH
    preemptible: bool = False

    def envelope(self, dim: str) -> DimEnvelope | None:
        return self.envelopes.get(dim)

    def problems(self) -> list[str]:
        out = []
        if not isinstance(self.name, str) or not CAMPAIGN_NAME.fullmatch(self.name):
            out.append(
                f"campaign name {self.name!r} must match {CAMPAIGN_NAME.pattern} "
                "(lower-case letters, digits, '.', '_' or '-', at most 63 characters)"
            )
        for dim, env in self.envelopes.items():
            if not isinstance(dim, str) or dim not in dims.ENVELOPED:
                out.append(f"unknown dimension {dim!r}; allowed: {', '.join(dims.ENVELOPED)}")
                continue
            if not isinstance(env, DimEnvelope):
                out.append(f"{dim} must be an envelope (guarantee, sustained, burst, bucket)")
                continue
            out.extend(env.problems(dim))
        # A relation: only once every envelope's numbers are known to be numbers.
        if not out and self.preemptible and any(e.guarantee > 0 for e in self.envelopes.values()):
            out.append("a preemptible campaign cannot hold a guarantee (set guarantee = 0)")
        return out

    def placed(self, attr: str) -> dims.Vec:
        """One envelope field over the placed dimensions, as a vector."""
        return tuple(
            float(getattr(self.envelopes[d], attr)) if d in self.envelopes else 0.0
            for d in dims.PLACED
        )
