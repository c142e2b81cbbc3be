"""Every field of every request is checked for its type, then its range, before anything
compares or adds it (``convert.check_request``): a malformed number or name is refused as
INVALID_ARGUMENT naming the field, quoting at most a short escaped prefix of a bad name,
and changes neither the engine's state nor the journal. On a real service over loopback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor
from google.protobuf.message import Message
from service_support import Client, Details, fails, run, serve

from bursar.broker.errors import RequestError
from bursar.broker.service import convert
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

NAN, INF = float("nan"), float("inf")


def _spec(name: str = "fz-1", preemptible: bool = False, **envelopes: dict[str, float]) -> Any:
    spec = pb.CampaignSpec(name=name, preemptible=preemptible)
    for dim, fields in envelopes.items():
        for k, v in fields.items():
            setattr(spec.envelopes[dim], k, v)
    return spec


def _nul_envelope(preemptible: bool) -> Any:
    spec = pb.CampaignSpec(name="fz-1", preemptible=preemptible)
    spec.envelopes["\x00"].guarantee = -INF
    return spec


async def _refused(c: Client, call: Any, field: str) -> Details:
    """``call`` is refused as INVALID_ARGUMENT for ``field``, changing nothing."""
    journal, state = c.journal_len(), c.core.engine.state_digest()
    d = await fails(call)
    assert d.code == grpc.StatusCode.INVALID_ARGUMENT, d
    assert d.metadata["field"] == field, d
    assert d.field_violations and d.field_violations[0][0] == field, d
    # What a person can act on, bounded, with any bad name escaped.
    assert len(d.message) <= 300, d.message
    assert d.message.isprintable(), d.message
    assert (c.journal_len(), c.core.engine.state_digest()) == (journal, state)
    return d


def test_a_nul_dimension_with_a_guarantee_of_minus_inf_is_invalid_argument(
    tmp_path: Path,
) -> None:
    # Once answered UNKNOWN: the spec's numbers reached the preemptible campaign's
    # "no guarantee" rule (a comparison) before their type was checked.
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            for preemptible in (True, False):
                for rpc, req in (
                    (c.admin.CreateCampaign, admin_pb2.CreateCampaignRequest),
                    (c.admin.UpdateCampaign, admin_pb2.UpdateCampaignRequest),
                ):
                    d = await _refused(
                        c,
                        rpc(req(spec=_nul_envelope(preemptible)), metadata=c.as_("admin")),
                        "spec.envelopes",
                    )
                    assert "unknown dimension '\\x00'" in d.message
                    assert "allowed: gpu, cpu, mem_gb, fs_bw, inference" in d.message
                # A known dimension's guarantee of -inf: the number itself is named.
                spec = _spec(preemptible=preemptible, gpu={"guarantee": -INF, "burst": 8})
                d = await _refused(
                    c,
                    c.admin.CreateCampaign(
                        admin_pb2.CreateCampaignRequest(spec=spec), metadata=c.as_("admin")
                    ),
                    "spec.envelopes.gpu.guarantee",
                )
                assert "finite" in d.message and "-inf" in d.message
            assert "fz-1" not in c.core.engine.campaigns

    run(scenario())


def test_a_long_bad_name_is_quoted_only_in_part(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            d = await _refused(
                c,
                c.broker.GetLease(
                    pb.GetLeaseRequest(lease_id="L\x00" + "x" * 5_000), metadata=c.as_("sci")
                ),
                "lease_id",
            )
            assert "'L\\x00xxx" in d.message and "(5,002 characters)" in d.message

    run(scenario())


Call = Callable[[Client], Any]


def _on(rpc: str, req: Message, who: str = "sci") -> Call:
    """A unary call of ``rpc`` ("Broker.Renew") with ``req`` as ``who``; a stream's first
    read, for the streaming RPCs."""
    service, method = rpc.split(".")

    def call(c: Client) -> Any:
        stub = c.broker if service == "Broker" else c.admin
        got = getattr(stub, method)(req, metadata=c.as_(who))
        return got.read() if method.startswith("Watch") else got

    return call


def _acquire(**kw: Any) -> Call:
    return _on(
        "Broker.Acquire", pb.AcquireRequest(**{"size": {"gpu": 1}, "duration_s": 30.0, **kw})
    )


def _intent(**kw: Any) -> Call:
    return _acquire(size={}, intent=pb.Intent(**kw))


def _create(spec: Any) -> Call:
    return _on("Admin.CreateCampaign", admin_pb2.CreateCampaignRequest(spec=spec), "admin")


# (call, the field refused), by RPC: for every RPC that takes a name or a number, each kind
# of name and number it takes, with the classes of bad value (NaN, ±inf, negative, tiny,
# huge; empty, control, invisible, too long).
CASES: dict[str, list[tuple[Call, str]]] = {
    "Broker.Acquire": [
        (_acquire(size={"\x00": 1}), "size"),
        (_acquire(size={"gpu": NAN}), "size.gpu"),
        (_acquire(size={"gpu": -INF}), "size.gpu"),
        (_acquire(size={"gpu": 1e308}), "size.gpu"),
        (_acquire(size={"gpu": 5e-324}), "size.gpu"),
        (_acquire(duration_s=INF), "duration_s"),
        (_acquire(timeout_s=-1.0), "timeout_s"),
        (_acquire(labels={"job\n": "x"}), "labels"),
        (_acquire(labels={"job": "a\x00b"}), "labels.job"),
        (_acquire(idempotency_key="k\u202e"), "idempotency_key"),
        (_acquire(lease_class=99), "lease_class"),
        (_acquire(shape=pb.Shape(per_node={"gpu": NAN}, nodes=1)), "shape.per_node.gpu"),
        (_acquire(shape=pb.Shape(exclusive=True, cpus_per_gpu=-INF)), "shape.cpus_per_gpu"),
        (_intent(min={"gpu": 1}, max={"gpu": 2}, step={"gpu": NAN}), "intent.step.gpu"),
        (_intent(degrade=[pb.DegradeMode(name="\x1b[31m")]), "intent.degrade[0].name"),
        (
            _intent(speedup=pb.Speedup(amdahl_serial_fraction=NAN)),
            "intent.speedup.amdahl_serial_fraction",
        ),
        (_intent(sizes=[2, NAN]), "intent.sizes[1]"),
        (_intent(size_rule="powers_of_two\x00"), "intent.size_rule"),
        (_intent(size_rule="divisors_of:" + "9" * 16), "intent.size_rule"),
        (_intent(speed_model=9), "intent.speed_model"),
    ],
    "Broker.Renew": [
        (_on("Broker.Renew", pb.RenewRequest(lease_id="L1\x00", duration_s=30)), "lease_id"),
        (_on("Broker.Renew", pb.RenewRequest(lease_id="L1", duration_s=NAN)), "duration_s"),
    ],
    "Broker.Release": [(_on("Broker.Release", pb.ReleaseRequest()), "lease_id")],
    "Broker.GetLease": [
        (_on("Broker.GetLease", pb.GetLeaseRequest(lease_id="\u202eL1")), "lease_id")
    ],
    "Broker.ListLeases": [
        (_on("Broker.ListLeases", pb.ListLeasesRequest(campaign="sci\x00"), "admin"), "campaign")
    ],
    "Broker.ListPending": [
        (_on("Broker.ListPending", pb.ListPendingRequest(campaign="SCI"), "admin"), "campaign"),
        (_on("Broker.ListPending", pb.ListPendingRequest(request_id="\n")), "request_id"),
    ],
    "Broker.Watch": [
        (_on("Broker.Watch", pb.WatchRequest(lease_ids=["L1", ""])), "lease_ids[1]"),
    ],
    "Broker.GetSupply": [
        (_on("Broker.GetSupply", pb.SupplyRequest(units=NAN)), "units"),
        (_on("Broker.GetSupply", pb.SupplyRequest(dim="gpu\x00")), "dim"),
    ],
    "Broker.WatchSupply": [
        (_on("Broker.WatchSupply", pb.WatchSupplyRequest(min_interval_s=-INF)), "min_interval_s"),
    ],
    "Broker.Meter": [
        (_on("Broker.Meter", pb.MeterRequest(dim="inference", amount=INF)), "amount"),
        (_on("Broker.Meter", pb.MeterRequest(dim="\x00", amount=1)), "dim"),
    ],
    "Broker.ListDecisions": [
        (_on("Broker.ListDecisions", pb.ListDecisionsRequest(since=NAN), "admin"), "since"),
        (
            _on("Broker.ListDecisions", pb.ListDecisionsRequest(lease_id="x" * 65), "admin"),
            "lease_id",
        ),
    ],
    "Broker.WhatIf": [
        # Named as Acquire and UpdateCampaign name them: a WhatIf refuses as they do.
        (
            _on(
                "Broker.WhatIf",
                pb.WhatIfRequest(acquire=pb.AcquireRequest(size={"gpu": -1.0}, duration_s=30)),
            ),
            "size.gpu",
        ),
        (
            _on("Broker.WhatIf", pb.WhatIfRequest(envelope=_nul_envelope(True)), "admin"),
            "spec.envelopes",
        ),
    ],
    "Admin.CreateCampaign": [
        (_create(_spec(name="\ufefffz")), "spec.name"),
        (_create(_spec(gpu={"burst": 8, "bucket": -INF})), "spec.envelopes.gpu.bucket"),
    ],
    "Admin.UpdateCampaign": [
        (
            _on(
                "Admin.UpdateCampaign",
                admin_pb2.UpdateCampaignRequest(spec=_spec("sci", gpu={"sustained": NAN})),
                "admin",
            ),
            "spec.envelopes.gpu.sustained",
        ),
    ],
    "Admin.GetCampaign": [
        (_on("Admin.GetCampaign", admin_pb2.GetCampaignRequest(name=""), "admin"), "name"),
    ],
    "Admin.RotateToken": [
        (
            _on("Admin.RotateToken", admin_pb2.RotateTokenRequest(campaign="sci\u2028"), "admin"),
            "campaign",
        ),
    ],
    "Admin.RevokeLease": [
        (
            _on(
                "Admin.RevokeLease",
                admin_pb2.RevokeLeaseRequest(lease_id="L1", reason="drain\x07"),
                "admin",
            ),
            "reason",
        ),
    ],
    "Admin.ApplyPolicy": [
        # The document's own parser reads its numbers; the engine's policy check refuses.
        (
            _on(
                "Admin.ApplyPolicy",
                admin_pb2.ApplyPolicyRequest(spec_json='{"grace_s": NaN}'),
                "admin",
            ),
            "policy.grace_s",
        ),
        (
            _on(
                "Admin.ApplyPolicy",
                admin_pb2.ApplyPolicyRequest(toml="[policy]\ngrace_s = -inf"),
                "admin",
            ),
            "policy.grace_s",
        ),
    ],
}


@pytest.mark.parametrize("rpc", sorted(CASES))
def test_each_rpc_refuses_bad_names_and_numbers_and_changes_nothing(
    tmp_path: Path, rpc: str
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            await c.acquire("sci", 1)  # a lease L1, so that lease calls get past "no lease"
            for make, field in CASES[rpc]:
                await _refused(c, make(c), field)

    run(scenario())


def _requests() -> list[descriptor.Descriptor]:
    out = []
    for fd in (pb.DESCRIPTOR, admin_pb2.DESCRIPTOR):
        for svc in fd.services_by_name.values():
            out += [m.input_type for m in svc.methods]
    return out


def _fields(desc: descriptor.Descriptor, seen: set[str]) -> list[descriptor.FieldDescriptor]:
    """Every field of ``desc`` and of the messages it holds."""
    if desc.full_name in seen:
        return []
    seen.add(desc.full_name)
    out = []
    for fd in desc.fields:
        is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
        out.append(fd)
        if is_map:
            value = fd.message_type.fields_by_name["value"]
            if value.message_type is not None:
                out += _fields(value.message_type, seen)
        elif fd.message_type is not None:
            out += _fields(fd.message_type, seen)
    return out


def test_every_name_and_map_key_of_every_request_has_a_documented_rule() -> None:
    # A new string field or map must say what it may hold: the table is the contract.
    seen: set[str] = set()
    fields = [f for d in _requests() for f in _fields(d, seen)]
    strings = {f.full_name for f in fields if f.type == f.TYPE_STRING}
    maps = {f.full_name for f in fields if f.message_type and f.message_type.GetOptions().map_entry}
    string_maps = {
        f.full_name
        for f in fields
        if f.full_name in maps and f.message_type.fields_by_name["value"].type == f.TYPE_STRING
    }
    assert set(convert._STRINGS) == strings
    assert set(convert._MAP_KEYS) == maps
    assert set(convert._MAP_VALUES) == string_maps


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        (0.0, True),
        (-0.0, True),  # zero: compares equal to 0 everywhere
        (1e-9, True),
        (8.0, True),
        (1e15, True),
        (float("nan"), False),
        (INF, False),
        (-INF, False),
        (-1.0, False),
        (5e-324, False),
        (1e-10, False),
        (1e16, False),
    ],
)
def test_every_number_is_finite_non_negative_and_bounded(value: float, ok: bool) -> None:
    req: Message = pb.AcquireRequest(size={"gpu": value}, duration_s=30)
    if ok:
        convert.check_request(req)
    else:
        with pytest.raises(RequestError) as err:
            convert.check_request(req)
        assert err.value.field == "size.gpu"


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("engine", True),
        ("parsl_job", True),
        ("bursar.io/lease-id", True),
        ("", False),
        ("\x00", False),
        ("job\n", False),
        (" job", False),
        ("\u202ejob", False),
        ("k" * 63, True),
        ("k" * 64, False),
    ],
)
def test_label_keys_have_a_character_set(key: str, ok: bool) -> None:
    req = pb.AcquireRequest(size={"gpu": 1}, duration_s=30, labels={key: "v"})
    if ok:
        convert.check_request(req)
    else:
        with pytest.raises(RequestError) as err:
            convert.check_request(req)
        assert err.value.field == "labels"
