"""The engine's view of the pool: nodes, their power state, and where leases sit.

Aggregates (capacity on, used on, booting, cold) are kept up to date incrementally,
because the admission rule reads them on every decision.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bursar.broker import dims
from bursar.broker.policy import PoolSpec


class NodeState(enum.Enum):
    """A node's state, the one enum for the engine's pool and every backend.

    The values are what the engine's state digest writes. Whether an on node holds leases
    is not a state of its own: the engine reads it from the node's use, a backend from its
    placements.
    """

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
        self._free = {p: dims.ZERO for p in NodeState}
        """Free capacity per power state (for COLD and DOWN nodes: their whole capacity)."""
        self.on_cap = dims.ZERO
        self._free, self.on_cap = self.recount()

    def recount(self) -> tuple[dict[NodeState, dims.Vec], dims.Vec]:
        free = {p: dims.ZERO for p in NodeState}
        on_cap = dims.ZERO
        for n in self.nodes:
            free[n.power] = dims.add(free[n.power], n.free)
            if n.power is NodeState.ON:
                on_cap = dims.add(on_cap, n.cap)
        return free, on_cap

    def set_power(self, i: int, power: NodeState, ready_at: float | None = None) -> None:
        n = self.nodes[i]
        self._free[n.power] = dims.sub(self._free[n.power], n.free)
        if n.power is NodeState.ON:
            self.on_cap = dims.sub(self.on_cap, n.cap)
        n.power = power
        n.ready_at = ready_at
        self._free[power] = dims.add(self._free[power], n.free)
        if power is NodeState.ON:
            self.on_cap = dims.add(self.on_cap, n.cap)

    def totals(self) -> tuple[dims.Vec, dims.Vec, dims.Vec, dims.Vec]:
        """(free on powered nodes, free on booting nodes, capacity of cold nodes, on capacity)."""
        f = self._free
        return f[NodeState.ON], f[NodeState.BOOTING], f[NodeState.COLD], self.on_cap

    def _use(self, n: Node, delta: dims.Vec) -> None:
        n.used = dims.add(n.used, delta)
        self._free[n.power] = dims.sub(self._free[n.power], delta)

    def place(self, need: dims.Vec, powers: tuple[NodeState, ...]) -> dict[int, dims.Vec]:
        """Split ``need`` over nodes in the given power states, packing partly used nodes first.

        Returns node index → piece. The caller has checked the aggregate fits, so a
        componentwise greedy split always succeeds.
        """
        # Pack: partly used nodes first, then empty ones, each in index order. This runs on
        # every grant: full nodes are skipped cheaply and the arithmetic is inline.
        nodes = self.nodes
        zero = dims.ZERO
        wanted = [k for k, x in enumerate(need) if x > 0]
        pieces: dict[int, dims.Vec] = {}
        rest = need
        for partly in (True, False):
            for i, n in enumerate(nodes):
                u = n.used
                if n.power not in powers or (u != zero) is not partly:
                    continue
                cap = n.cap
                if not any(cap[k] - u[k] > 1e-12 for k in wanted):
                    continue
                take = tuple(max(0.0, min(r, c - x)) for r, c, x in zip(rest, cap, u, strict=True))
                if not any(x > 1e-12 for x in take):
                    continue
                self._use(n, take)
                pieces[i] = take
                rest = tuple(max(0.0, r - t) for r, t in zip(rest, take, strict=True))
                if not any(x > 1e-9 for x in rest):
                    return pieces
        raise AssertionError(f"placement short by {rest}: aggregate check was wrong")

    def free_pieces(self, pieces: dict[int, dims.Vec]) -> None:
        for i, piece in pieces.items():
            n = self.nodes[i]
            self._use(n, tuple(-x for x in dims.vmin(piece, n.used)))

    def boot(self, need: dims.Vec, now: float, latency: float) -> list[int]:
        """Power on cold nodes, in index order, until their capacity covers ``need``."""
        started = []
        got = dims.ZERO
        for i, n in enumerate(self.nodes):
            if dims.fits(need, got):
                break
            if n.power is NodeState.COLD:
                self.set_power(i, NodeState.BOOTING, now + latency)
                got = dims.add(got, n.cap)
                started.append(i)
        return started
