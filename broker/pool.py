"""The engine's view of the pool: nodes, their power state, and where leases sit.

Aggregates (capacity on, used on, booting, cold) are kept up to date incrementally,
because the admission rule reads them on every decision.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bursar.broker import dims
from bursar.broker.policy import PoolSpec


class Power(enum.Enum):
    COLD = "cold"
    BOOTING = "booting"
    ON = "on"
    DOWN = "down"
    """Lost (failure or drain); comes back only when the backend reports it ready."""


@dataclass(slots=True)
class Node:
    name: str
    cap: dims.Vec
    power: Power
    used: dims.Vec = dims.ZERO
    ready_at: float | None = None

    @property
    def free(self) -> dims.Vec:
        return dims.sub(self.cap, self.used)


class PoolState:
    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self.nodes: list[Node] = [
            Node(name, cap, Power.ON if warm else Power.COLD)
            for name, cap, warm in spec.node_names()
        ]
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        self.capacity: dims.Vec = dims.ZERO
        for n in self.nodes:
            self.capacity = dims.add(self.capacity, n.cap)
        self.rate_capacity = dict(spec.rate_capacity)
        self._totals: tuple[dims.Vec, dims.Vec, dims.Vec, dims.Vec] | None = None

    def set_power(self, i: int, power: Power, ready_at: float | None = None) -> None:
        self.nodes[i].power = power
        self.nodes[i].ready_at = ready_at
        self._totals = None

    # Aggregates are recomputed from the nodes after a change and cached until the next
    # one: the bookkeeping stays in one place, so counters cannot drift from the nodes.
    def totals(self) -> tuple[dims.Vec, dims.Vec, dims.Vec, dims.Vec]:
        """(free on powered nodes, free on booting nodes, capacity of cold nodes, on capacity)."""
        if self._totals is None:
            self._totals = self._compute_totals()
        return self._totals

    def _compute_totals(self) -> tuple[dims.Vec, dims.Vec, dims.Vec, dims.Vec]:
        on_free = boot_free = cold = on_cap = dims.ZERO
        for n in self.nodes:
            if n.power is Power.ON:
                on_free = dims.add(on_free, n.free)
                on_cap = dims.add(on_cap, n.cap)
            elif n.power is Power.BOOTING:
                boot_free = dims.add(boot_free, n.free)
            elif n.power is Power.COLD:
                cold = dims.add(cold, n.cap)
        return on_free, boot_free, cold, on_cap

    def place(self, need: dims.Vec, powers: tuple[Power, ...]) -> dict[int, dims.Vec]:
        """Split ``need`` over nodes in the given power states, packing partly used nodes first.

        Returns node index → piece. The caller has checked the aggregate fits, so a
        componentwise greedy split always succeeds.
        """
        order = sorted(
            (i for i, n in enumerate(self.nodes) if n.power in powers),
            key=lambda i: (
                powers.index(self.nodes[i].power),
                dims.is_zero(self.nodes[i].used),
                i,
            ),
        )
        pieces: dict[int, dims.Vec] = {}
        rest = need
        for i in order:
            if dims.is_zero(rest):
                break
            n = self.nodes[i]
            take = dims.vmax0(dims.vmin(rest, n.free))
            if dims.is_zero(take):
                continue
            n.used = dims.add(n.used, take)
            self._totals = None
            pieces[i] = take
            rest = dims.vmax0(dims.sub(rest, take))
        if not dims.is_zero(rest):
            raise AssertionError(f"placement short by {rest}: aggregate check was wrong")
        return pieces

    def add_piece(self, i: int, piece: dims.Vec) -> None:
        n = self.nodes[i]
        n.used = dims.add(n.used, piece)
        self._totals = None

    def free_pieces(self, pieces: dict[int, dims.Vec]) -> None:
        for i, piece in pieces.items():
            n = self.nodes[i]
            n.used = dims.vmax0(dims.sub(n.used, piece))
        self._totals = None

    def boot(self, need: dims.Vec, now: float, latency: float) -> list[int]:
        """Power on cold nodes, in index order, until their capacity covers ``need``."""
        started = []
        got = dims.ZERO
        for i, n in enumerate(self.nodes):
            if dims.fits(need, got):
                break
            if n.power is Power.COLD:
                self.set_power(i, Power.BOOTING, now + latency)
                got = dims.add(got, n.cap)
                started.append(i)
        return started
