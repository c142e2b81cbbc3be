"""Elastic blocks, shared by the workflow plugins: a block's lease stretches over whole
*units* of the size its engine would ask a fixed lease for (a Dask job's cores, memory
and GPUs; a Parsl block's ``resources_per_block``; a Ray node type's resources), from
``min`` to ``max`` of them, one unit a step. Each plugin runs one unit's workers per unit
the lease holds (:func:`units_in`), starts more when the broker grows the lease, and
drains those a warned shrink takes away before its deadline.

The speedup model is the broker's (``bursar.v1.Intent``): ``work`` seconds on one unit,
Amdahl's law with serial fraction ``amdahl``, due ``deadline`` seconds after the block
asks, worth ``value``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bursar.providers.client import Intent

__all__ = ["ALLOWED", "Elastic", "units_in"]

_KEYS = ("min", "max", "work", "deadline", "amdahl", "value")

ALLOWED = (
    "a mapping of min, max, work, deadline, amdahl, value: e.g. "
    '{"min": 1, "max": 4, "work": 3600, "deadline": "01:00:00", "amdahl": 0.05} '
    "(max, work and deadline required; min, max whole units, 1 <= min <= max; work > 0 "
    'seconds on one unit; deadline "HH:MM:SS" or seconds; 0 <= amdahl <= 1; value > 0)'
)
"""What an elastic setting may be, in words (for the plugins' error messages)."""


def _seconds(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError
    if isinstance(value, int | float):
        secs = float(value)
    else:
        secs = 0.0
        parts = str(value).strip().split(":")
        if not 1 <= len(parts) <= 3:
            raise ValueError
        for p in parts:
            secs = secs * 60 + float(p)
    if not (math.isfinite(secs) and secs > 0):
        raise ValueError
    return secs


@dataclass(frozen=True)
class Elastic:
    """An elastic block: ``min`` to ``max`` units, ``work`` seconds on one unit, due
    ``deadline`` seconds after it asks, Amdahl serial fraction ``amdahl``, ``value``."""

    min: int
    max: int
    work: float
    deadline: float
    amdahl: float = 0.0
    value: float = 1.0

    @classmethod
    def parse(cls, value: Mapping[str, Any]) -> Elastic:
        """From a config mapping (keys with ``-`` or ``_``); ValueError (saying what was
        wrong) for anything :data:`ALLOWED` does not describe."""
        if not isinstance(value, Mapping):
            raise ValueError(f"not a mapping: {value!r}")
        given = {str(k).replace("-", "_"): v for k, v in value.items()}
        unknown = sorted(set(given) - set(_KEYS))
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        missing = [k for k in ("max", "work", "deadline") if k not in given]
        if missing:
            raise ValueError(f"missing {missing}")
        lo, hi = given.get("min", 1), given["max"]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)):
            raise ValueError("min and max must be whole units")
        if not 1 <= lo <= hi:
            raise ValueError("need 1 <= min <= max")
        try:
            deadline = _seconds(given["deadline"])
            work = float(given["work"])
            amdahl = float(given.get("amdahl", 0.0))
            worth = float(given.get("value", 1.0))
        except (TypeError, ValueError):
            raise ValueError("deadline, work, amdahl and value must be numbers") from None
        if not (work > 0 and 0 <= amdahl <= 1 and worth > 0):
            raise ValueError("need work > 0, 0 <= amdahl <= 1 and value > 0")
        return cls(lo, hi, work, deadline, amdahl, worth)

    def intent(self, unit: Mapping[str, float]) -> Intent:
        """The broker's intent for units of ``unit``, its deadline from now."""
        return Intent(
            min={d: v * self.min for d, v in unit.items()},
            max={d: v * self.max for d, v in unit.items()},
            step=dict(unit),
            work=self.work,
            deadline_s=self.deadline,
            amdahl=self.amdahl,
            value=self.value,
        )


def units_in(unit: Mapping[str, float], size: Mapping[str, float]) -> int:
    """How many whole units of ``unit`` ``size`` holds (every dimension counts)."""
    return min(int(size.get(d, 0.0) / u + 1e-6) for d, u in unit.items() if u > 0)
