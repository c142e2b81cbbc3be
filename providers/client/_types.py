"""Typed values of the client API, converted from (and, for campaign specs, to) the wire
messages of ``protos/bursar/v1``. The .proto is the spec; these are its Python edge:
frozen dataclasses and string enums, so that callers never handle proto messages.

Times are seconds since the Unix epoch on the *server's* clock (``*_at``); durations are
seconds (``*_s``); sizes are ``{dimension: units}``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = [
    "BrokerStatus",
    "Campaign",
    "CampaignSpec",
    "CampaignSupply",
    "CreatedCampaign",
    "DimEnvelope",
    "DimSupply",
    "Lease",
    "LeaseClass",
    "LeaseEvent",
    "LeaseEventKind",
    "LeasePath",
    "LeaseState",
    "MeterResult",
    "Supply",
    "TimeTo",
]


def _frozen(m: Mapping[str, float] | Mapping[str, str]) -> Mapping:  # type: ignore[type-arg]
    return MappingProxyType(dict(sorted(m.items())))


class _ProtoEnum(enum.StrEnum):
    """A string enum mirroring a proto enum whose values are ``PREFIX_NAME``."""

    @classmethod
    def _prefix(cls) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def from_proto(cls, value: int, proto_enum: object) -> _ProtoEnum:
        name = proto_enum.Name(value).removeprefix(cls._prefix())  # type: ignore[attr-defined]
        return cls(name)

    def to_proto(self, proto_enum: object) -> int:
        return proto_enum.Value(self._prefix() + self.value)  # type: ignore[attr-defined]


class LeaseState(_ProtoEnum):
    """Where a lease is in its life cycle (``bursar.v1.LeaseState``)."""

    UNSPECIFIED = "UNSPECIFIED"
    STARTING = "STARTING"
    """Granted; usable from ``starts_at`` (reclaim grace or node boot)."""
    ACTIVE = "ACTIVE"
    """Granted and usable; renew before ``expires_at``."""
    PREEMPTING = "PREEMPTING"
    """Warned: drain now; revoked at ``preempt_deadline``."""
    RELEASED = "RELEASED"
    EXPIRED = "EXPIRED"
    REVOKED = "REVOKED"

    @classmethod
    def _prefix(cls) -> str:
        return "LEASE_STATE_"

    @property
    def live(self) -> bool:
        return self in _LIVE

    @property
    def ended(self) -> bool:
        return self in _ENDED


_LIVE = frozenset({LeaseState.STARTING, LeaseState.ACTIVE, LeaseState.PREEMPTING})
_ENDED = frozenset({LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED})


class LeasePath(_ProtoEnum):
    """How a grant was served (``bursar.v1.LeasePath``); UNSPECIFIED for an ended lease
    the server no longer describes in full."""

    UNSPECIFIED = "UNSPECIFIED"
    WARM = "WARM"
    RECLAIM = "RECLAIM"
    COLD = "COLD"

    @classmethod
    def _prefix(cls) -> str:
        return "LEASE_PATH_"


class LeaseClass(_ProtoEnum):
    """Admission class (``bursar.v1.LeaseClass``); a higher class is considered first."""

    UNSPECIFIED = "UNSPECIFIED"
    INTERACTIVE = "INTERACTIVE"
    BATCH = "BATCH"
    OPPORTUNISTIC = "OPPORTUNISTIC"

    @classmethod
    def _prefix(cls) -> str:
        return "LEASE_CLASS_"

    @classmethod
    def parse(cls, value: LeaseClass | str | None) -> LeaseClass:
        """``"batch"``, ``"BATCH"``, a LeaseClass or None (UNSPECIFIED)."""
        if value is None:
            return cls.UNSPECIFIED
        if isinstance(value, LeaseClass):
            return value
        try:
            return cls(value.upper())
        except ValueError:
            allowed = ", ".join(c.value.lower() for c in cls if c is not cls.UNSPECIFIED)
            raise ValueError(f"unknown lease class {value!r}; allowed: {allowed}") from None


class LeaseEventKind(_ProtoEnum):
    """What happened to a lease (``bursar.v1.LeaseEventKind``)."""

    UNSPECIFIED = "UNSPECIFIED"
    GRANTED = "GRANTED"
    ACTIVATED = "ACTIVATED"
    PREEMPT_WARNING = "PREEMPT_WARNING"
    RENEWED = "RENEWED"
    REVOKED = "REVOKED"
    EXPIRED = "EXPIRED"
    RELEASED = "RELEASED"

    @classmethod
    def _prefix(cls) -> str:
        return "LEASE_EVENT_KIND_"

    @property
    def ends_lease(self) -> bool:
        return self in (LeaseEventKind.REVOKED, LeaseEventKind.EXPIRED, LeaseEventKind.RELEASED)


# ---------------------------------------------------------------------------------------
# Leases


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease as the broker last described it."""

    id: str
    campaign: str
    state: LeaseState
    size: Mapping[str, float]
    """Units held per placed dimension, e.g. ``{"gpu": 8.0}``."""
    path: LeasePath
    starts_at: float
    """When its resources are (were) usable; later than ``granted_at`` on reclaim/cold."""
    expires_at: float
    """When it expires unless renewed."""
    nodes: tuple[str, ...]
    """The nodes it is placed on; empty until it is active."""
    granted_at: float = 0.0
    lease_class: LeaseClass = LeaseClass.UNSPECIFIED
    preemptible: bool = False
    preempt_deadline: float | None = None
    """Set while PREEMPTING: when it is revoked."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ended_at: float | None = None
    end_cause: str = ""
    """Once ended: why ("released", "expired", "reclaimed", "node node007 lost")."""
    allocation: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """How to run inside the lease's resources on a real resource manager (on Slurm:
    ``job_id``, ``nodes``, ``het_groups``, ``gpus.NODE``...); empty on the simulated pool.
    :func:`bursar.providers.launch.launch_argv` turns it into a command line."""

    @property
    def live(self) -> bool:
        return self.state.live

    @property
    def ended(self) -> bool:
        return self.state.ended

    @classmethod
    def from_proto(cls, m: pb.Lease) -> Lease:
        return cls(
            id=m.lease_id,
            campaign=m.campaign,
            state=LeaseState.from_proto(m.state, pb.LeaseState),  # type: ignore[arg-type]
            size=_frozen(m.size),
            path=LeasePath.from_proto(m.path, pb.LeasePath),  # type: ignore[arg-type]
            starts_at=m.starts_at,
            expires_at=m.expires_at,
            nodes=tuple(m.nodes),
            granted_at=m.granted_at,
            lease_class=LeaseClass.from_proto(m.lease_class, pb.LeaseClass),  # type: ignore[arg-type]
            preemptible=m.preemptible,
            preempt_deadline=m.preempt_deadline if m.HasField("preempt_deadline") else None,
            labels=_frozen(m.labels),
            ended_at=m.ended_at if m.HasField("ended_at") else None,
            end_cause=m.end_cause,
            allocation=_frozen(m.allocation),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "campaign": self.campaign,
            "state": self.state.value,
            "size": dict(self.size),
            "path": self.path.value,
            "lease_class": self.lease_class.value,
            "preemptible": self.preemptible,
            "granted_at": self.granted_at,
            "starts_at": self.starts_at,
            "expires_at": self.expires_at,
            "preempt_deadline": self.preempt_deadline,
            "nodes": list(self.nodes),
            "labels": dict(self.labels),
            "ended_at": self.ended_at,
            "end_cause": self.end_cause,
            "allocation": dict(self.allocation),
        }


@dataclass(frozen=True, slots=True)
class LeaseEvent:
    """One entry of a Watch stream."""

    kind: LeaseEventKind
    at: float
    lease: Lease
    deadline: float | None = None
    """For PREEMPT_WARNING: when the lease is revoked."""
    cause: str = ""
    """For REVOKED: why."""
    snapshot: bool = False
    """True for the events describing the state when a stream (re)opened, rather than a
    change decided while it was open."""
    for_request: str = ""
    """For PREEMPT_WARNING: the request the capacity is reclaimed for."""
    seq: int = 0
    """The journal entry of the decision behind the event (0 for a snapshot event)."""
    index: int = 0
    """The decision's position within that entry."""

    @classmethod
    def from_proto(cls, m: pb.LeaseEvent) -> LeaseEvent:
        kind = LeaseEventKind.from_proto(m.kind, pb.LeaseEventKind)
        deadline = m.deadline if kind is LeaseEventKind.PREEMPT_WARNING else None
        return cls(
            kind=kind,  # type: ignore[arg-type]
            at=m.at,
            lease=Lease.from_proto(m.lease),
            deadline=deadline,
            cause=m.cause,
            snapshot=m.snapshot,
            for_request=m.for_request,
            seq=m.seq,
            index=m.index,
        )

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "at": self.at,
            "lease": self.lease.to_json(),
            "deadline": self.deadline,
            "cause": self.cause,
            "snapshot": self.snapshot,
            "for_request": self.for_request,
            "seq": self.seq,
            "index": self.index,
        }


# ---------------------------------------------------------------------------------------
# Supply, metering, status


@dataclass(frozen=True, slots=True)
class DimSupply:
    """Supply of one placed dimension, in its units."""

    capacity: float
    warm_free: float
    reserve: float
    available_warm: float
    reclaimable: float
    cold: float

    @classmethod
    def from_proto(cls, m: pb.DimSupply) -> DimSupply:
        return cls(m.capacity, m.warm_free, m.reserve, m.available_warm, m.reclaimable, m.cold)


@dataclass(frozen=True, slots=True)
class CampaignSupply:
    """Supply signals about one campaign."""

    held: Mapping[str, float]
    bucket: Mapping[str, float]
    """Unit-seconds per dimension; ``math.inf`` for an unlimited bucket."""
    time_to_empty_s: Mapping[str, float]
    headroom_to_burst: Mapping[str, float]
    unmet_guarantee: Mapping[str, float]
    credits: float
    queued: int

    @classmethod
    def from_proto(cls, m: pb.CampaignSupply) -> CampaignSupply:
        return cls(
            held=_frozen(m.held),
            bucket=_frozen(m.bucket),
            time_to_empty_s=_frozen(m.time_to_empty_s),
            headroom_to_burst=_frozen(m.headroom_to_burst),
            unmet_guarantee=_frozen(m.unmet_guarantee),
            credits=m.credits,
            queued=m.queued,
        )


@dataclass(frozen=True, slots=True)
class TimeTo:
    """Expected seconds until ``units`` of ``dim`` are usable on each path (None: not on
    that path now)."""

    units: float
    dim: str
    warm_s: float | None
    reclaim_s: float | None
    cold_s: float | None

    @classmethod
    def from_proto(cls, m: pb.TimeTo) -> TimeTo:
        def opt(name: str) -> float | None:
            return getattr(m, name) if m.HasField(name) else None

        return cls(m.units, m.dim, opt("warm_s"), opt("reclaim_s"), opt("cold_s"))

    @property
    def best_s(self) -> float | None:
        """The soonest of the three paths; None if no path can serve it now."""
        present = [t for t in (self.warm_s, self.reclaim_s, self.cold_s) if t is not None]
        return min(present) if present else None


@dataclass(frozen=True, slots=True)
class Supply:
    """What the pool can give, how soon, at what price."""

    at: float
    price: float
    """Credits per unit-hour of the primary dimension."""
    pressure: float
    dims: Mapping[str, DimSupply]
    campaigns: Mapping[str, CampaignSupply]
    """Only the caller's own campaign for a campaign token; every one for the admin."""
    grace_s: float
    boot_latency_s: float
    time_to: TimeTo | None = None

    @classmethod
    def from_proto(cls, m: pb.Supply) -> Supply:
        return cls(
            at=m.at,
            price=m.price,
            pressure=m.pressure,
            dims=MappingProxyType({k: DimSupply.from_proto(v) for k, v in sorted(m.dims.items())}),
            campaigns=MappingProxyType(
                {k: CampaignSupply.from_proto(v) for k, v in sorted(m.campaigns.items())}
            ),
            grace_s=m.grace_s,
            boot_latency_s=m.boot_latency_s,
            time_to=TimeTo.from_proto(m.time_to) if m.HasField("time_to") else None,
        )

    def to_json(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return x if math.isfinite(x) else None  # JSON has no infinity: null = unlimited

        return {
            "at": self.at,
            "price": self.price,
            "pressure": self.pressure,
            "grace_s": self.grace_s,
            "boot_latency_s": self.boot_latency_s,
            "dims": {
                d: {
                    "capacity": s.capacity,
                    "warm_free": s.warm_free,
                    "reserve": s.reserve,
                    "available_warm": s.available_warm,
                    "reclaimable": s.reclaimable,
                    "cold": s.cold,
                }
                for d, s in self.dims.items()
            },
            "campaigns": {
                name: {
                    "held": dict(c.held),
                    "bucket": {d: num(v) for d, v in c.bucket.items()},
                    "time_to_empty_s": dict(c.time_to_empty_s),
                    "headroom_to_burst": dict(c.headroom_to_burst),
                    "unmet_guarantee": dict(c.unmet_guarantee),
                    "credits": c.credits,
                    "queued": c.queued,
                }
                for name, c in self.campaigns.items()
            },
            "time_to": None
            if self.time_to is None
            else {
                "units": self.time_to.units,
                "dim": self.time_to.dim,
                "warm_s": self.time_to.warm_s,
                "reclaim_s": self.time_to.reclaim_s,
                "cold_s": self.time_to.cold_s,
            },
        }


@dataclass(frozen=True, slots=True)
class MeterResult:
    """The answer to a Meter call: use ``granted`` now; ask again for the rest after
    ``wait_s`` (``math.inf``: the campaign has no sustained rate in that dimension)."""

    requested: float
    granted: float
    wait_s: float


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """The broker's state in a few numbers."""

    version: str
    now: float
    engine_now: float
    started_at: float
    journal_entries: int
    campaigns: int
    leases: int
    pending: int
    open_streams: int
    caller: str
    """The caller as the server sees it: "campaign:NAME" or "admin"."""

    @classmethod
    def from_proto(cls, m: pb.Status) -> BrokerStatus:
        return cls(
            m.version,
            m.now,
            m.engine_now,
            m.started_at,
            m.journal_entries,
            m.campaigns,
            m.leases,
            m.pending,
            m.open_streams,
            m.caller,
        )


# ---------------------------------------------------------------------------------------
# Campaigns (admin)


@dataclass(frozen=True, slots=True)
class DimEnvelope:
    """One campaign's envelope in one dimension (DESIGN.md §1)."""

    guarantee: float = 0.0
    sustained: float = 0.0
    burst: float = 0.0
    bucket: float | None = None
    """Token bucket capacity in unit-seconds; None: unlimited."""

    @classmethod
    def from_proto(cls, m: pb.DimEnvelope) -> DimEnvelope:
        return cls(m.guarantee, m.sustained, m.burst, m.bucket if m.HasField("bucket") else None)

    def to_proto(self) -> pb.DimEnvelope:
        out = pb.DimEnvelope(guarantee=self.guarantee, sustained=self.sustained, burst=self.burst)
        if self.bucket is not None:
            out.bucket = self.bucket
        return out


@dataclass(frozen=True, slots=True)
class CampaignSpec:
    """A campaign as the admin declares it."""

    name: str
    envelopes: Mapping[str, DimEnvelope]
    lease_class: LeaseClass = LeaseClass.BATCH
    preemptible: bool = False

    @classmethod
    def from_proto(cls, m: pb.CampaignSpec) -> CampaignSpec:
        lc = LeaseClass.from_proto(m.lease_class, pb.LeaseClass)
        return cls(
            name=m.name,
            envelopes=MappingProxyType(
                {d: DimEnvelope.from_proto(e) for d, e in sorted(m.envelopes.items())}
            ),
            lease_class=LeaseClass.BATCH if lc is LeaseClass.UNSPECIFIED else lc,  # type: ignore[arg-type]
            preemptible=m.preemptible,
        )

    def to_proto(self) -> pb.CampaignSpec:
        out = pb.CampaignSpec(
            name=self.name,
            lease_class=LeaseClass.parse(self.lease_class).to_proto(pb.LeaseClass),
            preemptible=self.preemptible,
        )
        for d, e in self.envelopes.items():
            out.envelopes[d].CopyFrom(e.to_proto())
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "lease_class": self.lease_class.value,
            "preemptible": self.preemptible,
            "envelopes": {
                d: {
                    "guarantee": e.guarantee,
                    "sustained": e.sustained,
                    "burst": e.burst,
                    "bucket": e.bucket,
                }
                for d, e in self.envelopes.items()
            },
        }


@dataclass(frozen=True, slots=True)
class Campaign:
    """A campaign: what the admin declared and where it stands now."""

    spec: CampaignSpec
    held: Mapping[str, float]
    bucket: Mapping[str, float]
    """Unit-seconds per dimension; ``math.inf`` for an unlimited bucket."""
    credits: float
    leases: int
    queued: int
    token_issued_at: float | None
    """When its current token was issued; None if it has none."""

    @property
    def name(self) -> str:
        return self.spec.name

    @classmethod
    def from_proto(cls, m: admin_pb2.Campaign) -> Campaign:
        return cls(
            spec=CampaignSpec.from_proto(m.spec),
            held=_frozen(m.held),
            bucket=_frozen(m.bucket),
            credits=m.credits,
            leases=m.leases,
            queued=m.queued,
            token_issued_at=m.token_issued_at or None,
        )

    def to_json(self) -> dict[str, object]:
        return {
            **self.spec.to_json(),
            "held": dict(self.held),
            "bucket": {d: (v if math.isfinite(v) else None) for d, v in self.bucket.items()},
            "credits": self.credits,
            "leases": self.leases,
            "queued": self.queued,
            "token_issued_at": self.token_issued_at,
        }


@dataclass(frozen=True, slots=True)
class CreatedCampaign:
    """A new campaign and its token (shown only once: store it)."""

    campaign: Campaign
    token: str = field(repr=False)
