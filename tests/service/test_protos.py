"""The wire contract: the committed generated code matches the .proto files byte for byte."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from bursar.broker.decisions import DECISION_TYPES, LeasePath
from bursar.broker.envelope import LeaseClass
from bursar.broker.lease import LeaseState
from bursar.broker.reasons import Reason
from bursar.protos import gen
from bursar.protos.bursar.v1 import admin_pb2, admin_pb2_grpc, broker_pb2, broker_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
REGEN = "scripts/gen_protos.sh"


def _pinned_grpcio_tools() -> str:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (pin,) = [d for d in data["project"]["optional-dependencies"]["dev"] if "grpcio-tools" in d]
    return pin.split("==", 1)[1]


def test_grpcio_tools_is_the_pinned_version() -> None:
    installed = importlib.metadata.version("grpcio-tools")
    pinned = _pinned_grpcio_tools()
    assert installed == pinned, (
        f"grpcio-tools {installed} is installed but pyproject.toml pins {pinned}; protoc's "
        "output differs between versions. Run: .venv/bin/pip install -e '.[dev]'"
    )


def test_generated_code_matches_the_proto_files() -> None:
    problems = gen.check()
    assert not problems, (
        "the generated Python modules are stale or were edited by hand; run "
        f"{REGEN} and commit the result:\n" + "\n".join(problems)
    )


def test_every_proto_file_has_generated_modules() -> None:
    for src in gen.proto_files():
        stem = src.name.removesuffix(".proto")
        for suffix in gen.GENERATED_SUFFIXES:
            assert (gen.PROTO_ROOT / src.parent / f"{stem}{suffix}").exists(), (
                f"{stem}{suffix} missing; run {REGEN}"
            )


def test_generated_modules_import_inside_the_package() -> None:
    for mod in (broker_pb2, broker_pb2_grpc, admin_pb2, admin_pb2_grpc):
        assert mod.__name__.startswith("bursar.protos.bursar.v1.")
        assert "from bursar.v1 " not in Path(mod.__file__).read_text()
    assert broker_pb2.Lease.__module__ == "bursar.protos.bursar.v1.broker_pb2"
    assert broker_pb2.DESCRIPTOR.package == "bursar.v1"
    assert broker_pb2.DESCRIPTOR.name == "bursar/v1/broker.proto"


def _enum_names(enum_type: object, prefix: str) -> set[str]:
    values = enum_type.DESCRIPTOR.values  # type: ignore[attr-defined]
    return {v.name.removeprefix(prefix) for v in values if v.number != 0}


@pytest.mark.parametrize(
    ("proto_enum", "prefix", "domain"),
    [
        (broker_pb2.ReasonCode, "REASON_", {r.value for r in Reason}),
        (broker_pb2.LeaseState, "LEASE_STATE_", {s.name for s in LeaseState}),
        (broker_pb2.LeasePath, "LEASE_PATH_", {p.name for p in LeasePath}),
        (broker_pb2.LeaseClass, "LEASE_CLASS_", {c.name for c in LeaseClass}),
        (broker_pb2.DecisionKind, "DECISION_KIND_", {k.upper() for k in DECISION_TYPES}),
    ],
    ids=["reason", "lease_state", "path", "lease_class", "decision_kind"],
)
def test_proto_enums_mirror_the_engine(proto_enum: object, prefix: str, domain: set[str]) -> None:
    assert _enum_names(proto_enum, prefix) == domain


def _comment_before(lines: list[str], i: int) -> bool:
    j = i - 1
    return j >= 0 and lines[j].strip().startswith("//")


@pytest.mark.parametrize("name", [p.name for p in gen.proto_files()])
def test_every_rpc_message_and_field_is_commented(name: str) -> None:
    """The .proto is the spec: every RPC and field says what it means."""
    lines = (gen.PROTO_ROOT / "bursar" / "v1" / name).read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("rpc ") and not _comment_before(lines, i):
            missing.append(f"{name}:{i + 1}: {s}")
        field = re.match(r"^(optional |repeated )?(map<[^>]+>|[\w.]+) \w+ = \d+;", s)
        if field and not _comment_before(lines, i):
            missing.append(f"{name}:{i + 1}: {s}")
    assert not missing, "uncommented:\n" + "\n".join(missing)
