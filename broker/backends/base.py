"""The pool backend interface: what the shell around the engine drives to make decisions real.

The engine decides (pure, time injected); a backend carries out the few things that touch
the pool: power nodes on and off, and make an active lease's resources usable on its
nodes. It reports back what the engine must hear (a node is up, a node is gone, a lease's
resources vanished) as engine events. Every method takes the caller's ``now`` because the
same backend code runs under the simulator's virtual clock and under the service's wall
clock.

:class:`PoolBackend` declares everything a backend offers; what a backend has nothing to
say about (preemption warnings, allocation details) has a no-op default, so callers call
it instead of probing for it. Backends never read the engine: what they need to place a
lease (its per-node pieces) comes with the decision.

``apply_decision`` is the one translation from engine decisions to backend calls, so the
simulator and the service cannot drift apart on when a lease is placed. The actuator
(``broker/actuator.py``) is what calls it, inline or from worker threads.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import ClassVar

from bursar.broker.decisions import (
    Activated,
    Decision,
    Expired,
    Granted,
    LeasePath,
    PoweredOff,
    PoweredOn,
    PreemptWarned,
    Released,
    Resized,
    Revoked,
)
from bursar.broker.errors import BursarError
from bursar.broker.events import Event
from bursar.broker.pool import NodeState

__all__ = [
    "NO_PIECES",
    "BackendError",
    "NodeState",
    "Pieces",
    "PlaceFailed",
    "PoolBackend",
    "active_at_grant",
    "apply_decision",
    "check_clock",
    "check_nodes",
    "placed_by",
]

Pieces = Mapping[str, Mapping[str, float]]
"""A lease's placement: node name → units per dimension on that node (as on Granted and
Activated)."""

NO_PIECES: Pieces = MappingProxyType({})


class BackendError(BursarError, ValueError):
    """A backend call that does not fit the pool's state; it changed nothing but the clock."""


class PlaceFailed(BackendError):
    """The backend could not make a lease's resources usable (Slurm refused the allocation).

    The grant is already journaled, so the lease ends: the actuator reports ``LeaseLost``
    with ``str(exc)`` as the cause."""


class PoolBackend(abc.ABC):
    """What every pool (simulated, Slurm) offers the broker's shell.

    Calls must not move time backwards: ``now`` is non-decreasing across calls.
    """

    slow: ClassVar[bool] = False
    """True if calls may block for long (subprocesses, a remote scheduler): the service
    then drives the backend from worker threads (``ThreadedActuator``), never from its
    event loop. False: calls are bookkeeping and run inline, in the caller's order."""

    resizes: ClassVar[bool] = False
    """True if a placed lease can grow and shrink where it is (``resize``): only such a
    backend serves elastic leases (``AcquireRequest.intent``)."""

    @property
    @abc.abstractmethod
    def boot_latency_s(self) -> float:
        """Seconds from ``start`` until a cold node is ready (what the engine plans with)."""

    @abc.abstractmethod
    def node_states(self) -> Mapping[str, NodeState]:
        """Every node by name, as of the latest call that took ``now``."""

    @abc.abstractmethod
    def placements(self) -> Mapping[str, tuple[str, ...]]:
        """Placed leases and the nodes each sits on."""

    @abc.abstractmethod
    def start(self, nodes: Iterable[str], now: float) -> None:
        """Power cold nodes on; each is reported ready (NodeReady) once it is up."""

    @abc.abstractmethod
    def stop(self, nodes: Iterable[str], now: float) -> None:
        """Power nodes off (a booting node's boot is abandoned). Nodes holding leases refuse."""

    @abc.abstractmethod
    def place(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        """Make an active lease's resources usable on ``nodes`` (workers, allocations);
        ``pieces`` says how much of each node is the lease's. Raises :class:`PlaceFailed`
        if the resources cannot be had."""

    @abc.abstractmethod
    def unplace(self, lease_id: str, now: float) -> None:
        """Take a lease off its nodes; a lease that is not placed is ignored."""

    @abc.abstractmethod
    def adopt(
        self,
        nodes: Mapping[str, tuple[NodeState, float | None]],
        placements: Mapping[str, tuple[str, ...]],
        now: float,
    ) -> None:
        """After a restart, take on the state the journal says the pool is in: each node's
        state (with, for a booting node, when it is due ready) and the nodes of every
        active lease. A simulated pool simply becomes that; a real one reconciles it with
        what is actually running (a new journal has no leases: whatever a real backend finds of
        earlier ones belongs to none). ``Runtime.open`` calls it once, before anything else."""

    @abc.abstractmethod
    def due_events(self, now: float) -> list[Event]:
        """Events for the engine that happened by ``now``, in time order; each once."""

    @abc.abstractmethod
    def next_event_time(self) -> float | None:
        """The earliest ``now`` at which ``due_events`` returns something, or None if no event
        is expected. Never earlier than the latest call's ``now``: events already due make it
        that time."""

    def resize(
        self, lease_id: str, nodes: Iterable[str], now: float, pieces: Pieces = NO_PIECES
    ) -> None:
        """An elastic lease now holds ``pieces`` on ``nodes`` (grown, or shrunk at its
        announced deadline). Only a backend with ``resizes`` is asked."""
        raise BackendError(f"{type(self).__name__} cannot resize lease {lease_id!r}")

    def warn(self, lease_id: str, deadline: float, now: float) -> None:  # noqa: B027
        """The engine will reclaim the lease at ``deadline``: tell its workers if the
        backend can (Slurm: signal the allocation). Default: nothing to do."""

    def allocation(self, lease_id: str) -> Mapping[str, str]:
        """What a client needs to run inside the lease's resources (Slurm: ``backend``,
        ``job_id``, ``nodes``... which ``providers.launch.launch_argv`` turns into an srun
        line), or empty: the simulated pool has nothing to add to the lease's nodes."""
        return NO_ALLOCATION


NO_ALLOCATION: Mapping[str, str] = MappingProxyType({})


def active_at_grant(g: Granted) -> bool:
    """Whether a grant's lease is active with the grant: the warm path. A reclaim or cold
    grant is active only with its Activated, even when it starts at the same instant (a
    zero grace period or boot latency): it still waits for its victims to end or its
    nodes to report ready, and is placed then, once."""
    return g.path is LeasePath.WARM


def placed_by(decision: Decision) -> str | None:
    """The lease a decision places on its nodes, if it places one: a grant that is active
    at once (warm path), or the activation of one that waited for a grace period or a
    boot."""
    if isinstance(decision, Granted):
        return decision.lease_id if active_at_grant(decision) else None
    if isinstance(decision, Activated):
        return decision.lease_id
    return None


def apply_decision(backend: PoolBackend, decision: Decision, now: float | None = None) -> None:
    """Carry out the backend side of one engine decision (others need nothing from it).

    A grant that starts at once (warm path) is placed with its grant; one that waits for a
    grace period or a boot is placed when the engine activates it, on the nodes named then,
    each with the piece the decision gives it. ``now`` defaults to the decision's time (a
    worker thread that runs behind passes the time it acts at).
    """
    at = decision.at if now is None else now
    if isinstance(decision, PoweredOn):
        backend.start(decision.nodes, at)
    elif isinstance(decision, PoweredOff):
        backend.stop(decision.nodes, at)
    elif isinstance(decision, Granted | Activated):
        if placed_by(decision) is not None:
            backend.place(decision.lease_id, decision.nodes, at, decision.pieces)
    elif isinstance(decision, Revoked | Expired | Released):
        backend.unplace(decision.lease_id, at)
    elif isinstance(decision, PreemptWarned):
        backend.warn(decision.lease_id, decision.deadline, at)
    elif isinstance(decision, Resized):
        backend.resize(decision.lease_id, decision.nodes, at, decision.pieces)


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
