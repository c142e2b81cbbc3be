"""What the engine's rule tests share (``tests/engine/test_*.py``): the lease classes by
short name, a GPU request, reading decisions by kind, and the setups several rules use
(a full pool, a pool with a reclaimable backfill lease)."""

from __future__ import annotations

from conftest import build_engine, gpu_campaign

from bursar.broker import dims
from bursar.broker.decisions import LeasePath
from bursar.broker.envelope import LeaseClass
from bursar.broker.events import (
    RequestLease,
)

INTERACTIVE = LeaseClass.INTERACTIVE
BATCH = LeaseClass.BATCH
OPPORTUNISTIC = LeaseClass.OPPORTUNISTIC


def req(at, campaign, gpu, duration_s, **kw):
    return RequestLease(at=at, campaign=campaign, size={"gpu": gpu}, duration_s=duration_s, **kw)


def kinds(decisions):
    return [type(d).__name__ for d in decisions]


def one(decisions, cls):
    found = [d for d in decisions if isinstance(d, cls)]
    assert len(found) == 1, (cls.__name__, decisions)
    return found[0]


def gpu(vec):
    return vec[dims.PLACED.index("gpu")]


def _pool_full():
    eng = build_engine(
        nodes=4,
        warm=4,
        warm_headroom={},
        campaigns=[gpu_campaign("a", 0, 8, 64), gpu_campaign("b", 0, 8, 64)],
    )
    eng.apply(req(0, "a", 32, 100))
    return eng, 5, "b", 8, 95.0


def reclaim_setup():
    """All 8 nodes warm (64 GPUs, no cold), a 48-GPU backfill lease, victim reserve 8."""
    eng = build_engine(
        warm=8,
        campaigns=[
            gpu_campaign("victim", 8, 8, 16, 6000, INTERACTIVE),
            gpu_campaign("sci", 0, 8, 32, 100_000),
            gpu_campaign("bf", 0, 64, 64, None, OPPORTUNISTIC, preemptible=True),
        ],
    )
    # Preemptible: warm beyond reserve (8) + headroom (8) only.
    out = eng.apply(req(0, "bf", 48, 1000))
    assert kinds(out) == ["Granted"] and out[0].path is LeasePath.WARM
    assert gpu(eng.reclaimable) == 48
    return eng
