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
UNITS: Mapping[str, str] = {
    "gpu": "GPUs",
    "cpu": "cores",
    "mem_gb": "GB",
    "fs_bw": "MB/s",
    "inference": "tokens/s",
}

Vec = tuple[float, ...]
ZERO: Vec = (0.0,) * len(PLACED)


def vec(mapping: Mapping[str, float]) -> Vec:
    return tuple(float(mapping.get(d, 0.0)) for d in PLACED)


def as_dict(v: Vec) -> dict[str, float]:
    return {d: x for d, x in zip(PLACED, v, strict=True) if x}


def add(a: Vec, b: Vec) -> Vec:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def sub(a: Vec, b: Vec) -> Vec:
    return tuple(x - y for x, y in zip(a, b, strict=True))


def vmin(a: Vec, b: Vec) -> Vec:
    return tuple(min(x, y) for x, y in zip(a, b, strict=True))


def vmax0(a: Vec) -> Vec:
    return tuple(max(0.0, x) for x in a)


def fits(need: Vec, avail: Vec) -> bool:
    """True when every component of ``need`` is within ``avail`` (with float slack)."""
    return all(n <= a + 1e-9 for n, a in zip(need, avail, strict=True))


def is_zero(a: Vec) -> bool:
    return all(abs(x) <= 1e-9 for x in a)
