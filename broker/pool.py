"""The engine's view of the pool: nodes, their power state, and where leases sit.

Aggregates (capacity on, used on, booting, cold) are kept up to date incrementally,
because the admission rule reads them on every decision. Which nodes a lease's pieces go
to is chosen by ``placement`` (with ``shape.take``); this module lists the candidate
nodes and applies the chosen pieces.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedList

from bursar.broker import dims, shape
from bursar.broker.policy import PoolSpec
from bursar.broker.price import primary_index


class NodeState(enum.Enum):
    """A node's state, the one enum for the engine's pool and every backend.

    The values are what the engine's state digest writes. Whether an on node holds leases
    is not a state of its own: the engine reads it from the node's use, a backend from its
    placements.
    """

    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    COLD = "cold"
    """Powered off."""
    BOOTING = "booting"
    """Powered on, not ready yet; on once the backend reports it ready (NodeReady)."""
    ON = "on"
    """On and usable, holding leases or not."""
    DOWN = "down"
    """Lost (failure or drain); comes back only when the backend reports it ready."""


@dataclass(slots=True)
class Node:
    name: str
    cap: dims.Vec
    power: NodeState
    used: dims.Vec = dims.ZERO
    ready_at: float | None = None

    @property
    def free(self) -> dims.Vec:
        return dims.sub(self.cap, self.used)


_INDEXED = (NodeState.ON, NodeState.BOOTING, NodeState.COLD)
DRAWING = frozenset({NodeState.ON, NodeState.BOOTING})
"""The power states in which a node draws its idle watts (a booting node from its boot's
start)."""
_TOL = 1e-6
"""Slack on the bisection's lower bound (the fit test itself is ``take``'s, exactly)."""


class PoolState:
    """Nodes plus per-power-state aggregates, kept in step with every change.

    The admission rule reads the aggregates on every decision; recomputing them from
    the nodes each time cost more than the rest of a decision. ``recount`` recomputes
    them from scratch, and the engine's invariant check compares the two.
    """

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.nodes: list[Node] = [
            Node(name, cap, NodeState.ON if warm else NodeState.COLD)
            for name, cap, warm in spec.node_names()
        ]
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.capacity: dims.Vec = dims.ZERO
        for n in self.nodes:
            self.capacity = dims.add(self.capacity, n.cap)
        self.rate_capacity = dict(spec.rate_capacity)
        self.primary = primary_index(self.capacity)
        kinds: dict[dims.Vec, int] = {}
        for n in self.nodes:
            kinds[n.cap] = kinds.get(n.cap, 0) + 1
        self.kinds: tuple[tuple[dims.Vec, int], ...] = tuple(kinds.items())
        """The distinct node capacities, in node order, with how many nodes have each."""
        self.idle_w: tuple[float, ...] = tuple(
            float(g.idle_w) for g in spec.groups for _ in range(g.count)
        ) or (0.0,) * len(self.nodes)
        """Each node's idle draw, watts (0 where not known)."""
        self._drawing: dict[float, int] = {}
        """How many powered or booting nodes draw each idle wattage (``idle_draw``)."""
        for i, n in enumerate(self.nodes):
            if n.power is NodeState.ON:
                self._drawing[self.idle_w[i]] = self._drawing.get(self.idle_w[i], 0) + 1
        self._free = {p: dims.ZERO for p in NodeState}
        """Free capacity per power state (for COLD and DOWN nodes: their whole capacity)."""
        self.on_cap = dims.ZERO
        self._free, self.on_cap = self.recount()
        self._totals: tuple[dims.Vec, dims.Vec, dims.Vec, dims.Vec] | None = None
        """``totals()`` as of the last change (read many times per decision)."""
        self._fit: dict[NodeState, SortedList] = {p: SortedList() for p in _INDEXED}
        """Per power state, the nodes with free capacity in packing order: (preference
        group, free in the primary dimension, free per dimension, index). Best fit is the
        first entry that holds the piece (``candidates_for``)."""
        self._rooms: dict[tuple[NodeState, int, int], SortedList] = {}
        """Per (power state, preference group, dimension), the indexes of the nodes with
        some of that dimension free, in index order (the order a split is made in)."""
        for i in range(len(self.nodes)):
            self._index(i)

    def __getstate__(self) -> dict[str, Any]:
        # A snapshot leaves the cache out (whether it is filled depends on who read it) and
        # the node index (derived from the nodes, rebuilt on load).
        state = {**self.__dict__, "_totals": None}
        del state["_fit"], state["_rooms"]
        return state

    def recount(self) -> tuple[dict[NodeState, dims.Vec], dims.Vec]:
        free = {p: dims.ZERO for p in NodeState}
        on_cap = dims.ZERO
        for n in self.nodes:
            free[n.power] = dims.add(free[n.power], n.free)
            if n.power is NodeState.ON:
                on_cap = dims.add(on_cap, n.cap)
        return free, on_cap

    def set_power(self, i: int, power: NodeState, ready_at: float | None = None) -> None:
        self._totals = None
        self._unindex(i)
        n = self.nodes[i]
        self._free[n.power] = dims.sub(self._free[n.power], n.free)
        if n.power is NodeState.ON:
            self.on_cap = dims.sub(self.on_cap, n.cap)
        drawing = self._drawing
        w = self.idle_w[i]
        if n.power in DRAWING:
            drawing[w] -= 1
        if power in DRAWING:
            drawing[w] = drawing.get(w, 0) + 1
        n.power = power
        n.ready_at = ready_at
        self._free[power] = dims.add(self._free[power], n.free)
        if power is NodeState.ON:
            self.on_cap = dims.add(self.on_cap, n.cap)
        self._index(i)

    @property
    def idle_draw(self) -> float:
        """What the powered and booting nodes draw idle, watts (a booting node draws from
        its boot's start)."""
        return sum(w * k for w, k in self._drawing.items())

    def totals(self) -> tuple[dims.Vec, dims.Vec, dims.Vec, dims.Vec]:
        """(free on powered nodes, free on booting nodes, capacity of cold nodes, on capacity)."""
        t = self._totals
        if t is None:
            f = self._free
            t = self._totals = (
                f[NodeState.ON],
                f[NodeState.BOOTING],
                f[NodeState.COLD],
                self.on_cap,
            )
        return t

    def _use(self, i: int, delta: dims.Vec) -> None:
        self._totals = None
        self._unindex(i)
        n = self.nodes[i]
        n.used = dims.add(n.used, delta)
        self._free[n.power] = dims.sub(self._free[n.power], delta)
        self._index(i)

    def put(self, pieces: Mapping[int, dims.Vec]) -> None:
        """Take the chosen pieces (node index → piece) out of their nodes' free capacity."""
        for i, piece in pieces.items():
            self._use(i, piece)

    # ------------------------------------------------------------------ the node index

    def _entries(self, i: int) -> tuple[NodeState, int, dims.Vec] | None:
        """Node ``i``'s place in the index: (power state, preference group, what a piece
        may use there), as ``candidates`` lists it; None when it is in no list."""
        n = self.nodes[i]
        power = n.power
        if power is NodeState.COLD:
            return power, 2, n.cap
        if power is NodeState.DOWN:
            return None
        u = n.used
        if u == dims.ZERO:
            return power, 1, n.cap
        c = n.cap
        return power, 0, (c[0] - u[0], c[1] - u[1], c[2] - u[2])

    def _keys(self, i: int) -> tuple[NodeState, tuple[Any, ...], list[tuple[Any, ...]]] | None:
        """Node ``i``'s entries: (power, its packing-order entry, its (power, group,
        dimension) room lists); None when it is in none (down, or nothing free)."""
        at = self._entries(i)
        if at is None:
            return None
        power, group, free = at
        if all(x <= 0 for x in free):
            return None
        rooms = [(power, group, j) for j, x in enumerate(free) if x > 0]
        return power, (group, free[self.primary], *free, i), rooms

    def _index(self, i: int) -> None:
        keys = self._keys(i)
        if keys is None:
            return
        power, entry, rooms = keys
        self._fit[power].add(entry)
        for key in rooms:
            lst = self._rooms.get(key)
            if lst is None:
                lst = self._rooms[key] = SortedList()
            lst.add(i)

    def _unindex(self, i: int) -> None:
        keys = self._keys(i)
        if keys is None:
            return
        power, entry, rooms = keys
        self._fit[power].remove(entry)
        for key in rooms:
            self._rooms[key].remove(i)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        # The index is derived from the nodes: rebuilt, never stored.
        self._fit = {p: SortedList() for p in _INDEXED}
        self._rooms = {}
        for i in range(len(self.nodes)):
            self._index(i)

    def candidates_for(
        self, d: shape.Demand, powers: tuple[NodeState, ...], want: float, limit: float
    ) -> list[shape.Candidate]:
        """The candidates ``shape.take(d, ..., want, limit, primary)`` chooses from, found
        in the index without a pass over the nodes: ``take`` over them chooses exactly as
        over ``candidates(d, powers)``. Best fit is the first indexed node, in packing
        order, that holds the piece (from a bisection on the primary dimension); a split
        walks the nodes with room in index order only as far as it needs; N pieces are
        the first N nodes that hold one. O(log n + k) for the k entries looked at."""
        goal = min(want, limit)
        total_mode = d.mode is shape.Mode.TOTAL
        if total_mode and d.whole:
            goal = float(math.floor(goal + shape.EPS))
        if goal <= shape.EPS:
            return []
        unit = d.unit
        named = [(j, u) for j, u in enumerate(unit) if u > 0.0]
        if not named:
            return self.candidates(d, powers)
        p = self.primary
        groups = (0, 1, 2)
        if not total_mode:
            # One unit per node: the first ``n`` nodes (packing order) that hold a unit.
            n = round(goal)
            whole = d.mode is shape.Mode.WHOLE
            out: list[shape.Candidate] = []
            for g in groups:
                if whole and g == 0:
                    continue
                lo = unit[p] - _TOL if unit[p] > 0 else -math.inf
                for e in self._by_fit(powers, g, lo):
                    free = e[2:5]
                    if whole:
                        if self.nodes[e[5]].cap != unit:
                            continue
                    elif not dims.fits(unit, free):
                        continue
                    out.append((g, e[5], free))
                    if len(out) == n:
                        return out
            return out
        whole_units = d.whole
        lo = (goal - shape.EPS) * unit[p] - _TOL if unit[p] > 0 else -math.inf
        for g in groups:
            for e in self._by_fit(powers, g, lo):
                free = e[2:5]
                k = min(free[j] / u for j, u in named)
                if whole_units:
                    k = math.floor(k + shape.EPS)
                if k > shape.EPS and k + shape.EPS >= goal:
                    return [(g, e[5], free)]
        # No node holds it all: the nodes with room, in group then index order, until
        # they hold it (``take`` splits over them in that order).
        lead = p if unit[p] > 0 else named[0][0]
        out = []
        rest = goal
        nodes = self.nodes
        for g in groups:
            for i in self._by_index(powers, g, lead):
                n_ = nodes[i]
                free = n_.cap if g == 2 else dims.sub(n_.cap, n_.used)
                k = min(free[j] / u for j, u in named)
                if whole_units:
                    k = math.floor(k + shape.EPS)
                if k <= shape.EPS:
                    continue
                out.append((g, i, free))
                rest -= min(k, rest)
                if rest <= shape.EPS:
                    return out
        return out

    def _by_fit(
        self, powers: tuple[NodeState, ...], group: int, lo: float
    ) -> Iterator[tuple[Any, ...]]:
        """Index entries of ``group`` in ``powers`` from ``lo`` (primary free) up, in order."""
        lists = [self._fit[pw] for pw in powers if pw in self._fit]
        its = [
            lst.irange(minimum=(group, lo), maximum=(group, math.inf), inclusive=(True, True))
            for lst in lists
        ]
        return its[0] if len(its) == 1 else heapq.merge(*its)

    def _by_index(self, powers: tuple[NodeState, ...], group: int, j: int) -> Iterator[int]:
        its = [iter(self._rooms[pw, group, j]) for pw in powers if (pw, group, j) in self._rooms]
        return its[0] if len(its) == 1 else heapq.merge(*its)

    def candidates(self, d: shape.Demand, powers: tuple[NodeState, ...]) -> list[shape.Candidate]:
        """The nodes in ``powers`` a piece of ``d`` could go to, in index order, with their
        free capacity (a cold node's: all of it) and preference group (partly used 0,
        empty 1, cold 2). One pass over the nodes: this runs on every plan that the
        aggregate check lets through."""
        whole = d.mode is shape.Mode.WHOLE
        unit = d.unit
        zero = dims.ZERO
        cold = NodeState.COLD
        with_cold = cold in powers
        out: list[shape.Candidate] = []
        append = out.append
        for i, n in enumerate(self.nodes):
            power = n.power
            if power is cold:
                if with_cold and (not whole or n.cap == unit):
                    append((2, i, n.cap))
                continue
            if power not in powers:
                continue
            u = n.used
            if u == zero:
                if not whole or n.cap == unit:
                    append((1, i, n.cap))
            elif not whole:
                c = n.cap
                append((0, i, (c[0] - u[0], c[1] - u[1], c[2] - u[2])))
        return out

    def free_pieces(self, pieces: dict[int, dims.Vec]) -> None:
        for i, piece in pieces.items():
            n = self.nodes[i]
            self._use(i, tuple(-x for x in dims.vmin(piece, n.used)))

    def fragmentation(self) -> tuple[dims.Vec, dims.Vec]:
        """(stranded, partial free) over powered nodes, per dimension.

        *Stranded*: free capacity that cannot serve a piece at the pool's typical ratio
        (its capacity per unit of the primary dimension, e.g. 8 cores and 32 GB per GPU)
        in whole units of the primary dimension: on each node, what is left of its free
        capacity after the most such units it can still hold. Free GPUs next to no free
        CPUs, or free CPUs next to no free GPU, are stranded; on a one-dimensional pool
        nothing ever is. *Partial free*: free capacity on partly used nodes, which no
        whole-node (exclusive) request can use. One pass over the nodes.
        """
        cap = self.capacity
        per = cap[self.primary]
        ratio = tuple(x / per for x in cap) if per > 0 else cap
        stranded = partial = dims.ZERO
        for n in self.nodes:
            if n.power is not NodeState.ON or n.used == dims.ZERO:
                continue
            free = n.free
            partial = dims.add(partial, free)
            k = min(free[j] / r for j, r in enumerate(ratio) if r > 0)
            k = max(0.0, float(int(k + 1e-9)))
            left = dims.vmax0(tuple(f - k * r for f, r in zip(free, ratio, strict=True)))
            stranded = dims.add(stranded, left)
        return stranded, partial

    def boot_nodes(self, nodes: Iterable[int], now: float, latency: float) -> list[int]:
        """Power on the given nodes that are cold; returns those started."""
        started = []
        for i in nodes:
            if self.nodes[i].power is NodeState.COLD:
                self.set_power(i, NodeState.BOOTING, now + latency)
                started.append(i)
        return started

    def boot(
        self, need: dims.Vec, now: float, latency: float, gate: Callable[[int], bool] | None = None
    ) -> list[int]:
        """Power on cold nodes, in index order, until their capacity covers ``need``;
        ``gate`` (if given) says which cold nodes may boot (it is asked once per node)."""
        started = []
        got = dims.ZERO
        for i, n in enumerate(self.nodes):
            if dims.fits(need, got):
                break
            if n.power is NodeState.COLD and (gate is None or gate(i)):
                self.set_power(i, NodeState.BOOTING, now + latency)
                got = dims.add(got, n.cap)
                started.append(i)
        return started
