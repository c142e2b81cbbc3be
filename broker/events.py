"""Inputs to the engine. Every event carries the time ``at`` it happens (seconds, injected).

The engine first advances its clock to ``at`` (firing any timers due), then applies the
event. Events are what the journal replays; decisions are derived from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from bursar.broker.elastic import Intent
from bursar.broker.envelope import CampaignSpec, LeaseClass
from bursar.broker.policy import PolicySpec
from bursar.broker.shape import Shape


@dataclass(frozen=True, slots=True)
class Event:
    kind: ClassVar[str] = "event"
    at: float


@dataclass(frozen=True, slots=True)
class CreateCampaign(Event):
    kind: ClassVar[str] = "create_campaign"
    spec: CampaignSpec


@dataclass(frozen=True, slots=True)
class UpdateCampaign(Event):
    """Replace a campaign's envelope, class or preemptible flag; its leases stay."""

    kind: ClassVar[str] = "update_campaign"
    spec: CampaignSpec


@dataclass(frozen=True, slots=True)
class RequestLease(Event):
    """Ask for ``size`` (placed dimensions) for ``duration_s`` seconds.

    ``blocking`` requests that cannot be granted now are queued; non-blocking ones are
    rejected with a reason and a retry-after. The engine numbers every request (``L1``,
    ``L2``, ...); a grant keeps its request's id as the lease id. ``lease_class`` defaults to the campaign's
    class and may not be higher than it.
    """

    kind: ClassVar[str] = "request_lease"
    campaign: str
    size: Mapping[str, float]
    duration_s: float
    blocking: bool = True
    lease_class: LeaseClass | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    idempotency_key: str = field(default="", metadata={"omit_default": True})
    """The client's key for this request ("" for none): a second request of the campaign
    with the same key is refused, since it is a retry of the first (the service answers
    such a retry with the first one's outcome without applying anything)."""
    shape: Shape | None = field(default=None, metadata={"omit_default": True})
    """How the lease may be cut into node pieces (``broker/shape.py``); None: any split
    that keeps the size's ratios. With ``nodes`` x ``per_node`` or ``exclusive`` the size
    may be left empty: the shape gives it."""
    intent: Intent | None = field(default=None, metadata={"omit_default": True})
    """Elastic and deadline-aware (``broker/elastic.py``): granted at ``intent.min`` (the
    size is then empty or equal to it), grown and shrunk by the allocator; None: a lease
    of a fixed size."""


@dataclass(frozen=True, slots=True)
class CancelRequest(Event):
    """Withdraw a queued request (a blocking Acquire whose deadline passed, or a client gone)."""

    kind: ClassVar[str] = "cancel_request"
    request_id: str
    also: tuple[str, ...] = field(default=(), metadata={"omit_default": True})
    """More queued requests withdrawn in the same step (no admission pass in between, so
    withdrawing one cannot grant the next); omitted from the journal when empty."""


@dataclass(frozen=True, slots=True)
class Renew(Event):
    """Extend a lease so that it ends no earlier than ``at + duration_s``."""

    kind: ClassVar[str] = "renew"
    lease_id: str
    duration_s: float


@dataclass(frozen=True, slots=True)
class Release(Event):
    kind: ClassVar[str] = "release"
    lease_id: str


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """Advance the clock to ``at``: fire expiries, revocations and wake-ups due by then."""

    kind: ClassVar[str] = "tick"


@dataclass(frozen=True, slots=True)
class NodeReady(Event):
    """The backend reports a booting node is up."""

    kind: ClassVar[str] = "node_ready"
    node: str


@dataclass(frozen=True, slots=True)
class NodeLost(Event):
    """The backend reports a node gone (failure, admin drain): its leases are revoked."""

    kind: ClassVar[str] = "node_lost"
    node: str


@dataclass(frozen=True, slots=True)
class LeaseLost(Event):
    """One lease's resources are gone while its nodes stay up: the backend reports it (a
    Slurm allocation cancelled behind the broker's back, or one that could not be made), or
    an operator revokes the lease by hand (Admin.RevokeLease). The lease is revoked with
    ``cause``. A lease that has already ended is left alone."""

    kind: ClassVar[str] = "lease_lost"
    lease_id: str
    cause: str


@dataclass(frozen=True, slots=True)
class AllocationReady(Event):
    """The backend reports a lease's allocation made (a Slurm job running on its nodes):
    ``allocation`` says how to run inside it (the backend's own keys: job id, ...). Nothing
    in the lease's state changes; the engine records it so that the holder hears of it in
    journal order. A lease that has already ended is left alone."""

    kind: ClassVar[str] = "allocation_ready"
    lease_id: str
    allocation: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Meter(Event):
    """Ask to consume ``amount`` unit-seconds of a rate dimension (MB for fs_bw, tokens for
    inference)."""

    kind: ClassVar[str] = "meter"
    campaign: str
    dim: str
    amount: float


@dataclass(frozen=True, slots=True)
class ApplyPolicy(Event):
    """Put ``policy`` in force from this point of the journal on (an operator's policy
    change, ``bursar policy apply``). Journaled like any input, so a replay changes policy
    at the same entry and decides as the broker did. Which settings may change on a live
    broker, and what happens to what is under way, is ``broker/policy_change.py``."""

    kind: ClassVar[str] = "apply_policy"
    policy: PolicySpec


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        CreateCampaign,
        UpdateCampaign,
        RequestLease,
        CancelRequest,
        Renew,
        Release,
        Tick,
        NodeReady,
        NodeLost,
        LeaseLost,
        AllocationReady,
        Meter,
        ApplyPolicy,
    )
}
