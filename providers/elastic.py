"""Elastic blocks, shared by the workflow plugins: a block's lease stretches over whole
*units* of the size its engine would ask a fixed lease for (a Dask job's cores, memory
and GPUs; a Parsl block's ``resources_per_block``; a Ray node type's resources), from
``min`` to ``max`` of them, one unit a step. Each plugin runs one unit's workers per unit
the lease holds (:func:`units_in`), starts more when the broker grows the lease, and
drains those a warned shrink takes away before its deadline.

The speedup model is the broker's (``bursar.v1.Intent``): ``work`` seconds on one unit,
Amdahl's law with serial fraction ``amdahl`` (or a measured ``curve`` of (units,
throughput) points, read as ``speed_model`` says), due ``deadline`` seconds after the
block asks, worth ``value``. ``sizes`` and ``size_rule`` name the unit counts the block
can run on (a job whose batch must divide evenly, say); the broker is sent the sizes they
allow, in units of the intent's speedup dimension.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bursar.broker.elastic import (
    DIVISORS_OF,
    MAX_CURVE_POINTS,
    MEASURED,
    POWERS_OF_TWO,
    SPEED_MODELS,
    scale_dim,
)
from bursar.providers.client import Intent

__all__ = ["ALLOWED", "Elastic", "units_in"]

_KEYS = (
    "min",
    "max",
    "work",
    "deadline",
    "amdahl",
    "value",
    "curve",
    "speed_model",
    "sizes",
    "size_rule",
)

ALLOWED = (
    "a mapping of min, max, work, deadline, amdahl, value, curve, speed_model, sizes, "
    'size_rule: e.g. {"min": 1, "max": 4, "work": 3600, "deadline": "01:00:00", '
    '"amdahl": 0.05, "size_rule": "powers_of_two"} '
    "(max, work and deadline required; min, max whole units, 1 <= min <= max; work > 0 "
    'seconds on one unit; deadline "HH:MM:SS" or seconds; 0 <= amdahl <= 1; value > 0; '
    "curve: [units, throughput] points, units whole and increasing from min or below to "
    "max or above, instead of amdahl; speed_model: "
    f"{' or '.join(SPEED_MODELS)}; sizes: the unit counts the block may hold, min among "
    f'them; size_rule: "{POWERS_OF_TWO}" or "{DIVISORS_OF}B" (the unit counts that divide '
    "B))"
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
    curve: tuple[tuple[int, float], ...] = ()
    """(units, throughput) points: the speedup model instead of ``amdahl`` when given."""
    speed_model: str = MEASURED
    counts: tuple[int, ...] | None = None
    """The unit counts the block may hold (from ``sizes`` and ``size_rule``; None: all
    from min to max)."""

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
        curve = _curve(given.get("curve"), lo, hi)
        if curve and "amdahl" in given:
            raise ValueError("give amdahl or curve, not both")
        model = given.get("speed_model", MEASURED)
        if model not in SPEED_MODELS:
            raise ValueError(f"speed_model {model!r}: allowed {', '.join(SPEED_MODELS)}")
        counts = _counts(given.get("sizes"), given.get("size_rule"), lo, hi)
        return cls(lo, hi, work, deadline, amdahl, worth, curve, model, counts)

    def intent(self, unit: Mapping[str, float]) -> Intent:
        """The broker's intent for units of ``unit``, its deadline from now: a curve and the
        allowed counts in units of the speedup dimension (the broker's ``scale_dim``)."""
        per = unit.get(scale_dim(unit), 1.0) if unit else 1.0
        return Intent(
            min={d: v * self.min for d, v in unit.items()},
            max={d: v * self.max for d, v in unit.items()},
            step=dict(unit),
            work=self.work,
            deadline_s=self.deadline,
            amdahl=None if self.curve else self.amdahl,
            curve=tuple((n * per, t) for n, t in self.curve),
            value=self.value,
            speed_model=self.speed_model,
            sizes=() if self.counts is None else tuple(n * per for n in self.counts),
        )


def _whole(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _curve(value: Any, lo: int, hi: int) -> tuple[tuple[int, float], ...]:
    """The curve setting as (units, throughput) points; ValueError saying what is wrong."""
    if value is None:
        return ()
    try:
        points = [(u, float(t)) for u, t in value]
    except (TypeError, ValueError):
        raise ValueError("curve must be a list of [units, throughput] pairs") from None
    if not 1 <= len(points) <= MAX_CURVE_POINTS:
        raise ValueError(f"curve: 1 to {MAX_CURVE_POINTS} points")
    if not all(_whole(u) and u >= 1 and math.isfinite(t) and t > 0 for u, t in points):
        raise ValueError("curve: units whole and >= 1, throughput > 0")
    if any(b[0] <= a[0] for a, b in itertools.pairwise(points)):
        raise ValueError("curve: units must be strictly increasing")
    if points[0][0] > lo or points[-1][0] < hi:
        raise ValueError(f"curve: the points must cover min to max ({lo} to {hi} units)")
    return tuple(points)


def _counts(sizes: Any, rule: Any, lo: int, hi: int) -> tuple[int, ...] | None:
    """The unit counts from min to max that ``sizes`` and ``size_rule`` allow (both:
    those in the list the rule allows), None when neither is given; ValueError saying
    what is wrong."""
    if sizes is None and rule is None:
        return None
    allowed = range(lo, hi + 1)
    if sizes is not None:
        if isinstance(sizes, str | bytes | Mapping) or not all(_whole(n) for n in sizes):
            raise ValueError("sizes must be a list of whole unit counts")
        outside = sorted({n for n in sizes if not lo <= n <= hi})
        if outside:
            raise ValueError(f"sizes {outside} outside min to max ({lo} to {hi})")
        allowed = sorted(set(sizes))
    if rule is not None:
        if rule == POWERS_OF_TWO:
            allowed = [n for n in allowed if n & (n - 1) == 0]
        elif isinstance(rule, str) and rule.startswith(DIVISORS_OF):
            batch = rule[len(DIVISORS_OF) :]
            if not batch.isdigit() or int(batch) < 1:
                raise ValueError(f"size_rule {rule!r}: the batch B must be a whole number >= 1")
            allowed = [n for n in allowed if int(batch) % n == 0]
        else:
            raise ValueError(f'size_rule {rule!r}: allowed "{POWERS_OF_TWO}" or "{DIVISORS_OF}B"')
    counts = tuple(allowed)
    if lo not in counts:
        raise ValueError(f"min ({lo} units) is not among the sizes allowed: {list(counts)}")
    if len(counts) > MAX_CURVE_POINTS:
        raise ValueError(f"at most {MAX_CURVE_POINTS} sizes (got {len(counts)}): give a rule")
    return counts


def units_in(unit: Mapping[str, float], size: Mapping[str, float]) -> int:
    """How many whole units of ``unit`` ``size`` holds (every dimension counts)."""
    return min(int(size.get(d, 0.0) / u + 1e-6) for d, u in unit.items() if u > 0)
