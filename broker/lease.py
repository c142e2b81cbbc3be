"""The lease life cycle: one state enum, one transition table, and the lease record.

    request ──grant(warm)──────────────► ACTIVE ──release──► RELEASED
       │                                   │  ├──expiry───► EXPIRED
       └─grant(reclaim|cold)─► STARTING ───┘  └──reclaim──► PREEMPTING ──deadline──► REVOKED

A STARTING lease waits for reclaimed capacity (grace period) or booting nodes. Any
non-terminal lease can be released by its holder or revoked when its node is lost.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from bursar.broker import dims
from bursar.broker.decisions import LeasePath
from bursar.broker.envelope import LeaseClass


class LeaseState(enum.Enum):
    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    STARTING = "starting"
    """Granted; its resources become usable at ``starts_at`` (reclaim grace or boot)."""
    ACTIVE = "active"
    """Granted and usable. Renew before ``expires_at`` or it expires."""
    PREEMPTING = "preempting"
    """Warned: drain now; the lease is revoked at ``preempt_deadline``."""
    RELEASED = "released"
    """Ended early by its holder; unused prepaid tokens and credits were refunded."""
    EXPIRED = "expired"
    """Ran to ``expires_at`` without renewal. Expected, not a failure."""
    REVOKED = "revoked"
    """Ended by the broker (reclaimed for another campaign, or its node was lost)."""

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED})

TRANSITIONS: dict[LeaseState, frozenset[LeaseState]] = {
    LeaseState.STARTING: frozenset(
        {LeaseState.ACTIVE, LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED}
    ),
    LeaseState.ACTIVE: frozenset(
        {LeaseState.PREEMPTING, LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED}
    ),
    LeaseState.PREEMPTING: frozenset({LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED}),
    LeaseState.RELEASED: frozenset(),
    LeaseState.EXPIRED: frozenset(),
    LeaseState.REVOKED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A programming error: the engine tried a transition the table forbids."""


@dataclass(slots=True)
class Segment:
    """A prepaid stretch of a lease: tokens per second per placed dim, credits per second."""

    start: float
    end: float
    token_rate: dims.Vec
    credit_rate: float

    def unused(self, t: float) -> float:
        return max(0.0, self.end - max(self.start, t))


@dataclass(slots=True)
class Lease:
    id: str
    campaign: str
    size: dims.Vec
    lease_class: LeaseClass
    preemptible: bool
    path: LeasePath
    granted_at: float
    starts_at: float
    expires_at: float
    state: LeaseState
    pieces: dict[int, dims.Vec] = field(default_factory=dict)
    """Node index → the part of the lease placed there."""
    claims: dict[str, dims.Vec] = field(default_factory=dict)
    """Victim lease id → capacity this lease takes over when the victim ends."""
    waiting_nodes: set[int] = field(default_factory=set)
    """Booting nodes this lease waits for."""
    claimed_by: dict[str, dict[int, dims.Vec]] = field(default_factory=dict)
    """For a PREEMPTING lease: claimant lease id → node index → the part of this lease's
    piece there that the claimant takes over."""
    preempt_deadline: float | None = None
    segments: list[Segment] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def move(self, to: LeaseState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"lease {self.id}: {self.state.value} → {to.value}")
        self.state = to

    @property
    def ready(self) -> bool:
        return not self.claims and not self.waiting_nodes

    def refund(self, t: float) -> tuple[dims.Vec, float]:
        """Unused prepaid tokens (per placed dim) and credits if the lease ends at ``t``."""
        tokens = dims.ZERO
        credits = 0.0
        for s in self.segments:
            u = s.unused(t)
            if u > 0:
                tokens = dims.add(tokens, tuple(r * u for r in s.token_rate))
                credits += s.credit_rate * u
        return tokens, credits

    def truncate(self, t: float) -> None:
        """Drop prepaid time after ``t`` (after a refund)."""
        for s in self.segments:
            s.end = min(s.end, max(s.start, t))


@dataclass(frozen=True, slots=True)
class EndedLease:
    """What is kept of a lease once it has ended: who held what, how and when it ended. The
    engine keeps the newest of these (bounded); nothing else keeps a copy."""

    id: str
    campaign: str
    state: LeaseState
    at: float
    """When it ended."""
    cause: str
    """Why: released, expired, cancelled, reclaimed, node n3 lost, or an operator's reason."""
    size: dims.Vec
    path: LeasePath
    granted_at: float
    starts_at: float
    lease_class: LeaseClass
    preemptible: bool
    labels: dict[str, str]
