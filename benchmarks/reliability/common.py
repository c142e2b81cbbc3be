"""What every section of the reliability suite returns, and the figures' formatting."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["short", "long"]


@dataclass
class Result:
    """One section's outcome: ``ok`` is False when an invariant broke (a lost or duplicated
    grant, an UNKNOWN answer, a journal changed by a refused request...); ``figures`` are
    the numbers the README quotes (JSON-able); ``lines`` a person's summary."""

    name: str
    ok: bool = True
    figures: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None
    """Why the section did not run (a system package missing), or None."""

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)


def quantiles(xs: list[float]) -> dict[str, float]:
    """p50, p99, p99.9 and max of ``xs`` (empty: all zero)."""
    if not xs:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {
        "n": len(s),
        "p50": statistics.median(s),
        "p99": q(0.99),
        "p999": q(0.999),
        "max": s[-1],
    }
