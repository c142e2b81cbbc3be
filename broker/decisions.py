"""Outputs of the engine: typed decisions, each with the rule inputs that produced it.

``inputs`` records what the rule looked at (class rank, fair-share usage, token state, pool state)
so that an auditor can read why, and re-derive the same decision from the events.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bursar.broker.reasons import Reason


class LeasePath(enum.Enum):
    """How a grant is served, cheapest first (the wire's LeasePath)."""

    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    WARM = "warm"
    """Idle powered capacity: the lease is active at once."""
    RECLAIM = "reclaim"
    """Preemptible leases are warned and revoked after the grace period; active then."""
    COLD = "cold"
    """Cold nodes are booted; active once they report ready (about the boot latency)."""


@dataclass(frozen=True, slots=True)
class Decision:
    kind: ClassVar[str] = "decision"
    at: float


@dataclass(frozen=True, slots=True)
class Granted(Decision):
    kind: ClassVar[str] = "grant"
    lease_id: str
    campaign: str
    size: Mapping[str, float]
    path: LeasePath
    starts_at: float
    expires_at: float
    tokens: float
    """Bucket tokens (unit-seconds, primary dimension) prepaid for the above-R part."""
    price: float
    credits: float
    nodes: tuple[str, ...]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    pieces: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Node name → units per dimension of the lease on that node (what a backend sizes an
    allocation by). Empty in journals written before it was recorded."""


@dataclass(frozen=True, slots=True)
class Queued(Decision):
    kind: ClassVar[str] = "queue"
    request_id: str
    campaign: str
    reason: Reason
    estimated_wait_s: float
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rejected(Decision):
    """A non-blocking request (or a renewal) that cannot be served now."""

    kind: ClassVar[str] = "reject"
    request_id: str
    campaign: str
    reason: Reason
    retry_after_s: float
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cancelled(Decision):
    kind: ClassVar[str] = "cancelled"
    request_id: str
    campaign: str


@dataclass(frozen=True, slots=True)
class Activated(Decision):
    """A reclaim- or cold-path lease whose resources are now usable."""

    kind: ClassVar[str] = "activate"
    lease_id: str
    campaign: str
    nodes: tuple[str, ...]
    pieces: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Node name → units per dimension of the lease on that node, as on Granted."""


@dataclass(frozen=True, slots=True)
class PreemptWarned(Decision):
    kind: ClassVar[str] = "preempt_warning"
    lease_id: str
    campaign: str
    deadline: float
    for_request: str


@dataclass(frozen=True, slots=True)
class Revoked(Decision):
    kind: ClassVar[str] = "revoke"
    lease_id: str
    campaign: str
    cause: str
    refund_tokens: float
    refund_credits: float


@dataclass(frozen=True, slots=True)
class Expired(Decision):
    kind: ClassVar[str] = "expire"
    lease_id: str
    campaign: str


@dataclass(frozen=True, slots=True)
class Released(Decision):
    kind: ClassVar[str] = "release"
    lease_id: str
    campaign: str
    refund_tokens: float
    refund_credits: float


@dataclass(frozen=True, slots=True)
class Renewed(Decision):
    kind: ClassVar[str] = "renew"
    lease_id: str
    campaign: str
    expires_at: float
    tokens: float
    credits: float
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Metered(Decision):
    kind: ClassVar[str] = "meter"
    campaign: str
    dim: str
    requested: float
    granted: float
    wait_s: float
    """How long until the rest (requested - granted) can be granted at the sustained rate."""
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoweredOn(Decision):
    kind: ClassVar[str] = "power_on"
    nodes: tuple[str, ...]
    ready_by: float


@dataclass(frozen=True, slots=True)
class PoweredOff(Decision):
    """Idle nodes not needed for the warm reserve or headroom go cold."""

    kind: ClassVar[str] = "power_off"
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Allocated(Decision):
    """A lease's allocation on the backend is ready: how to run inside it."""

    kind: ClassVar[str] = "allocated"
    lease_id: str
    campaign: str
    allocation: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Resized(Decision):
    """An elastic lease grew (at once, from spare warm capacity) or shrank (at the deadline
    of its ResizeWarned). ``size`` is the new total; ``delta`` what changed (negative when
    shrunk); ``tokens``/``credits`` charged for what it grew by (refunds are negative);
    ``inputs`` the allocator's view (units, slack, risk, marginal utility, mode)."""

    kind: ClassVar[str] = "resize"
    lease_id: str
    campaign: str
    size: Mapping[str, float]
    delta: Mapping[str, float]
    mode: str
    tokens: float
    credits: float
    nodes: tuple[str, ...]
    pieces: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ResizeWarned(Decision):
    """An elastic lease will shrink to ``to`` at ``deadline`` (the grace period): the holder
    drains what it loses before then. ``for_request`` names the waiting request the units
    go to, or is empty when they go to another elastic lease (``inputs`` says which)."""

    kind: ClassVar[str] = "resize_warning"
    lease_id: str
    campaign: str
    deadline: float
    to: Mapping[str, float]
    for_request: str
    inputs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CampaignSet(Decision):
    """A campaign created or updated (with the envelope now in force)."""

    kind: ClassVar[str] = "campaign"
    campaign: str
    created: bool


@dataclass(frozen=True, slots=True)
class PolicySet(Decision):
    """A new policy is in force (``events.ApplyPolicy``): ``changes`` maps each setting
    that changed (dotted, as ``warm_headroom.gpu``) to its [old, new] value, in the
    journal's spelling of the policy (``specs.spec_to_dict``; None for a key one side
    lacks)."""

    kind: ClassVar[str] = "policy"
    changes: Mapping[str, tuple[Any, Any]]


DECISION_TYPES: dict[str, type[Decision]] = {
    cls.kind: cls
    for cls in (
        Granted,
        Queued,
        Rejected,
        Cancelled,
        Activated,
        PreemptWarned,
        Revoked,
        Expired,
        Released,
        Renewed,
        Metered,
        PoweredOn,
        PoweredOff,
        CampaignSet,
        Allocated,
        Resized,
        ResizeWarned,
        PolicySet,
    )
}
