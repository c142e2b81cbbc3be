"""Typed values of the client API, derived from the wire messages of ``protos/bursar/v1``.

The .proto is the spec and the only place the fields are listed: each type here is a
frozen dataclass *generated from its message's descriptor* (the same fields, in the same
order, with the proto's defaults), and each enum a string enum generated from the proto
enum (its values without their ``PREFIX_``). What the descriptors cannot say is stated
once per type below: a renamed field (``Lease.id`` is ``lease_id`` on the wire), a
default the client fills in, methods. Field by field the conversion is

* ``double``/``string``/``bool``/ints: the value; ``optional`` ones: None when unset;
* enums: the client's enum (``LeaseState.ACTIVE``);
* ``map<string, V>``: a read-only mapping, sorted by key (V converted as here);
* ``repeated``: a tuple;
* a message: its client type (None when unset, where the type says it may be).

Every type has ``from_proto(message)`` and ``to_json()``; those the client sends also
``to_proto()``. Times are seconds since the Unix epoch on the *server's* clock
(``*_at``); durations are seconds (``*_s``); sizes are ``{dimension: units}``. The
meaning of each field is documented in the .proto.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = [
    "BrokerStatus",
    "Campaign",
    "CampaignSpec",
    "CampaignSupply",
    "CreatedCampaign",
    "DecisionKind",
    "DecisionRecord",
    "DimEnvelope",
    "DimSupply",
    "ElasticState",
    "JournalBroker",
    "Lease",
    "LeaseClass",
    "LeaseEvent",
    "LeaseEventKind",
    "LeasePath",
    "LeaseState",
    "MeterResult",
    "PendingRequest",
    "PowerSupply",
    "ReasonCode",
    "Shape",
    "Supply",
    "TimeTo",
    "WhatIfResult",
]


def _frozen(m: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(sorted(m.items())))


_EMPTY: Mapping[str, Any] = MappingProxyType({})

# ---------------------------------------------------------------------------------------
# Enums


class _ProtoEnum(enum.StrEnum):
    """A string enum generated from a proto enum whose values are ``PREFIX_NAME``."""

    @classmethod
    def _wire(cls) -> tuple[EnumDescriptor, str]:
        return _ENUM_WIRE[cls]

    @classmethod
    def from_proto(cls, value: int, proto_enum: object = None) -> Any:
        """The member for the wire value ``value`` (``proto_enum``: accepted, unused; the
        enum knows its proto enum)."""
        desc, prefix = cls._wire()
        return cls(desc.values_by_number[value].name.removeprefix(prefix))

    def to_proto(self, proto_enum: object = None) -> int:
        desc, prefix = type(self)._wire()
        return desc.values_by_name[prefix + self.value].number


_ENUM_WIRE: dict[type[_ProtoEnum], tuple[EnumDescriptor, str]] = {}
_ENUM_BY_PROTO: dict[str, type[_ProtoEnum]] = {}


def _enum(base: type[_ProtoEnum], name: str, desc: EnumDescriptor, prefix: str, doc: str) -> Any:
    members = [(v.name.removeprefix(prefix),) * 2 for v in desc.values]
    cls = base(name, members, module=__name__, qualname=name)  # type: ignore[call-overload]
    cls.__doc__ = doc
    _ENUM_WIRE[cls] = (desc, prefix)
    _ENUM_BY_PROTO[desc.full_name] = cls
    return cls


class _LeaseStateBase(_ProtoEnum):
    @property
    def live(self) -> bool:
        return self.value in ("STARTING", "ACTIVE", "PREEMPTING")

    @property
    def ended(self) -> bool:
        return self.value in ("RELEASED", "EXPIRED", "REVOKED")


class _LeaseClassBase(_ProtoEnum):
    @classmethod
    def parse(cls, value: Any) -> Any:
        """``"batch"``, ``"BATCH"``, a LeaseClass or None (UNSPECIFIED)."""
        if value is None:
            return cls("UNSPECIFIED")
        if isinstance(value, cls):
            return value
        try:
            return cls(value.upper())
        except ValueError:
            allowed = ", ".join(c.value.lower() for c in cls if c.value != "UNSPECIFIED")
            raise ValueError(f"unknown lease class {value!r}; allowed: {allowed}") from None


class _LeaseEventKindBase(_ProtoEnum):
    @property
    def ends_lease(self) -> bool:
        return self.value in ("REVOKED", "EXPIRED", "RELEASED")


LeaseState = _enum(
    _LeaseStateBase,
    "LeaseState",
    pb.LeaseState.DESCRIPTOR,
    "LEASE_STATE_",
    """Where a lease is in its life cycle (``bursar.v1.LeaseState``): STARTING (granted;
    usable from ``starts_at``), ACTIVE (usable; renew before ``expires_at``), PREEMPTING
    (warned: drain now; revoked at ``preempt_deadline``), then RELEASED, EXPIRED or
    REVOKED. ``live`` and ``ended`` tell the two groups apart.""",
)
LeasePath = _enum(
    _ProtoEnum,
    "LeasePath",
    pb.LeasePath.DESCRIPTOR,
    "LEASE_PATH_",
    """How a grant was served (``bursar.v1.LeasePath``): WARM, RECLAIM or COLD;
    UNSPECIFIED for an ended lease the server no longer describes in full.""",
)
LeaseClass = _enum(
    _LeaseClassBase,
    "LeaseClass",
    pb.LeaseClass.DESCRIPTOR,
    "LEASE_CLASS_",
    """Admission class (``bursar.v1.LeaseClass``); a higher class is considered first.
    ``LeaseClass.parse("batch")`` accepts any case.""",
)
LeaseEventKind = _enum(
    _LeaseEventKindBase,
    "LeaseEventKind",
    pb.LeaseEventKind.DESCRIPTOR,
    "LEASE_EVENT_KIND_",
    """What happened to a lease (``bursar.v1.LeaseEventKind``); ``ends_lease`` for
    REVOKED, EXPIRED and RELEASED.""",
)
DecisionKind = _enum(
    _ProtoEnum,
    "DecisionKind",
    pb.DecisionKind.DESCRIPTOR,
    "DECISION_KIND_",
    """What the broker decided (``bursar.v1.DecisionKind``): GRANT, QUEUE, REJECT,
    PREEMPT_WARNING, CAMPAIGN, ...""",
)
ReasonCode = _enum(
    _ProtoEnum,
    "ReasonCode",
    pb.ReasonCode.DESCRIPTOR,
    "REASON_",
    """Why a request waits or is refused (``bursar.v1.ReasonCode``): POOL_FULL,
    ABOVE_BURST, BUCKET_EMPTY, ...; UNSPECIFIED where there is no reason.""",
)


# ---------------------------------------------------------------------------------------
# Messages


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a client type adds to its message's descriptor."""

    desc: Descriptor
    rename: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Wire field name -> attribute name."""
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Attribute -> default, where the proto's is not the client's."""
    optional: frozenset[str] = frozenset()
    """Attributes (message fields, or scalars the client reads as absent) that are None
    when unset."""
    hidden: frozenset[str] = frozenset()
    """Attributes left out of ``repr`` (secrets)."""
    adjust: Callable[[dict[str, Any]], None] | None = None
    """Fix up the converted values before construction (``from_proto`` only)."""


class _Message:
    """Conversion shared by every generated type; ``_shape`` says which message."""

    __slots__ = ()
    _shape: ClassVar[_Shape]
    _fields: ClassVar[tuple[tuple[FieldDescriptor, str], ...]]

    @classmethod
    def from_proto(cls, m: Message) -> Any:
        shape = cls._shape
        values = {attr: _from_wire(fd, m, attr in shape.optional) for fd, attr in cls._fields}
        if shape.adjust is not None:
            shape.adjust(values)
        return cls(**values)

    def to_proto(self) -> Any:
        out = message_factory.GetMessageClass(self._shape.desc)()
        for fd, attr in self._fields:
            _to_wire(fd, out, getattr(self, attr))
        return out

    def to_json(self) -> dict[str, Any]:
        return {attr: _json(getattr(self, attr)) for _, attr in self._fields}


_TYPE_BY_PROTO: dict[str, type[_Message]] = {}


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def _one(fd: FieldDescriptor, v: Any) -> Any:
    """One wire value (not a container) as the client's."""
    if fd.enum_type is not None:
        return _ENUM_BY_PROTO[fd.enum_type.full_name].from_proto(v)
    if fd.message_type is not None:
        return _TYPE_BY_PROTO[fd.message_type.full_name].from_proto(v)
    return v


def _from_wire(fd: FieldDescriptor, m: Message, optional: bool) -> Any:
    v = getattr(m, fd.name)
    if _is_map(fd):
        value_fd = fd.message_type.fields_by_name["value"]
        return _frozen({k: _one(value_fd, x) for k, x in v.items()})
    if fd.is_repeated:
        return tuple(_one(fd, x) for x in v)
    if (optional or fd.message_type is None) and fd.has_presence and not m.HasField(fd.name):
        return None
    return _one(fd, v)


def _wire_one(fd: FieldDescriptor, v: Any) -> Any:
    if fd.enum_type is not None:
        cls = _ENUM_BY_PROTO[fd.enum_type.full_name]
        return (cls.parse(v) if hasattr(cls, "parse") else cls(v)).to_proto()
    return v


def _to_wire(fd: FieldDescriptor, out: Message, v: Any) -> None:
    if v is None:
        return
    if _is_map(fd):
        value_fd = fd.message_type.fields_by_name["value"]
        target = getattr(out, fd.name)
        for k, x in v.items():
            if value_fd.message_type is not None:
                target[k].CopyFrom(x.to_proto())
            else:
                target[k] = _wire_one(value_fd, x)
    elif fd.is_repeated:
        target = getattr(out, fd.name)
        for x in v:
            if fd.message_type is not None:
                target.add().CopyFrom(x.to_proto())
            else:
                target.append(_wire_one(fd, x))
    elif fd.message_type is not None:
        getattr(out, fd.name).CopyFrom(v.to_proto())
    else:
        setattr(out, fd.name, _wire_one(fd, v))


def _json(v: Any) -> Any:
    # JSON has no infinity: an unlimited bucket (inf) is null.
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, _Message):
        return v.to_json()
    if isinstance(v, Mapping):
        return {k: _json(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_json(x) for x in v]
    return v


_SCALAR_TYPES = {
    FieldDescriptor.CPPTYPE_DOUBLE: float,
    FieldDescriptor.CPPTYPE_FLOAT: float,
    FieldDescriptor.CPPTYPE_BOOL: bool,
    FieldDescriptor.CPPTYPE_STRING: str,
}


def _field(fd: FieldDescriptor, shape: _Shape, attr: str) -> tuple[str, Any, Any]:
    """``(name, annotation, dataclasses.field)`` for one wire field."""
    optional = attr in shape.optional or (fd.message_type is None and fd.has_presence)
    if _is_map(fd):
        ann: Any = Mapping[str, Any]
        spec = dataclasses.field(default_factory=lambda: _EMPTY)
    elif fd.is_repeated:
        ann = tuple
        spec = dataclasses.field(default=())
    elif optional:
        ann = Any
        spec = dataclasses.field(default=None)
    elif fd.enum_type is not None:
        cls = _ENUM_BY_PROTO[fd.enum_type.full_name]
        ann = cls
        spec = dataclasses.field(default=cls.from_proto(0))
    elif fd.message_type is not None:
        nested = _TYPE_BY_PROTO[fd.message_type.full_name]
        ann = nested
        spec = dataclasses.field(default_factory=nested)
    else:
        ann = _SCALAR_TYPES.get(fd.cpp_type, int)
        spec = dataclasses.field(default=fd.default_value)
    if attr in shape.defaults:
        spec = dataclasses.field(default=shape.defaults[attr])
    if attr in shape.hidden:
        spec.repr = False
    return attr, ann, spec


def _message(base: type[_Message], name: str, shape: _Shape, doc: str) -> Any:
    fields = tuple((fd, shape.rename.get(fd.name, fd.name)) for fd in shape.desc.fields)
    cls = dataclasses.make_dataclass(
        name,
        [_field(fd, shape, attr) for fd, attr in fields],
        bases=(base,),
        namespace={"__doc__": doc},
        frozen=True,
        slots=True,
    )
    cls.__module__ = __name__
    cls.__qualname__ = name
    cls._shape = shape
    cls._fields = fields
    _TYPE_BY_PROTO[shape.desc.full_name] = cls
    return cls


# Leases


class _LeaseBase(_Message):
    __slots__ = ()

    @property
    def live(self) -> bool:
        return self.state.live  # type: ignore[attr-defined, no-any-return]

    @property
    def ended(self) -> bool:
        return self.state.ended  # type: ignore[attr-defined, no-any-return]


ElasticState = _message(
    _Message,
    "ElasticState",
    _Shape(pb.ElasticState.DESCRIPTOR, optional=frozenset({"resize_deadline"})),
    """An elastic lease as the broker's allocator sees it (``bursar.v1.ElasticState``): its
    ``min``/``max``/``step``, the ``units`` of its speedup dimension held, its ``mode``
    (``"full"`` or a degrade mode), ``deadline``, the ``remaining_work`` by the broker's
    model, ``slack_s``, ``risk``, the ``marginal_utility`` of one more step, and while a
    shrink is announced ``resize_deadline`` and ``resize_to`` (else None and empty).""",
)


Lease = _message(
    _LeaseBase,
    "Lease",
    _Shape(pb.Lease.DESCRIPTOR, rename={"lease_id": "id"}, optional=frozenset({"elastic"})),
    """A lease as the broker last described it (``bursar.v1.Lease``; ``lease_id`` is
    ``id`` here). ``size`` holds the units per placed dimension (``{"gpu": 8.0}``);
    ``nodes`` is empty until it is active; ``preempt_deadline`` is set while PREEMPTING
    and ``ended_at`` once it has ended (else None); ``allocation`` says how to run inside
    it on a real resource manager (:func:`bursar.providers.launch.launch_argv`);
    ``elastic`` is the allocator's view of an elastic lease (:class:`ElasticState`), None
    for a lease of a fixed size.""",
)


def _event_adjust(values: dict[str, Any]) -> None:
    # The wire's deadline is 0 but for a warning; the client says "none".
    if values["kind"] not in (LeaseEventKind.PREEMPT_WARNING, LeaseEventKind.RESIZE_WARNING):
        values["deadline"] = None


LeaseEvent = _message(
    _Message,
    "LeaseEvent",
    _Shape(pb.LeaseEvent.DESCRIPTOR, optional=frozenset({"deadline"}), adjust=_event_adjust),
    """One entry of a Watch stream (``bursar.v1.LeaseEvent``): ``kind`` at ``at`` and the
    ``lease`` as of then; ``deadline`` (a PREEMPT_WARNING's revocation time, else None),
    ``cause`` (a REVOKED's), ``for_request`` (whom a warning reclaims for); ``snapshot``
    for events describing the state when a stream (re)opened; ``seq``/``index``: the
    journal position of the decision behind it (0 for a snapshot).""",
)


# Supply, metering, status

Shape = _message(
    _Message,
    "Shape",
    _Shape(pb.Shape.DESCRIPTOR),
    """How a lease may be cut into node pieces (``bursar.v1.Shape``), in Slurm's terms:
    ``nodes`` x ``per_node`` (``--nodes``, ``--gpus-per-node``), ``exclusive`` whole nodes,
    ``cpus_per_gpu`` and ``mem_per_gpu``. The default is total units: any split in which
    every piece keeps the size's ratios.""",
)


def shape_to_proto(
    shape: Any = None,
    nodes: int | None = None,
    per_node: Mapping[str, float] | None = None,
    exclusive: bool = False,
    cpus_per_gpu: float | None = None,
    mem_per_gpu: float | None = None,
) -> Any:
    """The wire shape of an Acquire from a :class:`Shape` or its fields as keywords (not
    both); None when neither is given (total units)."""
    fields = (nodes, per_node, cpus_per_gpu, mem_per_gpu)
    keywords = exclusive or any(f is not None for f in fields)
    if shape is not None and keywords:
        raise ValueError("give a shape or its fields as keywords, not both")
    if shape is None:
        if not keywords:
            return None
        shape = Shape(
            nodes=nodes or 0,
            per_node=dict(per_node or {}),
            exclusive=exclusive,
            cpus_per_gpu=cpus_per_gpu or 0.0,
            mem_per_gpu=mem_per_gpu or 0.0,
        )
    return shape.to_proto()


DimSupply = _message(
    _Message,
    "DimSupply",
    _Shape(pb.DimSupply.DESCRIPTOR),
    "Supply of one placed dimension, in its units (``bursar.v1.DimSupply``).",
)
CampaignSupply = _message(
    _Message,
    "CampaignSupply",
    _Shape(pb.CampaignSupply.DESCRIPTOR),
    """Supply signals about one campaign (``bursar.v1.CampaignSupply``); ``bucket`` in
    unit-seconds per dimension, ``math.inf`` for an unlimited bucket.""",
)


class _TimeToBase(_Message):
    __slots__ = ()

    @property
    def best_s(self) -> float | None:
        """The soonest of the three paths; None if no path can serve it now."""
        times = (self.warm_s, self.reclaim_s, self.cold_s)  # type: ignore[attr-defined]
        present = [t for t in times if t is not None]
        return min(present) if present else None


TimeTo = _message(
    _TimeToBase,
    "TimeTo",
    _Shape(pb.TimeTo.DESCRIPTOR),
    """Expected seconds until ``units`` of ``dim`` are usable on each path
    (``bursar.v1.TimeTo``; None: not on that path now).""",
)
PowerSupply = _message(
    _Message,
    "PowerSupply",
    _Shape(pb.PowerSupply.DESCRIPTOR),
    """The facility's power in watts (``bursar.v1.PowerSupply``): the cap (``math.inf``
    for none), the draw, what is kept for power guarantees, the headroom a lease may add
    now, and the power price (credits per kWh, a signal only).""",
)
Supply = _message(
    _Message,
    "Supply",
    _Shape(pb.Supply.DESCRIPTOR, optional=frozenset({"time_to", "power"})),
    """What the pool can give, how soon, at what price (``bursar.v1.Supply``): ``price``
    in credits per unit-hour of the primary dimension; ``campaigns`` only the caller's
    own for a campaign token, every one for the admin; ``time_to`` when asked for;
    ``power`` while power is leased (None otherwise).""",
)
MeterResult = _message(
    _Message,
    "MeterResult",
    _Shape(pb.MeterResponse.DESCRIPTOR),
    """The answer to a Meter call (``bursar.v1.MeterResponse``): use ``granted`` now; ask
    again for the rest after ``wait_s`` (``math.inf``: no sustained rate there).""",
)
JournalBroker = _message(
    _Message,
    "JournalBroker",
    _Shape(pb.JournalBroker.DESCRIPTOR),
    """One broker on a shared journal as the store knows it (``bursar.v1.JournalBroker``):
    its ``address``, ``role`` (leader, standby, former), the last entry it ``applied``
    and its lag (``lag_entries``, ``lag_s``), as of ``reported_at``.""",
)
BrokerStatus = _message(
    _Message,
    "BrokerStatus",
    _Shape(pb.Status.DESCRIPTOR),
    """The broker's state in a few numbers (``bursar.v1.Status``); ``caller`` is the
    caller as the server sees it: "campaign:NAME" or "admin"; ``role`` the answering
    broker's (leader, standby, single), with the ``leader``, its ``epoch`` and the
    ``brokers`` on a shared journal.""",
)


# Decisions, what-if


class _DecisionRecordBase(_Message):
    __slots__ = ()

    @property
    def details(self) -> dict[str, Any]:
        """The whole decision (rule inputs included), decoded from ``json``."""
        return json.loads(self.json)  # type: ignore[attr-defined, no-any-return]


DecisionRecord = _message(
    _DecisionRecordBase,
    "DecisionRecord",
    _Shape(pb.DecisionRecord.DESCRIPTOR),
    """One decision as the journal records it (``bursar.v1.DecisionRecord``): its
    ``kind`` at ``at``, the ``campaign`` and ``lease_id`` it concerns (empty for pool
    decisions), the ``reason`` of a QUEUE or REJECT, and the whole decision as canonical
    JSON (``json``; decoded: ``details``). ``seq`` is its journal entry (0 for a what-if:
    nothing was journaled).""",
)


class _WhatIfBase(_Message):
    __slots__ = ()

    @property
    def granted(self) -> bool:
        return self.outcome is DecisionKind.GRANT  # type: ignore[attr-defined, no-any-return]


WhatIfResult = _message(
    _WhatIfBase,
    "WhatIfResult",
    _Shape(pb.WhatIfResponse.DESCRIPTOR, optional=frozenset({"lease"})),
    """What the broker would decide now, and has not (``bursar.v1.WhatIfResponse``): the
    ``outcome`` (GRANT, QUEUE or REJECT for an acquire; CAMPAIGN for an envelope), the
    ``lease`` a grant would be (else None), the ``reason`` and ``estimated_wait_s`` of a
    queue (for a refusal: its retry-after), and every ``decisions`` the change would
    cause (a campaign token sees its own campaign's only).""",
)


class _PendingBase(_Message):
    __slots__ = ()

    def same_wait(self, other: Any) -> bool:
        """Whether ``other`` (an earlier reading of the same request) says the same about
        its wait: the same reason, place and reservation, and an expected start within a
        second of it (the estimate is re-made from the clock on every reading)."""
        if other is None:
            return False
        mine = self.queued_at + self.waited_s + self.estimated_wait_s  # type: ignore[attr-defined]
        theirs = other.queued_at + other.waited_s + other.estimated_wait_s
        return bool(
            self.reason is other.reason  # type: ignore[attr-defined]
            and self.position == other.position  # type: ignore[attr-defined]
            and self.reserved_at == other.reserved_at  # type: ignore[attr-defined]
            and abs(mine - theirs) < 1.0
        )


PendingRequest = _message(
    _PendingBase,
    "PendingRequest",
    _Shape(pb.PendingRequest.DESCRIPTOR),
    """A request waiting in the queue (``bursar.v1.PendingRequest``): why it waits
    (``reason``), how long it is expected to wait from now (``estimated_wait_s``), its
    ``position`` in the admission order (1: first), and ``reserved_at`` (seconds since the
    epoch) when it holds a reservation (else None). What :meth:`AsyncBrokerClient.
    list_pending` lists and what an ``on_queued`` callback of ``acquire`` receives.""",
)


# Campaigns (admin)

DimEnvelope = _message(
    _Message,
    "DimEnvelope",
    _Shape(pb.DimEnvelope.DESCRIPTOR),
    """One campaign's envelope in one dimension (``bursar.v1.DimEnvelope``); ``bucket``
    in unit-seconds, None: unlimited.""",
)


def _spec_adjust(values: dict[str, Any]) -> None:
    if values["lease_class"] is LeaseClass.UNSPECIFIED:
        values["lease_class"] = LeaseClass.BATCH  # the server's default class


CampaignSpec = _message(
    _Message,
    "CampaignSpec",
    _Shape(
        pb.CampaignSpec.DESCRIPTOR,
        defaults={"lease_class": LeaseClass.BATCH},
        adjust=_spec_adjust,
    ),
    """A campaign as the admin declares it (``bursar.v1.CampaignSpec``): its envelopes
    per dimension, its class (a LeaseClass or its name; BATCH by default) and whether
    its leases may be preempted.""",
)


class _CampaignBase(_Message):
    __slots__ = ()

    @property
    def name(self) -> str:
        return self.spec.name  # type: ignore[attr-defined, no-any-return]

    def to_json(self) -> dict[str, Any]:
        # The spec's keys at the top level, beside the campaign's state.
        out = _Message.to_json(self)
        return {**out.pop("spec"), **out}


def _campaign_adjust(values: dict[str, Any]) -> None:
    values["token_issued_at"] = values["token_issued_at"] or None  # 0 on the wire: none


Campaign = _message(
    _CampaignBase,
    "Campaign",
    _Shape(
        admin_pb2.Campaign.DESCRIPTOR,
        optional=frozenset({"token_issued_at"}),
        adjust=_campaign_adjust,
    ),
    """A campaign: what the admin declared (``spec``) and where it stands now
    (``bursar.v1.Campaign``); ``token_issued_at`` is None if it has no token.""",
)
CreatedCampaign = _message(
    _Message,
    "CreatedCampaign",
    _Shape(admin_pb2.CreateCampaignResponse.DESCRIPTOR, hidden=frozenset({"token"})),
    "A new campaign and its token (shown only once: store it).",
)
