"""The rules the engine's state must always keep, checked from scratch.

A read-only audit for tests and replays: it recounts from the leases and nodes what the
engine keeps incrementally (pieces per node, holdings per campaign, the pool's free
totals) and asserts that the two agree and that no capacity or bucket bound is broken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bursar.broker import dims
from bursar.broker.pool import NodeState

if TYPE_CHECKING:
    from bursar.broker.engine import Engine


def check(eng: Engine) -> None:
    """Raise AssertionError if the state breaks a rule the engine must always keep.

    During a reclaim hand-over a claimant is counted as held while its victim still
    holds the same capacity; placed pieces never overlap, so capacity is checked on
    pieces and held totals are checked net of outstanding claims.
    """
    per_node = [dims.ZERO for _ in eng.pool.nodes]
    claimed = dims.ZERO
    for ls in eng.leases.values():
        placed = dims.ZERO
        for i, piece in ls.pieces.items():
            per_node[i] = dims.add(per_node[i], piece)
            placed = dims.add(placed, piece)
        outstanding = dims.ZERO
        for take in ls.claims.values():
            outstanding = dims.add(outstanding, take)
        claimed = dims.add(claimed, outstanding)
        got = dims.add(placed, outstanding)
        assert dims.fits(got, ls.size) and dims.fits(ls.size, got), (ls.id, got, ls.size)
    for n, used in zip(eng.pool.nodes, per_node, strict=True):
        assert dims.fits(used, n.used) and dims.fits(n.used, used), (n.name, used, n.used)
        assert dims.fits(n.used, n.cap), (n.name, n.used, n.cap)
        if n.power in (NodeState.COLD, NodeState.DOWN):
            assert dims.is_zero(n.used), (n.name, n.power, n.used)
    total = dims.ZERO
    for name, c in eng.campaigns.items():
        held = dims.ZERO
        for lid in c.leases:
            held = dims.add(held, eng.leases[lid].size)
        assert dims.fits(held, c.held) and dims.fits(c.held, held), (name, held, c.held)
        total = dims.add(total, held)
        for i, d in enumerate(dims.PLACED):
            b = c.buckets.get(d)
            if b is not None and not b.unlimited:
                lvl = b.level_at(eng.now, c.held[i], eng.policy.enforcement)
                assert -1e-6 <= lvl <= b.capacity + 1e-6, (name, d, lvl)
    assert dims.fits(dims.sub(total, claimed), eng.pool.capacity), (total, claimed)
    free, on_cap = eng.pool.recount()
    cached = eng.pool.totals()
    fresh = (free[NodeState.ON], free[NodeState.BOOTING], free[NodeState.COLD], on_cap)
    for x, y in zip(cached, fresh, strict=True):
        assert all(abs(a - b) < 1e-6 for a, b in zip(x, y, strict=True)), (cached, fresh)
    _check_elastic(eng)
    eng.watts.check(eng.pool)
    assert set(eng.watts.leases()) == set(eng.leases), "power: leases' watts out of step"


def _check_elastic(eng: Engine) -> None:
    """Every elastic lease holds between its intent's min and max, its extents hold the
    steps it counts (each its count of steps), and every extent belongs to a live elastic
    lease of the same campaign, ending no later than it."""
    el = eng.elastic
    for xid, parent in el.parent_of.items():
        assert xid in eng.leases and parent in el.by_lease, (xid, parent)
        assert xid in el.by_lease[parent].extents, (xid, parent)
        x, owner = eng.leases[xid], eng.leases[parent]
        assert x.campaign == owner.campaign, (xid, x.campaign, owner.campaign)
        assert x.expires_at <= owner.expires_at + 1e-9, (xid, x.expires_at, owner.expires_at)
    for lid, e in el.by_lease.items():
        assert lid in eng.leases, lid
        size, _ = eng.elastic_size(lid)
        lo, hi = dims.vec(e.intent.min), dims.vec(e.intent.max)
        assert dims.fits(lo, dims.add(size, (1e-9,) * len(size))), (lid, size, lo)
        assert dims.fits(size, dims.add(hi, (1e-9,) * len(hi))), (lid, size, hi)
        for xid in e.extents:
            assert el.parent_of.get(xid) == lid, (lid, xid)
            want = tuple(v * e.counts[xid] for v in e.step)
            got = eng.leases[xid].size
            assert all(abs(a - b) < 1e-9 for a, b in zip(got, want, strict=True)), (xid, got)
        assert set(e.counts) == set(e.extents), (lid, e.counts, e.extents)
        assert e.held_steps == sum(e.counts.values()), (lid, e.held_steps, e.counts)
        assert e.held_steps in e.allowed, (lid, e.held_steps, e.allowed)
        for xid, deadline in e.warned.items():
            assert xid in e.extents and deadline >= eng.now - 1e-9, (lid, xid, deadline)
    for rid in el.waiting:
        assert rid in eng.pending, rid
    held = warned = dims.ZERO
    for xid, parent in el.parent_of.items():
        held = dims.add(held, eng.leases[xid].size)
        if xid in el.by_lease[parent].warned:
            warned = dims.add(warned, eng.leases[xid].size)
    for got, want in ((el.held, held), (el.warned_held, warned)):
        assert all(abs(a - b) < 1e-6 for a, b in zip(got, want, strict=True)), (got, want)
