from bursar.protos.bursar.v1 import broker_pb2 as _broker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Campaign(_message.Message):
    __slots__ = ("spec", "held", "bucket", "credits", "leases", "queued", "token_issued_at")
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
    SPEC_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    BUCKET_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    spec: _broker_pb2.CampaignSpec
    held: _containers.ScalarMap[str, float]
    bucket: _containers.ScalarMap[str, float]
    credits: float
    leases: int
    queued: int
    token_issued_at: float
    def __init__(self, spec: _Optional[_Union[_broker_pb2.CampaignSpec, _Mapping]] = ..., held: _Optional[_Mapping[str, float]] = ..., bucket: _Optional[_Mapping[str, float]] = ..., credits: _Optional[float] = ..., leases: _Optional[int] = ..., queued: _Optional[int] = ..., token_issued_at: _Optional[float] = ...) -> None: ...

class CreateCampaignRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _broker_pb2.CampaignSpec
    def __init__(self, spec: _Optional[_Union[_broker_pb2.CampaignSpec, _Mapping]] = ...) -> None: ...

class CreateCampaignResponse(_message.Message):
    __slots__ = ("campaign", "token")
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    campaign: Campaign
    token: str
    def __init__(self, campaign: _Optional[_Union[Campaign, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class UpdateCampaignRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _broker_pb2.CampaignSpec
    def __init__(self, spec: _Optional[_Union[_broker_pb2.CampaignSpec, _Mapping]] = ...) -> None: ...

class GetCampaignRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListCampaignsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCampaignsResponse(_message.Message):
    __slots__ = ("campaigns",)
    CAMPAIGNS_FIELD_NUMBER: _ClassVar[int]
    campaigns: _containers.RepeatedCompositeFieldContainer[Campaign]
    def __init__(self, campaigns: _Optional[_Iterable[_Union[Campaign, _Mapping]]] = ...) -> None: ...

class RotateTokenRequest(_message.Message):
    __slots__ = ("campaign",)
    CAMPAIGN_FIELD_NUMBER: _ClassVar[int]
    campaign: str
    def __init__(self, campaign: _Optional[str] = ...) -> None: ...

class RotateTokenResponse(_message.Message):
    __slots__ = ("token", "issued_at")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    token: str
    issued_at: float
    def __init__(self, token: _Optional[str] = ..., issued_at: _Optional[float] = ...) -> None: ...

class RevokeLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "reason")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    reason: str
    def __init__(self, lease_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ApplyPolicyRequest(_message.Message):
    __slots__ = ("spec_json", "toml", "dry_run")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    TOML_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    toml: str
    dry_run: bool
    def __init__(self, spec_json: _Optional[str] = ..., toml: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class PolicyChange(_message.Message):
    __slots__ = ("key", "old_json", "new_json")
    KEY_FIELD_NUMBER: _ClassVar[int]
    OLD_JSON_FIELD_NUMBER: _ClassVar[int]
    NEW_JSON_FIELD_NUMBER: _ClassVar[int]
    key: str
    old_json: str
    new_json: str
    def __init__(self, key: _Optional[str] = ..., old_json: _Optional[str] = ..., new_json: _Optional[str] = ...) -> None: ...

class ApplyPolicyResponse(_message.Message):
    __slots__ = ("changes", "applied", "seq", "policy")
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    changes: _containers.RepeatedCompositeFieldContainer[PolicyChange]
    applied: bool
    seq: int
    policy: Policy
    def __init__(self, changes: _Optional[_Iterable[_Union[PolicyChange, _Mapping]]] = ..., applied: _Optional[bool] = ..., seq: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Policy(_message.Message):
    __slots__ = ("spec_json", "changed_at")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    changed_at: int
    def __init__(self, spec_json: _Optional[str] = ..., changed_at: _Optional[int] = ...) -> None: ...
