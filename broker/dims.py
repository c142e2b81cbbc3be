"""Resource dimensions and the small vector arithmetic the engine needs.

Placed dimensions live on nodes and are held by leases; rate dimensions are metered
through buckets and never placed. Vectors over placed dimensions are plain tuples in
``PLACED`` order: the engine adds and compares them on every decision, and tuples are
several times cheaper than dicts for that.
"""

from __future__ import annotations

from collections.abc import Mapping

PLACED: tuple[str, ...] = ("gpu", "cpu", "mem_gb")
RATE: tuple[str, ...] = ("fs_bw", "inference")
ALL: tuple[str, ...] = PLACED + RATE
POWER = "power"
"""Watts: neither placed on a node nor metered, but held by leases against a facility cap
(``power_budget.py``); a campaign's envelope there is in watts, its bucket in joules."""
ENVELOPED: tuple[str, ...] = (*ALL, POWER)
"""The dimensions a campaign may have an envelope in."""
UNITS: Mapping[str, str] = {
    "gpu": "GPUs",
    "cpu": "cores",
    "mem_gb": "GB",
    "fs_bw": "MB/s",
    "inference": "tokens/s",
    "power": "W",
}

Vec = tuple[float, ...]
ZERO: Vec = (0.0,) * len(PLACED)


def vec(mapping: Mapping[str, float]) -> Vec:
    return tuple(float(mapping.get(d, 0.0)) for d in PLACED)


def as_dict(v: Vec) -> dict[str, float]:
    return {d: x for d, x in zip(PLACED, v, strict=True) if x}


# The engine calls these on every decision; they are written out for the three placed
# dimensions because generator expressions over zip() cost several times more.
assert len(PLACED) == 3


def add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def vmin(a: Vec, b: Vec) -> Vec:
    return (min(a[0], b[0]), min(a[1], b[1]), min(a[2], b[2]))


def vmax0(a: Vec) -> Vec:
    return (
        a[0] if a[0] > 0.0 else 0.0,
        a[1] if a[1] > 0.0 else 0.0,
        a[2] if a[2] > 0.0 else 0.0,
    )


def fits(need: Vec, avail: Vec) -> bool:
    """True when every component of ``need`` is within ``avail`` (with float slack)."""
    return need[0] <= avail[0] + 1e-9 and need[1] <= avail[1] + 1e-9 and need[2] <= avail[2] + 1e-9


def is_zero(a: Vec) -> bool:
    return -1e-9 <= a[0] <= 1e-9 and -1e-9 <= a[1] <= 1e-9 and -1e-9 <= a[2] <= 1e-9
