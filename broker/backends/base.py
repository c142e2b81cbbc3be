"""The pool backend interface: what the shell around the engine drives to make decisions real.

The engine decides (pure, time injected); a backend carries out the few things that touch
the pool: power nodes on and off, and make an active lease's resources usable on its
nodes. It reports back what the engine must hear (a node is up, a node is gone) as engine
events. Every method takes the caller's ``now`` because the same backend code runs under
the simulator's virtual clock and under the service's wall clock.

``apply_decision`` is the one translation from engine decisions to backend calls, so the
simulator and the service cannot drift apart on when a lease is placed.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from bursar.broker.decisions import (
    Activate,
    Decision,
    Expire,
    Grant,
    PowerOff,
    PowerOn,
    PreemptWarning,
    Released,
    Revoke,
)
from bursar.broker.errors import BursarError
from bursar.broker.events import Event

__all__ = [
    "BackendError",
    "NodeState",
    "PoolBackend",
    "apply_decision",
    "check_clock",
    "check_nodes",
]


class NodeState(enum.Enum):
    """A node as the backend sees it (DESIGN.md §1 "Pool")."""

    COLD = "cold"
    """Powered off."""
    BOOTING = "booting"
    """Powered on, not ready yet; becomes warm after the boot latency."""
    WARM = "warm"
    """On and holding no placed lease."""
    LEASED = "leased"
    """On and holding at least one placed lease."""
    DOWN = "down"
    """Lost (failure, drain); the engine has been told with NodeLost."""


class BackendError(BursarError, ValueError):
    """A backend call that does not fit the pool's state; it changed nothing but the clock."""


@runtime_checkable
class PoolBackend(Protocol):
    """What every pool (simulated, this machine, Slurm) offers the broker's shell.

    Calls must not move time backwards: ``now`` is non-decreasing across calls.
    """

    @property
    def boot_latency_s(self) -> float:
        """Seconds from ``start`` until a cold node is ready (what the engine plans with)."""
        ...

    def node_states(self) -> Mapping[str, NodeState]:
        """Every node by name, as of the latest call that took ``now``."""
        ...

    def start(self, nodes: Iterable[str], now: float) -> None:
        """Power cold nodes on; each is reported ready (NodeReady) once it is up."""
        ...

    def stop(self, nodes: Iterable[str], now: float) -> None:
        """Power nodes off (a booting node's boot is abandoned). Nodes holding leases refuse."""
        ...

    def place(self, lease_id: str, nodes: Iterable[str], now: float) -> None:
        """Make an active lease's resources usable on ``nodes`` (workers, allocations)."""
        ...

    def adopt(
        self,
        nodes: Mapping[str, tuple[NodeState, float | None]],
        placements: Mapping[str, tuple[str, ...]],
        now: float,
    ) -> None:
        """After a restart, take on the state the journal says the pool is in: each node's
        state (with, for a booting node, when it is due ready) and the nodes of every
        active lease. A simulated pool simply becomes that; a real one reconciles it with
        what is actually running."""
        ...

    def unplace(self, lease_id: str, now: float) -> None:
        """Take a lease off its nodes; a lease that is not placed is ignored."""
        ...

    def due_events(self, now: float) -> list[Event]:
        """Events for the engine that happened by ``now``, in time order; each once."""
        ...

    def next_event_time(self) -> float | None:
        """The earliest ``now`` at which ``due_events`` returns something, or None if no event
        is expected. Never earlier than the latest call's ``now``: events already due make it
        that time."""
        ...


def apply_decision(backend: PoolBackend, decision: Decision) -> None:
    """Carry out the backend side of one engine decision (others need nothing from it).

    A grant that starts at once (warm path) is placed with its grant; one that waits for a
    grace period or a boot is placed when the engine activates it, on the nodes named then.
    A backend with a ``warn(lease_id, deadline, now)`` method (Slurm: signal the allocation)
    hears of preemption warnings too.
    """
    at = decision.at
    if isinstance(decision, PowerOn):
        backend.start(decision.nodes, at)
    elif isinstance(decision, PowerOff):
        backend.stop(decision.nodes, at)
    elif isinstance(decision, Grant):
        if decision.starts_at <= at:
            backend.place(decision.lease_id, decision.nodes, at)
    elif isinstance(decision, Activate):
        backend.place(decision.lease_id, decision.nodes, at)
    elif isinstance(decision, Revoke | Expire | Released):
        backend.unplace(decision.lease_id, at)
    elif isinstance(decision, PreemptWarning):
        warn = getattr(backend, "warn", None)
        if warn is not None:
            warn(decision.lease_id, decision.deadline, at)


def check_nodes(nodes: Iterable[str], known: Mapping[str, object]) -> tuple[str, ...]:
    """``nodes`` without repeats, in order; BackendError if one is not in ``known``."""
    # A plain str would otherwise be read as a sequence of one-letter node names.
    if isinstance(nodes, str):
        raise BackendError(f"nodes must be a collection of names, got the string {nodes!r}")
    names = tuple(dict.fromkeys(nodes))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BackendError(f"unknown node(s): {', '.join(map(repr, unknown))}")
    return names


def check_clock(now: float, last: float) -> float:
    """``now`` as a float; BackendError if it is not a number or is before ``last``."""
    if not isinstance(now, int | float) or math.isnan(now):
        raise BackendError(f"now must be a number, got {now!r}")
    if now < last:
        raise BackendError(f"time went backwards: {now} after {last}")
    return float(now)
