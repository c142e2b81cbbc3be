"""The rule inputs a decision carries: what the rules read when they decided (the
campaign's class, fair-share usage, holding and bucket levels; the pool's warm free
capacity, reserve, reclaimable and cold capacity), built for every grant, queueing,
refusal and renewal. Plain JSON data, in a fixed order (journals compare it byte for
byte)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bursar.broker import dims

if TYPE_CHECKING:
    from bursar.broker.engine import Engine
    from bursar.broker.ledger import CampaignState

_PLACED = {d: i for i, d in enumerate(dims.PLACED)}
assert dims.PLACED == ("gpu", "cpu", "mem_gb")  # the names _nonzero writes out


def _nonzero(v: dims.Vec) -> dict[str, float]:
    """``dims.as_dict`` for the three placed dimensions, unrolled (decision inputs)."""
    gpu, cpu, mem = v
    out: dict[str, float] = {}
    if gpu:
        out["gpu"] = gpu
    if cpu:
        out["cpu"] = cpu
    if mem:
        out["mem_gb"] = mem
    return out


def inputs(eng: Engine, c: CampaignState, size: dims.Vec) -> dict[str, Any]:
    # Built for every grant, queueing and renewal: what bucket_level and dims.as_dict
    # compute, written out (the same values, keys and order).
    on_free, boot_free, cold, _ = eng.pool.totals()
    ledger = eng.ledger
    tokens: dict[str, float | None] = {}
    if c.buckets:
        now, held, enforcement = eng.now, c.held, eng.policy.enforcement
        for d, b in sorted(c.buckets.items()):
            # None stands for an unlimited bucket: inputs stay plain JSON data.
            tokens[d] = (
                None if b.capacity is None else b.level_at(now, held[_PLACED[d]], enforcement)
            )
    return {
        "class_rank": c.spec.lease_class.rank,
        "usage_s": ledger.decayed_usage(c, eng.now),
        "held": _nonzero(c.held),
        "tokens": tokens,
        "pool": {
            "warm_free": _nonzero(on_free),
            "reserve": _nonzero(ledger.reserve),
            "reclaimable": _nonzero(ledger.reclaimable),
            "cold": _nonzero(dims.add(boot_free, cold)),
        },
    }
