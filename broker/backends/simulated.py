"""A pool in virtual time: the embedded default backend, and the simulator's.

Nothing here sleeps or reads a clock. A node started at ``t`` is ready at exactly
``t + boot_latency_s`` and reports ``NodeReady(at=t + boot_latency_s)``, whenever the caller
happens to ask, so that the same calls always give the same events, byte for byte in the
journal. Placement is bookkeeping only: which lease sits on which node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from bursar.broker.backends.base import (
    NO_PIECES,
    BackendError,
    NodeState,
    Pieces,
    PoolBackend,
    check_clock,
    check_nodes,
)
from bursar.broker.events import Event, NodeLost, NodeReady
from bursar.broker.policy import PoolSpec

__all__ = ["SimulatedPool"]


class SimulatedPool(PoolBackend):
    """A ``PoolBackend`` over a ``PoolSpec``; the first ``warm`` nodes of each group start on,
    the rest cold. Nothing it does blocks, so it is driven inline (not ``slow``)."""

    resizes = True

    def __init__(self, pool: PoolSpec) -> None:
        self._boot_latency_s = float(pool.boot_latency_s)
        self._state: dict[str, NodeState] = {}
        for name, _, warm in pool.node_names():
            if name in self._state:
                raise BackendError(f"node name {name!r} appears twice in the pool spec")
            self._state[name] = NodeState.ON if warm else NodeState.COLD
        self._now = -math.inf
        # Timers: a booting node's ready time; a failed node's repair time.
        self._ready_at: dict[str, float] = {}
        self._repair_at: dict[str, float] = {}
        self._lease_nodes: dict[str, tuple[str, ...]] = {}
        self._node_leases: dict[str, set[str]] = {name: set() for name in self._state}
        self._due: list[Event] = []

    # -- PoolBackend --------------------------------------------------------------------

    @property
    def boot_latency_s(self) -> float:
        return self._boot_latency_s

    def node_states(self) -> Mapping[str, NodeState]:
        # A read-only view: callers see later changes but cannot make them.
        return MappingProxyType(self._state)

    def start(self, nodes: Iterable[str], now: float) -> None:
        names = self._known(nodes)
        self._advance(now)
        for n in names:
            if self._state[n] is NodeState.DOWN:
                raise BackendError(f"node {n!r} is down; it comes back only when repaired")
        # Starting a node that is already booting or on is a no-op, so that a shell that
        # retries after a crash cannot push a boot's ready time back.
        for n in names:
            if self._state[n] is NodeState.COLD:
                self._state[n] = NodeState.BOOTING
                self._ready_at[n] = now + self._boot_latency_s

    def stop(self, nodes: Iterable[str], now: float) -> None:
        names = self._known(nodes)
        self._advance(now)
        for n in names:
            if self._state[n] is NodeState.DOWN:
                raise BackendError(f"node {n!r} is down; cannot power it off")
            if self._node_leases[n]:
                held = ", ".join(sorted(self._node_leases[n]))
                raise BackendError(f"node {n!r} holds lease(s) {held}; cannot power it off")
        for n in names:
            self._ready_at.pop(n, None)
            self._state[n] = NodeState.COLD

    def place(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        # Placement is bookkeeping here: the pieces matter only to a real resource manager.
        names = self._known(nodes)
        self._advance(now)
        if lease_id in self._lease_nodes:
            raise BackendError(
                f"lease {lease_id!r} is already placed on {', '.join(self._lease_nodes[lease_id])}"
            )
        for n in names:
            if self._state[n] is not NodeState.ON:
                raise BackendError(
                    f"node {n!r} is {self._state[n].value}; leases go only on nodes that are on"
                )
        self._lease_nodes[lease_id] = names
        for n in names:
            self._node_leases[n].add(lease_id)

    def resize(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        # Bookkeeping, as place: the lease now sits on these nodes.
        self.unplace(lease_id, now)
        self.place(lease_id, nodes, now, pieces)

    def unplace(self, lease_id: str, now: float) -> None:
        self._advance(now)
        # Ignoring an unknown lease lets the shell unplace on every revoke/expire/release
        # without tracking whether that lease ever got as far as being placed.
        for n in self._lease_nodes.pop(lease_id, ()):
            self._node_leases[n].discard(lease_id)

    def due_events(self, now: float) -> list[Event]:
        self._advance(now)
        out, self._due = self._due, []
        return out

    def next_event_time(self) -> float | None:
        times = [e.at for e in self._due]
        times.extend(self._ready_at.values())
        times.extend(self._repair_at.values())
        # Clamped to the pool's clock so that due_events(next_event_time()) is always legal.
        return max(self._now, min(times)) if times else None

    def adopt(
        self,
        nodes: Mapping[str, tuple[NodeState, float | None]],
        placements: Mapping[str, tuple[str, ...]],
        now: float,
    ) -> None:
        names = self._known(nodes)
        if set(names) != set(self._state):
            raise BackendError("adopt needs the state of every node in the pool")
        self._known([n for ns in placements.values() for n in ns])
        self._now = float(now)
        self._due = []
        self._repair_at = {}
        self._ready_at = {}
        for name, (state, ready_at) in nodes.items():
            self._state[name] = state
            if state is NodeState.BOOTING:
                # A boot the journal expects to finish reports then, never in the past.
                self._ready_at[name] = max(now, ready_at if ready_at is not None else now)
        self._lease_nodes = {lid: tuple(ns) for lid, ns in placements.items()}
        self._node_leases = {name: set() for name in self._state}
        for lid, ns in placements.items():
            for n in ns:
                self._node_leases[n].add(lid)

    def placements(self) -> Mapping[str, tuple[str, ...]]:
        return MappingProxyType(self._lease_nodes)

    # -- simulation extras (not part of PoolBackend) ------------------------------------

    @property
    def now(self) -> float:
        """The latest ``now`` any call has brought the pool to (-inf before the first)."""
        return self._now

    def fail(self, node: str, now: float, repair_after_s: float | None = None) -> None:
        """Lose ``node`` at ``now`` (reported as NodeLost); it comes back on, reported as
        NodeReady, after ``repair_after_s`` if given. Its leases stay placed on their other
        nodes until the engine's revokes unplace them."""
        (name,) = self._known([node])
        if repair_after_s is not None and not (
            math.isfinite(repair_after_s) and repair_after_s >= 0
        ):
            raise BackendError(f"repair_after_s must be a finite number >= 0, got {repair_after_s}")
        self._advance(now)
        if self._state[name] is NodeState.DOWN:
            raise BackendError(f"node {name!r} is already down")
        self._ready_at.pop(name, None)
        for lease_id in sorted(self._node_leases[name]):
            self._lease_nodes[lease_id] = tuple(n for n in self._lease_nodes[lease_id] if n != name)
        self._node_leases[name].clear()
        self._state[name] = NodeState.DOWN
        self._due.append(NodeLost(at=now, node=name))
        if repair_after_s is not None:
            self._repair_at[name] = now + repair_after_s

    # -- internals ----------------------------------------------------------------------

    def _known(self, nodes: Iterable[str]) -> tuple[str, ...]:
        return check_nodes(nodes, self._state)

    def _advance(self, now: float) -> None:
        self._now = check_clock(now, self._now)
        fired = [(t, n, "boot") for n, t in self._ready_at.items() if t <= now]
        fired += [(t, n, "repair") for n, t in self._repair_at.items() if t <= now]
        # Sorted by (time, name) so that the event order never depends on call history.
        for t, n, kind in sorted(fired):
            (self._ready_at if kind == "boot" else self._repair_at).pop(n)
            self._state[n] = NodeState.ON
            self._due.append(NodeReady(at=t, node=n))
        if fired:
            self._due.sort(key=lambda e: e.at)
