"""The pool's node index answers placement exactly as a pass over every node would.

``PoolState.candidates_for`` finds the nodes ``shape.take`` chooses from in the index (a
bisection for best fit, the nodes with room in index order for a split) instead of listing
every node (``PoolState.candidates``). Over random pools of mixed node kinds, random use
and power states, and random demands of every shape mode, ``take`` over the index's
candidates must choose exactly what it chooses over the full list, and the index must
stay in step with every change (``put``, ``free_pieces``, ``set_power``, a snapshot).
"""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from bursar.broker import dims, shape
from bursar.broker.policy import NodeGroup, PoolSpec
from bursar.broker.pool import NodeState, PoolState

KINDS = (
    {"gpu": 8, "cpu": 64, "mem_gb": 512},
    {"gpu": 4, "cpu": 32, "mem_gb": 256},
    {"gpu": 0, "cpu": 128, "mem_gb": 1024},
)
POWERS = ((NodeState.ON,), (NodeState.BOOTING, NodeState.COLD))


@st.composite
def pools(draw: st.DrawFn) -> PoolState:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3))
    groups = []
    for k, kind in enumerate(kinds):
        count = draw(st.integers(1, 6))
        warm = draw(st.integers(0, count))
        groups.append(NodeGroup(count, kind, warm, prefix=f"g{k}-"))
    spec = PoolSpec(groups=tuple(groups))
    pool = PoolState(spec)
    for i, n in enumerate(pool.nodes):
        change = draw(st.sampled_from(("keep", "use", "boot", "down")))
        if change == "boot" and n.power is NodeState.COLD:
            pool.set_power(i, NodeState.BOOTING, 60.0)
        elif change == "down":
            pool.set_power(i, NodeState.DOWN)
        if change in ("use", "boot") and n.power in (NodeState.ON, NodeState.BOOTING):
            frac = draw(st.sampled_from((0.0, 0.25, 0.5, 0.75, 1.0)))
            part = tuple(float(int(x * frac)) for x in n.cap)
            pool.put({i: part})
            if draw(st.booleans()):
                pool.free_pieces({i: tuple(float(int(x / 4)) for x in part)})
    return pool


@st.composite
def demands(draw: st.DrawFn, pool: PoolState) -> shape.Demand:
    size = {
        d: draw(st.sampled_from((0, 1, 2, 3, 4, 8, 12, 16, 33, 64, 100)))
        for d in draw(st.lists(st.sampled_from(dims.PLACED), min_size=1, max_size=3, unique=True))
    }
    mode = draw(st.sampled_from(("total", "nodes", "whole")))
    try:
        if mode == "nodes":
            per = {d: max(1, x // 4) for d, x in size.items() if x}
            return shape.resolve(
                {}, shape.Shape(nodes=draw(st.integers(1, 4)), per_node=per), pool.kinds
            )
        if mode == "whole":
            return shape.resolve(
                {}, shape.Shape(nodes=draw(st.integers(1, 3)), exclusive=True), pool.kinds
            )
    except Exception:
        pass
    if not any(size.values()):
        size = {"gpu": 1}
    return shape.total(dims.vec(size))


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_take_over_the_index_chooses_as_over_every_node(data: st.DataObject) -> None:
    pool = data.draw(pools())
    if data.draw(st.booleans()):
        pool = pickle.loads(pickle.dumps(pool))  # the index is rebuilt on load
    for _ in range(4):
        d = data.draw(demands(pool))
        powers = data.draw(st.sampled_from(POWERS))
        want = data.draw(st.sampled_from((d.count, d.count / 2, 1.0, 0.5, 3.0)))
        limit = data.draw(st.sampled_from((float("inf"), d.count, 2.0, 0.0)))
        full = shape.take(d, pool.candidates(d, powers), want, limit, pool.primary)
        fast = shape.take(d, pool.candidates_for(d, powers, want, limit), want, limit, pool.primary)
        assert fast == full
        if full:
            pool.put({i: shape.piece(d, u) for i, u in full})
