"""The client's types are the wire messages' fields: every proto field and enum value is
there, converted (enums, optional fields, maps, nested messages), and back for what the
client sends."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.providers.client import (
    BrokerStatus,
    Campaign,
    CampaignSpec,
    CampaignSupply,
    CreatedCampaign,
    DecisionKind,
    DecisionRecord,
    DimEnvelope,
    DimSupply,
    Lease,
    LeaseClass,
    LeaseEvent,
    LeaseEventKind,
    LeasePath,
    LeaseState,
    MeterResult,
    ReasonCode,
    Supply,
    TimeTo,
    WhatIfResult,
)

ENUMS = [
    (LeaseState, pb.LeaseState, "LEASE_STATE_"),
    (LeasePath, pb.LeasePath, "LEASE_PATH_"),
    (LeaseClass, pb.LeaseClass, "LEASE_CLASS_"),
    (LeaseEventKind, pb.LeaseEventKind, "LEASE_EVENT_KIND_"),
    (DecisionKind, pb.DecisionKind, "DECISION_KIND_"),
    (ReasonCode, pb.ReasonCode, "REASON_"),
]

TYPES = [
    (Lease, pb.Lease, {"lease_id": "id"}),
    (LeaseEvent, pb.LeaseEvent, {}),
    (DimSupply, pb.DimSupply, {}),
    (CampaignSupply, pb.CampaignSupply, {}),
    (TimeTo, pb.TimeTo, {}),
    (Supply, pb.Supply, {}),
    (MeterResult, pb.MeterResponse, {}),
    (BrokerStatus, pb.Status, {}),
    (DimEnvelope, pb.DimEnvelope, {}),
    (CampaignSpec, pb.CampaignSpec, {}),
    (Campaign, admin_pb2.Campaign, {}),
    (CreatedCampaign, admin_pb2.CreateCampaignResponse, {}),
    (DecisionRecord, pb.DecisionRecord, {}),
    (WhatIfResult, pb.WhatIfResponse, {}),
]


@pytest.mark.parametrize(
    ("cls", "proto", "prefix"), ENUMS, ids=lambda x: getattr(x, "__name__", "")
)
def test_every_wire_enum_value_is_a_member_and_converts_both_ways(cls, proto, prefix) -> None:
    assert [m.value for m in cls] == [
        n.removeprefix(prefix) for n in (v.name for v in proto.DESCRIPTOR.values)
    ]
    for name, number in proto.items():
        member = cls.from_proto(number)
        assert member.value == name.removeprefix(prefix) and member == member.value
        assert member.to_proto() == number


@pytest.mark.parametrize(
    ("cls", "proto", "rename"), TYPES, ids=lambda x: getattr(x, "__name__", "")
)
def test_every_wire_field_is_an_attribute_in_wire_order(cls, proto, rename) -> None:
    wire = [rename.get(f.name, f.name) for f in proto.DESCRIPTOR.fields]
    assert [f.name for f in dataclasses.fields(cls)] == wire
    # The empty message is the all-defaults value, and every type renders as JSON.
    assert cls.from_proto(proto()) == cls()
    json.dumps(cls.from_proto(proto()).to_json(), allow_nan=False)


def test_lease_converts_each_kind_of_field() -> None:
    m = pb.Lease(
        lease_id="L7",
        campaign="sci",
        state=pb.LEASE_STATE_PREEMPTING,
        size={"gpu": 8, "cpu": 2},
        path=pb.LEASE_PATH_RECLAIM,
        lease_class=pb.LEASE_CLASS_OPPORTUNISTIC,
        preemptible=True,
        granted_at=10,
        starts_at=11,
        expires_at=70,
        preempt_deadline=12.5,
        nodes=["w001", "w000"],
        labels={"job": "a"},
        allocation={"job_id": "42"},
    )
    lease = Lease.from_proto(m)
    assert lease.id == "L7" and lease.campaign == "sci"
    assert lease.state is LeaseState.PREEMPTING and lease.live and not lease.ended
    assert lease.path is LeasePath.RECLAIM and lease.lease_class is LeaseClass.OPPORTUNISTIC
    assert list(lease.size.items()) == [("cpu", 2.0), ("gpu", 8.0)]  # sorted
    with pytest.raises(TypeError):
        lease.size["gpu"] = 1  # type: ignore[index]  # read-only
    assert lease.nodes == ("w001", "w000")  # wire order kept
    assert lease.preempt_deadline == 12.5 and lease.ended_at is None  # optional: unset
    assert dict(lease.labels) == {"job": "a"} and dict(lease.allocation) == {"job_id": "42"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        lease.state = LeaseState.ACTIVE  # type: ignore[misc]
    ended = dataclasses.replace(lease, state=LeaseState.REVOKED, ended_at=12.5)
    assert ended.ended and not ended.live and ended.size == lease.size
    out = lease.to_json()
    assert out["id"] == "L7" and out["state"] == "PREEMPTING" and out["nodes"] == ["w001", "w000"]
    assert out["size"] == {"cpu": 2.0, "gpu": 8.0} and out["ended_at"] is None


def test_nested_messages_maps_of_messages_and_client_defaults() -> None:
    s = Supply.from_proto(
        pb.Supply(
            at=5,
            dims={"gpu": pb.DimSupply(capacity=24, available_warm=16)},
            campaigns={"sci": pb.CampaignSupply(bucket={"gpu": math.inf}, queued=2)},
        )
    )
    assert s.dims["gpu"] == DimSupply(capacity=24, available_warm=16)
    assert s.campaigns["sci"].queued == 2 and s.campaigns["sci"].bucket["gpu"] == math.inf
    assert s.time_to is None  # a message field the server leaves out unless asked
    assert json.loads(json.dumps(s.to_json(), allow_nan=False))["campaigns"]["sci"]["bucket"] == {
        "gpu": None  # unlimited: null in JSON
    }
    t = TimeTo.from_proto(pb.TimeTo(units=8, dim="gpu", reclaim_s=0.6, cold_s=60))
    assert t.warm_s is None and t.best_s == 0.6

    warn = pb.LeaseEvent(kind=pb.LEASE_EVENT_KIND_PREEMPT_WARNING, deadline=9, lease=pb.Lease())
    assert LeaseEvent.from_proto(warn).deadline == 9
    grant = pb.LeaseEvent(kind=pb.LEASE_EVENT_KIND_GRANTED, deadline=9)
    assert LeaseEvent.from_proto(grant).deadline is None  # only a warning has one
    assert isinstance(LeaseEvent.from_proto(grant).lease, Lease)

    c = Campaign.from_proto(admin_pb2.Campaign(spec=pb.CampaignSpec(name="sci"), credits=3))
    assert c.name == "sci" and c.token_issued_at is None  # 0 on the wire: no token
    assert c.spec.lease_class is LeaseClass.BATCH  # the server's default class
    assert c.to_json()["name"] == "sci" and c.to_json()["credits"] == 3
    assert "secret" not in repr(CreatedCampaign(c, "secret"))


def test_a_campaign_spec_goes_to_the_wire_and_back() -> None:
    spec = CampaignSpec(
        "agents",
        {"gpu": DimEnvelope(0, 4, 16, None), "cpu": DimEnvelope(1, 2, 3, 500.0)},
        "interactive",
        preemptible=True,
    )
    m = spec.to_proto()
    assert m.lease_class == pb.LEASE_CLASS_INTERACTIVE and m.preemptible
    assert not m.envelopes["gpu"].HasField("bucket") and m.envelopes["cpu"].bucket == 500
    back = CampaignSpec.from_proto(m)
    assert back.lease_class is LeaseClass.INTERACTIVE
    assert back.envelopes == {"cpu": DimEnvelope(1, 2, 3, 500.0), "gpu": DimEnvelope(0, 4, 16)}
    with pytest.raises(ValueError, match="unknown lease class"):
        CampaignSpec("x", {}, "urgent").to_proto()


def test_a_whatif_answer_converts_its_lease_reason_and_decisions() -> None:
    queued = WhatIfResult.from_proto(
        pb.WhatIfResponse(
            outcome=pb.DECISION_KIND_QUEUE,
            reason=pb.REASON_POOL_FULL,
            estimated_wait_s=12.5,
            decisions=[
                pb.DecisionRecord(
                    kind=pb.DECISION_KIND_QUEUE,
                    campaign="sci",
                    lease_id="L3",
                    reason=pb.REASON_POOL_FULL,
                    json='{"kind":"queue","request_id":"L3"}',
                )
            ],
        )
    )
    assert queued.outcome is DecisionKind.QUEUE and not queued.granted
    assert queued.lease is None  # only a grant has one
    assert queued.reason is ReasonCode.POOL_FULL and queued.estimated_wait_s == 12.5
    [d] = queued.decisions
    assert d.details == {"kind": "queue", "request_id": "L3"} and d.seq == 0
    out = json.loads(json.dumps(queued.to_json(), allow_nan=False))
    assert out["outcome"] == "QUEUE" and out["lease"] is None
    assert out["decisions"][0]["reason"] == "POOL_FULL"
    granted = WhatIfResult.from_proto(
        pb.WhatIfResponse(outcome=pb.DECISION_KIND_GRANT, lease=pb.Lease(lease_id="L4"))
    )
    assert granted.granted and granted.lease == Lease(id="L4")
