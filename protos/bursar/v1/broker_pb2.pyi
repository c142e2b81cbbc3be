from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LeaseState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_STATE_UNSPECIFIED: _ClassVar[LeaseState]
    LEASE_STATE_STARTING: _ClassVar[LeaseState]
    LEASE_STATE_ACTIVE: _ClassVar[LeaseState]
    LEASE_STATE_PREEMPTING: _ClassVar[LeaseState]
    LEASE_STATE_RELEASED: _ClassVar[LeaseState]
    LEASE_STATE_EXPIRED: _ClassVar[LeaseState]
    LEASE_STATE_REVOKED: _ClassVar[LeaseState]

class LeasePath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_PATH_UNSPECIFIED: _ClassVar[LeasePath]
    LEASE_PATH_WARM: _ClassVar[LeasePath]
    LEASE_PATH_RECLAIM: _ClassVar[LeasePath]
    LEASE_PATH_COLD: _ClassVar[LeasePath]

class LeaseClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_CLASS_UNSPECIFIED: _ClassVar[LeaseClass]
    LEASE_CLASS_INTERACTIVE: _ClassVar[LeaseClass]
    LEASE_CLASS_BATCH: _ClassVar[LeaseClass]
    LEASE_CLASS_OPPORTUNISTIC: _ClassVar[LeaseClass]

class ReasonCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REASON_UNSPECIFIED: _ClassVar[ReasonCode]
    REASON_ABOVE_BURST: _ClassVar[ReasonCode]
    REASON_BUCKET_EMPTY: _ClassVar[ReasonCode]
    REASON_GUARANTEE_RESERVED: _ClassVar[ReasonCode]
    REASON_POOL_FULL: _ClassVar[ReasonCode]
    REASON_HEAD_OF_LINE: _ClassVar[ReasonCode]
    REASON_LEASE_PREEMPTING: _ClassVar[ReasonCode]
    REASON_DEADLINE_UNREACHABLE: _ClassVar[ReasonCode]

class DecisionKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_KIND_UNSPECIFIED: _ClassVar[DecisionKind]
    DECISION_KIND_GRANT: _ClassVar[DecisionKind]
    DECISION_KIND_QUEUE: _ClassVar[DecisionKind]
    DECISION_KIND_REJECT: _ClassVar[DecisionKind]
    DECISION_KIND_CANCELLED: _ClassVar[DecisionKind]
    DECISION_KIND_ACTIVATE: _ClassVar[DecisionKind]
    DECISION_KIND_PREEMPT_WARNING: _ClassVar[DecisionKind]
    DECISION_KIND_REVOKE: _ClassVar[DecisionKind]
    DECISION_KIND_EXPIRE: _ClassVar[DecisionKind]
    DECISION_KIND_RELEASE: _ClassVar[DecisionKind]
    DECISION_KIND_RENEW: _ClassVar[DecisionKind]
    DECISION_KIND_METER: _ClassVar[DecisionKind]
    DECISION_KIND_POWER_ON: _ClassVar[DecisionKind]
    DECISION_KIND_CAMPAIGN: _ClassVar[DecisionKind]
    DECISION_KIND_POWER_OFF: _ClassVar[DecisionKind]
    DECISION_KIND_ALLOCATED: _ClassVar[DecisionKind]
    DECISION_KIND_RESIZE: _ClassVar[DecisionKind]
    DECISION_KIND_RESIZE_WARNING: _ClassVar[DecisionKind]
    DECISION_KIND_POLICY: _ClassVar[DecisionKind]

class LeaseEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEASE_EVENT_KIND_UNSPECIFIED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_GRANTED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_ACTIVATED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_PREEMPT_WARNING: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_RENEWED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_REVOKED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_EXPIRED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_RELEASED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_ALLOCATED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_RESIZED: _ClassVar[LeaseEventKind]
    LEASE_EVENT_KIND_RESIZE_WARNING: _ClassVar[LeaseEventKind]
LEASE_STATE_UNSPECIFIED: LeaseState
LEASE_STATE_STARTING: LeaseState
LEASE_STATE_ACTIVE: LeaseState
LEASE_STATE_PREEMPTING: LeaseState
LEASE_STATE_RELEASED: LeaseState
LEASE_STATE_EXPIRED: LeaseState
LEASE_STATE_REVOKED: LeaseState
LEASE_PATH_UNSPECIFIED: LeasePath
LEASE_PATH_WARM: LeasePath
LEASE_PATH_RECLAIM: LeasePath
LEASE_PATH_COLD: LeasePath
LEASE_CLASS_UNSPECIFIED: LeaseClass
LEASE_CLASS_INTERACTIVE: LeaseClass
LEASE_CLASS_BATCH: LeaseClass
LEASE_CLASS_OPPORTUNISTIC: LeaseClass
REASON_UNSPECIFIED: ReasonCode
REASON_ABOVE_BURST: ReasonCode
REASON_BUCKET_EMPTY: ReasonCode
REASON_GUARANTEE_RESERVED: ReasonCode
REASON_POOL_FULL: ReasonCode
REASON_HEAD_OF_LINE: ReasonCode
REASON_LEASE_PREEMPTING: ReasonCode
REASON_DEADLINE_UNREACHABLE: ReasonCode
DECISION_KIND_UNSPECIFIED: DecisionKind
DECISION_KIND_GRANT: DecisionKind
DECISION_KIND_QUEUE: DecisionKind
DECISION_KIND_REJECT: DecisionKind
DECISION_KIND_CANCELLED: DecisionKind
DECISION_KIND_ACTIVATE: DecisionKind
DECISION_KIND_PREEMPT_WARNING: DecisionKind
DECISION_KIND_REVOKE: DecisionKind
DECISION_KIND_EXPIRE: DecisionKind
DECISION_KIND_RELEASE: DecisionKind
DECISION_KIND_RENEW: DecisionKind
DECISION_KIND_METER: DecisionKind
DECISION_KIND_POWER_ON: DecisionKind
DECISION_KIND_CAMPAIGN: DecisionKind
DECISION_KIND_POWER_OFF: DecisionKind
DECISION_KIND_ALLOCATED: DecisionKind
DECISION_KIND_RESIZE: DecisionKind
DECISION_KIND_RESIZE_WARNING: DecisionKind
DECISION_KIND_POLICY: DecisionKind
LEASE_EVENT_KIND_UNSPECIFIED: LeaseEventKind
LEASE_EVENT_KIND_GRANTED: LeaseEventKind
LEASE_EVENT_KIND_ACTIVATED: LeaseEventKind
LEASE_EVENT_KIND_PREEMPT_WARNING: LeaseEventKind
LEASE_EVENT_KIND_RENEWED: LeaseEventKind
LEASE_EVENT_KIND_REVOKED: LeaseEventKind
LEASE_EVENT_KIND_EXPIRED: LeaseEventKind
LEASE_EVENT_KIND_RELEASED: LeaseEventKind
LEASE_EVENT_KIND_ALLOCATED: LeaseEventKind
LEASE_EVENT_KIND_RESIZED: LeaseEventKind
LEASE_EVENT_KIND_RESIZE_WARNING: LeaseEventKind

class Lease(_message.Message):
    __slots__ = ("lease_id", "campaign", "state", "size", "path", "lease_class", "preemptible", "granted_at", "starts_at", "expires_at", "preempt_deadline", "nodes", "labels", "ended_at", "end_cause", "allocation", "elastic")
    class SizeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class AllocationEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LEASE_CLASS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTS_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    PREEMPT_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    campaign: str
    state: LeaseState
    size: _containers.ScalarMap[str, float]
    path: LeasePath
    lease_class: LeaseClass
    preemptible: bool
    granted_at: float
    starts_at: float
    expires_at: float
    preempt_deadline: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    ended_at: float
    end_cause: str
    allocation: _containers.ScalarMap[str, str]
    elastic: ElasticState
    def __init__(self, lease_id: _Optional[str] = ..., campaign: _Optional[str] = ..., state: _Optional[_Union[LeaseState, str]] = ..., size: _Optional[_Mapping[str, float]] = ..., path: _Optional[_Union[LeasePath, str]] = ..., lease_class: _Optional[_Union[LeaseClass, str]] = ..., preemptible: _Optional[bool] = ..., granted_at: _Optional[float] = ..., starts_at: _Optional[float] = ..., expires_at: _Optional[float] = ..., preempt_deadline: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., ended_at: _Optional[float] = ..., end_cause: _Optional[str] = ..., allocation: _Optional[_Mapping[str, str]] = ..., elastic: _Optional[_Union[ElasticState, _Mapping]] = ...) -> None: ...

class DimEnvelope(_message.Message):
    __slots__ = ("guarantee", "sustained", "burst", "bucket")
    GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    SUSTAINED_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    guarantee: float
    sustained: float
    burst: float
    bucket: float
    def __init__(self, guarantee: _Optional[float] = ..., sustained: _Optional[float] = ..., burst: _Optional[float] = ..., bucket: _Optional[float] = ...) -> None: ...

class CampaignSpec(_message.Message):
    __slots__ = ("name", "envelopes", "lease_class", "preemptible")
    class EnvelopesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DimEnvelope
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DimEnvelope, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    LEASE_CLASS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    envelopes: _containers.MessageMap[str, DimEnvelope]
    lease_class: LeaseClass
    preemptible: bool
    def __init__(self, name: _Optional[str] = ..., envelopes: _Optional[_Mapping[str, DimEnvelope]] = ..., lease_class: _Optional[_Union[LeaseClass, str]] = ..., preemptible: _Optional[bool] = ...) -> None: ...

class DimSupply(_message.Message):
    __slots__ = ("capacity", "warm_free", "reserve", "available_warm", "reclaimable", "cold", "stranded", "partial_free", "lendable")
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    WARM_FREE_FIELD_NUMBER: _ClassVar[int]
    RESERVE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_WARM_FIELD_NUMBER: _ClassVar[int]
    RECLAIMABLE_FIELD_NUMBER: _ClassVar[int]
    COLD_FIELD_NUMBER: _ClassVar[int]
    STRANDED_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FREE_FIELD_NUMBER: _ClassVar[int]
    LENDABLE_FIELD_NUMBER: _ClassVar[int]
    capacity: float
    warm_free: float
    reserve: float
    available_warm: float
    reclaimable: float
    cold: float
    stranded: float
    partial_free: float
    lendable: float
    def __init__(self, capacity: _Optional[float] = ..., warm_free: _Optional[float] = ..., reserve: _Optional[float] = ..., available_warm: _Optional[float] = ..., reclaimable: _Optional[float] = ..., cold: _Optional[float] = ..., stranded: _Optional[float] = ..., partial_free: _Optional[float] = ..., lendable: _Optional[float] = ...) -> None: ...

class CampaignSupply(_message.Message):
    __slots__ = ("held", "bucket", "time_to_empty_s", "headroom_to_burst", "unmet_guarantee", "credits", "queued")
    class HeldEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class BucketEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class TimeToEmptySEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class HeadroomToBurstEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class UnmetGuaranteeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    HELD_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_EMPTY_S_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_TO_BURST_FIELD_NUMBER: _ClassVar[int]
    UNMET_GUARANTEE_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    held: _containers.ScalarMap[str, float]
    bucket: _containers.ScalarMap[str, float]
    time_to_empty_s: _containers.ScalarMap[str, float]
    headroom_to_burst: _containers.ScalarMap[str, float]
    unmet_guarantee: _containers.ScalarMap[str, float]
    credits: float
    queued: int
    def __init__(self, held: _Optional[_Mapping[str, float]] = ..., bucket: _Optional[_Mapping[str, float]] = ..., time_to_empty_s: _Optional[_Mapping[str, float]] = ..., headroom_to_burst: _Optional[_Mapping[str, float]] = ..., unmet_guarantee: _Optional[_Mapping[str, float]] = ..., credits: _Optional[float] = ..., queued: _Optional[int] = ...) -> None: ...

class TimeTo(_message.Message):
    __slots__ = ("units", "dim", "warm_s", "reclaim_s", "cold_s")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    WARM_S_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_S_FIELD_NUMBER: _ClassVar[int]
    COLD_S_FIELD_NUMBER: _ClassVar[int]
    units: float
    dim: str
    warm_s: float
    reclaim_s: float
    cold_s: float
    def __init__(self, units: _Optional[float] = ..., dim: _Optional[str] = ..., warm_s: _Optional[float] = ..., reclaim_s: _Optional[float] = ..., cold_s: _Optional[float] = ...) -> None: ...

class Supply(_message.Message):
    __slots__ = ("at", "price", "pressure", "dims", "campaigns", "grace_s", "boot_latency_s", "time_to", "power")
    class DimsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DimSupply
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DimSupply, _Mapping]] = ...) -> None: ...
    class CampaignsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: CampaignSupply
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[CampaignSupply, _Mapping]] = ...) -> None: ...
    AT_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    PRESSURE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    BOOT_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIELD_NUMBER: _ClassVar[int]
    POWER_FIELD_NUMBER: _ClassVar[int]
    at: float
    price: float
    pressure: float
    dims: _containers.MessageMap[str, DimSupply]
    campaigns: _containers.MessageMap[str, CampaignSupply]
    grace_s: float
    boot_latency_s: float
    time_to: TimeTo
    power: PowerSupply
    def __init__(self, at: _Optional[float] = ..., price: _Optional[float] = ..., pressure: _Optional[float] = ..., dims: _Optional[_Mapping[str, DimSupply]] = ..., campaigns: _Optional[_Mapping[str, CampaignSupply]] = ..., grace_s: _Optional[float] = ..., boot_latency_s: _Optional[float] = ..., time_to: _Optional[_Union[TimeTo, _Mapping]] = ..., power: _Optional[_Union[PowerSupply, _Mapping]] = ...) -> None: ...

class PowerSupply(_message.Message):
    __slots__ = ("cap_w", "draw_w", "idle_w", "reserved_w", "headroom_w", "reclaimable_w", "price")
    CAP_W_FIELD_NUMBER: _ClassVar[int]
    DRAW_W_FIELD_NUMBER: _ClassVar[int]
    IDLE_W_FIELD_NUMBER: _ClassVar[int]
    RESERVED_W_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_W_FIELD_NUMBER: _ClassVar[int]
    RECLAIMABLE_W_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    cap_w: float
    draw_w: float
    idle_w: float
    reserved_w: float
    headroom_w: float
    reclaimable_w: float
    price: float
    def __init__(self, cap_w: _Optional[float] = ..., draw_w: _Optional[float] = ..., idle_w: _Optional[float] = ..., reserved_w: _Optional[float] = ..., headroom_w: _Optional[float] = ..., reclaimable_w: _Optional[float] = ..., price: _Optional[float] = ...) -> None: ...

class DecisionRecord(_message.Message):
    __slots__ = ("seq", "at", "kind", "campaign", "lease_id", "reason", "json")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    at: float
    kind: DecisionKind
    campaign: str
    lease_id: str
    reason: ReasonCode
    json: str
    def __init__(self, seq: _Optional[int] = ..., at: _Optional[float] = ..., kind: _Optional[_Union[DecisionKind, str]] = ..., campaign: _Optional[str] = ..., lease_id: _Optional[str] = ..., reason: _Optional[_Union[ReasonCode, str]] = ..., json: _Optional[str] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("campaign", "size", "duration_s", "timeout_s", "lease_class", "labels", "idempotency_key", "shape", "intent")
    class SizeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_CLASS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    INTENT_FIELD_NUMBER: _ClassVar[int]
    campaign: str
    size: _containers.ScalarMap[str, float]
    duration_s: float
    timeout_s: float
    lease_class: LeaseClass
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    shape: Shape
    intent: Intent
    def __init__(self, campaign: _Optional[str] = ..., size: _Optional[_Mapping[str, float]] = ..., duration_s: _Optional[float] = ..., timeout_s: _Optional[float] = ..., lease_class: _Optional[_Union[LeaseClass, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., shape: _Optional[_Union[Shape, _Mapping]] = ..., intent: _Optional[_Union[Intent, _Mapping]] = ...) -> None: ...

class Shape(_message.Message):
    __slots__ = ("nodes", "per_node", "exclusive", "cpus_per_gpu", "mem_per_gpu")
    class PerNodeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    PER_NODE_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    CPUS_PER_GPU_FIELD_NUMBER: _ClassVar[int]
    MEM_PER_GPU_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    per_node: _containers.ScalarMap[str, float]
    exclusive: bool
    cpus_per_gpu: float
    mem_per_gpu: float
    def __init__(self, nodes: _Optional[int] = ..., per_node: _Optional[_Mapping[str, float]] = ..., exclusive: _Optional[bool] = ..., cpus_per_gpu: _Optional[float] = ..., mem_per_gpu: _Optional[float] = ...) -> None: ...

class Intent(_message.Message):
    __slots__ = ("min", "max", "step", "speedup", "remaining_work", "deadline_s", "value", "decay", "degrade", "speed_model", "sizes", "size_rule")
    class SpeedModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        SPEED_MODEL_UNSPECIFIED: _ClassVar[Intent.SpeedModel]
        SPEED_MODEL_MEASURED: _ClassVar[Intent.SpeedModel]
        SPEED_MODEL_INTERPOLATED: _ClassVar[Intent.SpeedModel]
    SPEED_MODEL_UNSPECIFIED: Intent.SpeedModel
    SPEED_MODEL_MEASURED: Intent.SpeedModel
    SPEED_MODEL_INTERPOLATED: Intent.SpeedModel
    class MinEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MaxEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class StepEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    REMAINING_WORK_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DECAY_FIELD_NUMBER: _ClassVar[int]
    DEGRADE_FIELD_NUMBER: _ClassVar[int]
    SPEED_MODEL_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    SIZE_RULE_FIELD_NUMBER: _ClassVar[int]
    min: _containers.ScalarMap[str, float]
    max: _containers.ScalarMap[str, float]
    step: _containers.ScalarMap[str, float]
    speedup: Speedup
    remaining_work: float
    deadline_s: float
    value: float
    decay: Decay
    degrade: _containers.RepeatedCompositeFieldContainer[DegradeMode]
    speed_model: Intent.SpeedModel
    sizes: _containers.RepeatedScalarFieldContainer[float]
    size_rule: str
    def __init__(self, min: _Optional[_Mapping[str, float]] = ..., max: _Optional[_Mapping[str, float]] = ..., step: _Optional[_Mapping[str, float]] = ..., speedup: _Optional[_Union[Speedup, _Mapping]] = ..., remaining_work: _Optional[float] = ..., deadline_s: _Optional[float] = ..., value: _Optional[float] = ..., decay: _Optional[_Union[Decay, _Mapping]] = ..., degrade: _Optional[_Iterable[_Union[DegradeMode, _Mapping]]] = ..., speed_model: _Optional[_Union[Intent.SpeedModel, str]] = ..., sizes: _Optional[_Iterable[float]] = ..., size_rule: _Optional[str] = ...) -> None: ...

class Speedup(_message.Message):
    __slots__ = ("amdahl_serial_fraction", "curve")
    AMDAHL_SERIAL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    CURVE_FIELD_NUMBER: _ClassVar[int]
    amdahl_serial_fraction: float
    curve: ThroughputCurve
    def __init__(self, amdahl_serial_fraction: _Optional[float] = ..., curve: _Optional[_Union[ThroughputCurve, _Mapping]] = ...) -> None: ...

class ThroughputCurve(_message.Message):
    __slots__ = ("points",)
    POINTS_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[ThroughputPoint]
    def __init__(self, points: _Optional[_Iterable[_Union[ThroughputPoint, _Mapping]]] = ...) -> None: ...

class ThroughputPoint(_message.Message):
    __slots__ = ("units", "throughput")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    units: float
    throughput: float
    def __init__(self, units: _Optional[float] = ..., throughput: _Optional[float] = ...) -> None: ...

class Decay(_message.Message):
    __slots__ = ("kind", "window_s")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Decay.Kind]
        KIND_STEP: _ClassVar[Decay.Kind]
        KIND_LINEAR: _ClassVar[Decay.Kind]
        KIND_EXPONENTIAL: _ClassVar[Decay.Kind]
    KIND_UNSPECIFIED: Decay.Kind
    KIND_STEP: Decay.Kind
    KIND_LINEAR: Decay.Kind
    KIND_EXPONENTIAL: Decay.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    kind: Decay.Kind
    window_s: float
    def __init__(self, kind: _Optional[_Union[Decay.Kind, str]] = ..., window_s: _Optional[float] = ...) -> None: ...

class DegradeMode(_message.Message):
    __slots__ = ("name", "work_factor", "value_factor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_FACTOR_FIELD_NUMBER: _ClassVar[int]
    VALUE_FACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    work_factor: float
    value_factor: float
    def __init__(self, name: _Optional[str] = ..., work_factor: _Optional[float] = ..., value_factor: _Optional[float] = ...) -> None: ...

class ElasticState(_message.Message):
    __slots__ = ("min", "max", "step", "units", "mode", "deadline", "remaining_work", "slack_s", "risk", "marginal_utility", "resize_deadline", "resize_to")
    class MinEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class MaxEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class StepEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ResizeToEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    REMAINING_WORK_FIELD_NUMBER: _ClassVar[int]
    SLACK_S_FIELD_NUMBER: _ClassVar[int]
    RISK_FIELD_NUMBER: _ClassVar[int]
    MARGINAL_UTILITY_FIELD_NUMBER: _ClassVar[int]
    RESIZE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    RESIZE_TO_FIELD_NUMBER: _ClassVar[int]
    min: _containers.ScalarMap[str, float]
    max: _containers.ScalarMap[str, float]
    step: _containers.ScalarMap[str, float]
    units: float
    mode: str
    deadline: float
    remaining_work: float
    slack_s: float
    risk: float
    marginal_utility: float
    resize_deadline: float
    resize_to: _containers.ScalarMap[str, float]
    def __init__(self, min: _Optional[_Mapping[str, float]] = ..., max: _Optional[_Mapping[str, float]] = ..., step: _Optional[_Mapping[str, float]] = ..., units: _Optional[float] = ..., mode: _Optional[str] = ..., deadline: _Optional[float] = ..., remaining_work: _Optional[float] = ..., slack_s: _Optional[float] = ..., risk: _Optional[float] = ..., marginal_utility: _Optional[float] = ..., resize_deadline: _Optional[float] = ..., resize_to: _Optional[_Mapping[str, float]] = ...) -> None: ...

class WhatIfRequest(_message.Message):
    __slots__ = ("acquire", "envelope")
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    acquire: AcquireRequest
    envelope: CampaignSpec
    def __init__(self, acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., envelope: _Optional[_Union[CampaignSpec, _Mapping]] = ...) -> None: ...

class WhatIfResponse(_message.Message):
    __slots__ = ("outcome", "lease", "reason", "estimated_wait_s", "decisions")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    outcome: DecisionKind
    lease: Lease
    reason: ReasonCode
    estimated_wait_s: float
    decisions: _containers.RepeatedCompositeFieldContainer[DecisionRecord]
    def __init__(self, outcome: _Optional[_Union[DecisionKind, str]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., reason: _Optional[_Union[ReasonCode, str]] = ..., estimated_wait_s: _Optional[float] = ..., decisions: _Optional[_Iterable[_Union[DecisionRecord, _Mapping]]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ("lease", "tokens", "price", "credits", "waited_s")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PRICE_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    tokens: float
    price: float
    credits: float
    waited_s: float
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., tokens: _Optional[float] = ..., price: _Optional[float] = ..., credits: _Optional[float] = ..., waited_s: _Optional[float] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("lease_id", "duration_s")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    duration_s: float
    def __init__(self, lease_id: _Optional[str] = ..., duration_s: _Optional[float] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("lease", "tokens", "credits")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    tokens: float
    credits: float
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., tokens: _Optional[float] = ..., credits: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("lease", "already_ended", "refund_tokens", "refund_credits")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ALREADY_ENDED_FIELD_NUMBER: _ClassVar[int]
    REFUND_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REFUND_CREDITS_FIELD_NUMBER: _ClassVar[int]
    lease: Lease
    already_ended: bool
    refund_tokens: float
    refund_credits: float
    def __init__(self, lease: _Optional[_Union[Lease, _Mapping]] = ..., already_ended: _Optional[bool] = ..., refund_tokens: _Optional[float] = ..., refund_credits: _Optional[float] = ...) -> None: ...

class GetLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("campaign",)
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    campaign: str
    def __init__(self, campaign: _Optional[str] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class ListPendingRequest(_message.Message):
    __slots__ = ("campaign", "request_id", "idempotency_key")
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    campaign: str
    request_id: str
    idempotency_key: str
    def __init__(self, campaign: _Optional[str] = ..., request_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PendingRequest(_message.Message):
    __slots__ = ("request_id", "campaign", "size", "duration_s", "lease_class", "queued_at", "waited_s", "reason", "estimated_wait_s", "position", "reserved_at", "labels", "idempotency_key")
    class SizeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_CLASS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    RESERVED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    campaign: str
    size: _containers.ScalarMap[str, float]
    duration_s: float
    lease_class: LeaseClass
    queued_at: float
    waited_s: float
    reason: ReasonCode
    estimated_wait_s: float
    position: int
    reserved_at: float
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    def __init__(self, request_id: _Optional[str] = ..., campaign: _Optional[str] = ..., size: _Optional[_Mapping[str, float]] = ..., duration_s: _Optional[float] = ..., lease_class: _Optional[_Union[LeaseClass, str]] = ..., queued_at: _Optional[float] = ..., waited_s: _Optional[float] = ..., reason: _Optional[_Union[ReasonCode, str]] = ..., estimated_wait_s: _Optional[float] = ..., position: _Optional[int] = ..., reserved_at: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ListPendingResponse(_message.Message):
    __slots__ = ("requests", "at")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[PendingRequest]
    at: float
    def __init__(self, requests: _Optional[_Iterable[_Union[PendingRequest, _Mapping]]] = ..., at: _Optional[float] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("lease_ids", "campaign", "from_seq", "from_index")
    LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    lease_ids: _containers.RepeatedScalarFieldContainer[str]
    campaign: str
    from_seq: int
    from_index: int
    def __init__(self, lease_ids: _Optional[_Iterable[str]] = ..., campaign: _Optional[str] = ..., from_seq: _Optional[int] = ..., from_index: _Optional[int] = ...) -> None: ...

class LeaseEvent(_message.Message):
    __slots__ = ("kind", "at", "lease", "deadline", "cause", "snapshot", "for_request", "seq", "index", "resize_to")
    class ResizeToEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    FOR_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RESIZE_TO_FIELD_NUMBER: _ClassVar[int]
    kind: LeaseEventKind
    at: float
    lease: Lease
    deadline: float
    cause: str
    snapshot: bool
    for_request: str
    seq: int
    index: int
    resize_to: _containers.ScalarMap[str, float]
    def __init__(self, kind: _Optional[_Union[LeaseEventKind, str]] = ..., at: _Optional[float] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., deadline: _Optional[float] = ..., cause: _Optional[str] = ..., snapshot: _Optional[bool] = ..., for_request: _Optional[str] = ..., seq: _Optional[int] = ..., index: _Optional[int] = ..., resize_to: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SupplyRequest(_message.Message):
    __slots__ = ("units", "dim")
    UNITS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    units: float
    dim: str
    def __init__(self, units: _Optional[float] = ..., dim: _Optional[str] = ...) -> None: ...

class WatchSupplyRequest(_message.Message):
    __slots__ = ("min_interval_s", "max_interval_s", "units", "dim")
    MIN_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    min_interval_s: float
    max_interval_s: float
    units: float
    dim: str
    def __init__(self, min_interval_s: _Optional[float] = ..., max_interval_s: _Optional[float] = ..., units: _Optional[float] = ..., dim: _Optional[str] = ...) -> None: ...

class MeterRequest(_message.Message):
    __slots__ = ("campaign", "dim", "amount")
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    AMOUNT_FIELD_NUMBER: _ClassVar[int]
    campaign: str
    dim: str
    amount: float
    def __init__(self, campaign: _Optional[str] = ..., dim: _Optional[str] = ..., amount: _Optional[float] = ...) -> None: ...

class MeterResponse(_message.Message):
    __slots__ = ("requested", "granted", "wait_s")
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    requested: float
    granted: float
    wait_s: float
    def __init__(self, requested: _Optional[float] = ..., granted: _Optional[float] = ..., wait_s: _Optional[float] = ...) -> None: ...

class ListDecisionsRequest(_message.Message):
    __slots__ = ("start_seq", "campaign", "kinds", "lease_id", "since", "limit")
    START_SEQ_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start_seq: int
    campaign: str
    kinds: _containers.RepeatedScalarFieldContainer[DecisionKind]
    lease_id: str
    since: float
    limit: int
    def __init__(self, start_seq: _Optional[int] = ..., campaign: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[DecisionKind, str]]] = ..., lease_id: _Optional[str] = ..., since: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDecisionsResponse(_message.Message):
    __slots__ = ("decisions", "next_seq")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[DecisionRecord]
    next_seq: int
    def __init__(self, decisions: _Optional[_Iterable[_Union[DecisionRecord, _Mapping]]] = ..., next_seq: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Status(_message.Message):
    __slots__ = ("version", "now", "engine_now", "started_at", "journal_entries", "campaigns", "leases", "pending", "open_streams", "caller", "role", "journal_store", "leader", "epoch", "brokers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NOW_FIELD_NUMBER: _ClassVar[int]
    ENGINE_NOW_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    OPEN_STREAMS_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_STORE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
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
    role: str
    journal_store: str
    leader: str
    epoch: int
    brokers: _containers.RepeatedCompositeFieldContainer[JournalBroker]
    def __init__(self, version: _Optional[str] = ..., now: _Optional[float] = ..., engine_now: _Optional[float] = ..., started_at: _Optional[float] = ..., journal_entries: _Optional[int] = ..., campaigns: _Optional[int] = ..., leases: _Optional[int] = ..., pending: _Optional[int] = ..., open_streams: _Optional[int] = ..., caller: _Optional[str] = ..., role: _Optional[str] = ..., journal_store: _Optional[str] = ..., leader: _Optional[str] = ..., epoch: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[JournalBroker, _Mapping]]] = ...) -> None: ...

class JournalBroker(_message.Message):
    __slots__ = ("address", "role", "applied", "lag_entries", "lag_s", "reported_at")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    LAG_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    address: str
    role: str
    applied: int
    lag_entries: int
    lag_s: float
    reported_at: float
    def __init__(self, address: _Optional[str] = ..., role: _Optional[str] = ..., applied: _Optional[int] = ..., lag_entries: _Optional[int] = ..., lag_s: _Optional[float] = ..., reported_at: _Optional[float] = ...) -> None: ...
