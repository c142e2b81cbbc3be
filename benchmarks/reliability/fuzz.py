"""Fuzzed input against `bursar serve`: every RPC of the Broker and Admin services (found
from the proto descriptors), fed hypothesis-built messages and raw bytes, with valid and
invalid tokens.

Checks: the server stays alive and its health service answers SERVING throughout; no reply
is UNKNOWN or INTERNAL; every error message and its trailers are bounded; and no refused
request changes the journal. Two phases:

* **refused-only**: every request carries a missing, malformed, wrong or rotated token (or a
  campaign token on an Admin RPC), so every one must be refused; the journal's digest (every
  decision's JSON, read back with ListDecisions as the admin) must be byte-identical after
  the batch;
* **mixed**: messages built from each request descriptor (valid values mixed with extreme
  ones, so that requests get past the first check) and raw bytes, with valid campaign and
  admin tokens. Each request's journal window (GetStatus.journal_entries before and after)
  is accounted: a request answered OK or refused by the engine (a REJECT / QUEUE decision:
  RESOURCE_EXHAUSTED or FAILED_PRECONDITION with an engine reason) may journal; any other
  refusal may not: its window may hold only the broker's own timer decisions (expiries,
  activations, power changes, revocations at a preemption deadline). A WhatIf journals
  nothing, answered OK or not: its window is accounted as a refusal's.
* **one bad field**: plausible requests of every RPC with one place (a number, a string,
  a map's key, an enum, at any depth) given a value of a bad class: NaN, ±inf, negative
  zero, a negative, a tiny or a huge number; an empty, control-character, invisible,
  mis-cased or very long string. Every place meets every class (``plants``), with the
  request's flags (preemptible, exclusive) off and on. Accounted as the mixed phase is.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import random
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from common import Mode, Result, varint
from google.protobuf import descriptor, message_factory
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st
from server import Server, md

from bursar.protos.bursar.v1 import admin_pb2, admin_pb2_grpc
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

SEED = 20_261_201
"""Every run draws the same requests (hypothesis is driven with this seed)."""

MESSAGE_MAX = 1024
"""The longest error message a reply may carry (the service cuts quotes at 400)."""
TRAILERS_MAX = 4096
"""The most bytes of trailing metadata a reply may carry: well under gRPC's default 8 KiB
client cap, past which a client sees RESOURCE_EXHAUSTED instead of the real status."""

REQUEST_LIMIT = 1 << 20
"""The server's request size limit (its default max_message_bytes)."""

FUZZ_POOL = """
[pool]
boot_latency_s = 1.0
[pool.rate_capacity]
inference = 1000
fs_bw = 1000
[pool.groups.w]
count = 4
warm = 4
gpu = 8
cpu = 64
mem_gb = 512
[policy]
grace_s = 0.5
min_retry_s = 0.1
max_lease_s = 3600
[policy.warm_headroom]
gpu = 0

[campaigns.sci]
class = "batch"
[campaigns.sci.gpu]
guarantee = 4
sustained = 8
burst = 24
bucket = 1000000
[campaigns.sci.inference]
sustained = 100
burst = 200
bucket = 1000

[campaigns.other]
class = "interactive"
[campaigns.other.gpu]
sustained = 8
burst = 16
bucket = 1000000
[campaigns.other.fs_bw]
sustained = 100
burst = 100

[campaigns.backfill]
class = "opportunistic"
preemptible = true
[campaigns.backfill.gpu]
sustained = 32
burst = 32
"""

# Reply codes that mean the engine decided (and journaled) the request: its ErrorInfo reason
# is one of the proto's ReasonCode names.
ENGINE_REASONS = frozenset(
    v.name.removeprefix("REASON_")
    for v in pb.ReasonCode.DESCRIPTOR.values
    if v.number != pb.REASON_UNSPECIFIED
)
# RPCs that journal nothing, answered OK or not: what their windows may hold is what a
# refused request's may (WhatIf decides on a copy of the engine).
DRY_RUNS = frozenset({"WhatIf"})
# Decisions the broker makes on its own clock, which may land in any request's window.
TIMER_KINDS = frozenset(
    {
        pb.DECISION_KIND_EXPIRE,
        pb.DECISION_KIND_ACTIVATE,
        pb.DECISION_KIND_POWER_ON,
        pb.DECISION_KIND_POWER_OFF,
        pb.DECISION_KIND_PREEMPT_WARNING,
        pb.DECISION_KIND_REVOKE,
        pb.DECISION_KIND_ALLOCATED,
    }
)


# ---------------------------------------------------------------------------- the RPCs


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    path: str
    request: type[Message]
    response: type[Message]
    streaming: bool

    @property
    def admin(self) -> bool:
        return self.service.endswith(".Admin")

    @property
    def label(self) -> str:
        return f"{self.service.rsplit('.', 1)[1]}.{self.name}"


def methods() -> list[Method]:
    """Every RPC of every service the generated modules define."""
    out = []
    for fd in (pb.DESCRIPTOR, admin_pb2.DESCRIPTOR):
        for svc in fd.services_by_name.values():
            for m in svc.methods:
                out.append(
                    Method(
                        svc.full_name,
                        m.name,
                        f"/{svc.full_name}/{m.name}",
                        message_factory.GetMessageClass(m.input_type),
                        message_factory.GetMessageClass(m.output_type),
                        m.server_streaming,
                    )
                )
    return out


# ---------------------------------------------------------------------------- the server


class DrainedServer(Server):
    """``Server`` whose stderr is read on a thread: a server that logs a lot (tracebacks of
    a defect) would otherwise block on a full pipe and look hung. Keeps the last lines."""

    def __init__(self, state_dir: Path, *args: str, timeout_s: float = 60.0) -> None:
        super().__init__(state_dir, *args, timeout_s=timeout_s)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=200)
        self.stderr_lines = 0
        self.tracebacks = 0
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self.stderr_lines += 1
                self.tracebacks += line.startswith("Traceback")
                self.stderr_tail.append(line.rstrip())
        except (ValueError, OSError):
            pass  # closed by close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._drain.join(5)
        super().close()


# ---------------------------------------------------------------------------- calls


@dataclass
class Outcome:
    code: grpc.StatusCode
    message: str = ""
    reason: str = ""
    trailer_bytes: int = 0
    response: bytes | None = None


def _reason(trailers: Any) -> str:
    for key, value in trailers or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for d in status.details:
                if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    d.Unpack(info)
                    return info.reason
    return ""


def _size(trailers: Any) -> int:
    return sum(len(k) + len(v) for k, v in trailers or ())


def call(
    channel: grpc.Channel,
    m: Method,
    body: bytes,
    metadata: tuple[tuple[str, str], ...],
    timeout: float = 2.0,
) -> Outcome:
    """One call with raw request bytes; a stream counts as OK once it opened (headers or
    its first message) and did not fail within a moment, and is then cancelled."""
    if m.streaming:
        stream = channel.unary_stream(m.path)(body, metadata=metadata, timeout=timeout)
        try:
            stream.initial_metadata()
            end = time.monotonic() + 0.03
            while not stream.done() and time.monotonic() < end:
                time.sleep(0.002)
            if not stream.done():
                stream.cancel()
                return Outcome(grpc.StatusCode.OK)
            code = stream.code()
            trailers = stream.trailing_metadata()
            if code == grpc.StatusCode.CANCELLED:
                return Outcome(grpc.StatusCode.OK)
            return Outcome(
                code,
                stream.details() or "",
                _reason(trailers),
                _size(trailers),
                b"" if code == grpc.StatusCode.OK else None,
            )
        except grpc.RpcError as err:
            return _failed(err)
    try:
        resp, _ = channel.unary_unary(m.path).with_call(body, metadata=metadata, timeout=timeout)
        return Outcome(grpc.StatusCode.OK, response=resp)
    except grpc.RpcError as err:
        return _failed(err)


def _failed(err: grpc.RpcError) -> Outcome:
    trailers = err.trailing_metadata()  # type: ignore[attr-defined]
    return Outcome(
        err.code(),  # type: ignore[attr-defined]
        err.details() or "",  # type: ignore[attr-defined]
        _reason(trailers),
        _size(trailers),
    )


class Probe:
    """Reads the broker's state as the admin: status, the journal, health."""

    def __init__(self, channel: grpc.Channel, admin: str) -> None:
        self.channel = channel
        self.meta = md(admin)
        self._status = pbg.BrokerStub(channel).GetStatus
        self._decisions = pbg.BrokerStub(channel).ListDecisions
        self._health = health_pb2_grpc.HealthStub(channel)

    def status(self) -> pb.Status:
        return self._status(pb.GetStatusRequest(), metadata=self.meta, timeout=10)

    def decisions(self, start_seq: int = 1) -> Iterator[pb.DecisionRecord]:
        while True:
            page = self._decisions(
                pb.ListDecisionsRequest(start_seq=start_seq, limit=1000),
                metadata=self.meta,
                timeout=30,
            )
            yield from page.decisions
            if not page.next_seq:
                return
            start_seq = page.next_seq

    def digest(self) -> tuple[int, str]:
        """The journal's entry count and the sha256 of every decision in it."""
        h = hashlib.sha256()
        for d in self.decisions():
            h.update(f"{d.seq}\0{d.json}\n".encode())
        return self.status().journal_entries, h.hexdigest()

    def serving(self) -> bool:
        try:
            got = self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        except grpc.RpcError:
            return False
        return got.status == health_pb2.HealthCheckResponse.SERVING

    def settle(self, quiet_s: float = 0.3, timeout_s: float = 10.0) -> int:
        """Wait until nothing is pending and the journal stops growing; its entry count."""
        deadline = time.monotonic() + timeout_s
        last = self.status()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.status()
            if now.journal_entries == last.journal_entries and now.pending == 0:
                return now.journal_entries
            last = now
        return last.journal_entries


# ---------------------------------------------------------------------------- strategies


@dataclass
class World:
    """What the fuzz knows about the server, for plausible field values: campaigns, their
    tokens, the leases it was granted, and tokens that no longer work."""

    tokens: dict[str, str]
    admin: str
    leases: list[str] = field(default_factory=lambda: ["L1", "L2"])
    stale: list[str] = field(default_factory=list)
    created: int = 0

    def campaigns(self) -> list[str]:
        return sorted(self.tokens)


def _pick(values: Callable[[], list[Any]]) -> st.SearchStrategy[Any]:
    """One of ``values()`` as the world stands when the example is drawn."""
    return st.integers(0, 1 << 30).map(
        lambda i: (lambda vs: vs[i % len(vs)] if vs else "")(values())
    )


FD = descriptor.FieldDescriptor
_INT_RANGES = {
    FD.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FD.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FD.TYPE_UINT32: (0, (1 << 32) - 1),
    FD.TYPE_FIXED32: (0, (1 << 32) - 1),
    FD.TYPE_UINT64: (0, (1 << 64) - 1),
    FD.TYPE_FIXED64: (0, (1 << 64) - 1),
}
_EXTREME_FLOATS = [
    0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, -5e-324,
    2.0**53, 2.0**63, 1e-9, -1.0, 86400.0 * 366, 3600.0, 3600.0000001,
]  # fmt: skip
_SPECIAL_STRINGS = [
    "", " ", "\x00", "\x00gpu", "gpu\x00", "\n\r\t", "\u202egpu", "\uff47\uff50\uff55", "GPU", "gpu ",
    "💥" * 40, "a" * 63, "a" * 64, "a" * 129, "a" * 257, "-", ".", "..", "../etc/passwd",
    "'; DROP TABLE tokens; --", "%s%n%x", "{}", "null", "NaN", "\ufeff", "\udbff".encode(
        "utf-8", "surrogatepass"
    ).decode("utf-8", "replace"),
]  # fmt: skip
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
_CONTROL = st.text(st.characters(max_codepoint=0x1F), min_size=1, max_size=20)


def _fuzz_scalar(fd: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = fd.type
    if t == FD.TYPE_DOUBLE:
        return st.one_of(st.floats(), st.sampled_from(_EXTREME_FLOATS))
    if t == FD.TYPE_FLOAT:
        return st.one_of(st.floats(width=32), st.sampled_from([0.0, float("nan"), float("inf")]))
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        edges = sorted({lo, hi, 0, 1, max(lo, -1), hi - 1, min(hi, 1 << 31), min(hi, 10_001)})
        return st.one_of(st.integers(lo, hi), st.sampled_from(edges))
    if t == FD.TYPE_BOOL:
        return st.booleans()
    if t == FD.TYPE_STRING:
        return st.one_of(
            _TEXT,
            st.sampled_from(_SPECIAL_STRINGS),
            _CONTROL,
            # Huge: past every length check, and (rarely, with others) past the size limit.
            st.sampled_from([1_000, 65_536, 300_000]).map(lambda n: "x" * n),
        )
    if t == FD.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FD.TYPE_ENUM:
        known = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-(1 << 31), (1 << 31) - 1))
    raise TypeError(f"no strategy for field type {t}")


def _hint(fd: descriptor.FieldDescriptor, world: World) -> st.SearchStrategy[Any] | None:
    """Plausible values for a field, by its name: what lets a request get past the first
    check, so that the deeper ones see the fuzzed values of the other fields."""
    name = fd.name
    if name in ("campaign", "name"):
        return st.one_of(_pick(world.campaigns), st.just(""), st.just("nobody"))
    if name in ("lease_id", "lease_ids"):
        # Mostly the latest leases: the ones most likely still live.
        return st.one_of(
            _pick(lambda: world.leases[-4:]), _pick(lambda: world.leases), st.just("L999999")
        )
    if name == "dim" and fd.containing_type.name == "MeterRequest":
        return st.sampled_from(["inference", "fs_bw"])
    if name == "dim":
        return st.sampled_from(["gpu", "cpu", "mem_gb", "inference", "fs_bw", ""])
    if name == "duration_s":
        return st.sampled_from([30.0, 600.0, 3600.0])
    if name == "timeout_s":
        return st.sampled_from([0.0, 0.0, 0.05])
    if name in ("units", "amount"):
        return st.sampled_from([1.0, 8.0, 100.0])
    if name in ("min_interval_s", "max_interval_s"):
        return st.sampled_from([0.05, 0.1])
    if name in ("start_seq", "from_seq", "from_index", "nodes"):
        return st.sampled_from([0, 1, 2])
    if name == "limit":
        return st.sampled_from([0, 10, 1000])
    if name == "since":
        return st.just(0.0)
    if name in ("guarantee", "cpus_per_gpu", "mem_per_gpu"):
        return st.just(0.0)
    if name in ("sustained", "burst", "bucket"):
        return st.sampled_from([1.0, 8.0, 100.0])
    if name == "reason":
        return st.just("fuzz: operator drain")
    if name == "idempotency_key":
        # Mostly fresh keys; a few repeat (a retry, or the same key for another request).
        return st.one_of(
            st.just(""), st.integers(0, 1 << 40).map(lambda i: f"k-{i}"), st.just("k-again")
        )
    return None


def _map_key(fd: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    """Keys of map field ``fd``: dimension names for the size-like maps, else by type."""
    key = _fuzz_scalar(fd.message_type.fields_by_name["key"])
    if fd.name in ("size", "per_node", "envelopes"):
        dims = st.sampled_from(["gpu", "cpu", "mem_gb", "inference", "fs_bw"])
        return st.one_of(dims, dims, key)
    if fd.name == "labels":
        return st.one_of(st.integers(0, 20).map(lambda i: f"k{i}"), key)
    return key


# Maps whose clean value is one entry (a dimension and a plausible amount).
_CLEAN_MAPS = {"size": ("gpu", [1.0, 2.0, 4.0, 8.0]), "labels": ("job", ["fuzz"])}


def _fuzz_value(fd: descriptor.FieldDescriptor, world: World, depth: int) -> st.SearchStrategy[Any]:
    """A single fuzzed value of ``fd`` (an element, for a repeated field)."""
    if fd.type == FD.TYPE_MESSAGE:
        return message_strategy(fd.message_type, world, depth + 1, rate=10)
    return _fuzz_scalar(fd)


def message_strategy(
    desc: descriptor.Descriptor, world: World, depth: int = 0, rate: int | None = None
) -> st.SearchStrategy[Message]:
    """Messages of type ``desc``. Each message draws how many of its fields (out of 10) are
    fuzzed: 0 gives a plausible request (fields with a hint set to it, the rest left
    unset), 10 gives every field a value by its type alone (extreme numbers, NaN, huge and
    control-character strings, unknown enum numbers, long lists and maps)."""
    cls = message_factory.GetMessageClass(desc)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        r = draw(st.sampled_from([0, 0, 1, 2, 5, 10])) if rate is None else rate
        for fd in desc.fields:
            if depth > 3:
                break
            is_map = fd.message_type is not None and fd.message_type.GetOptions().map_entry
            if draw(st.integers(0, 9)) >= r:
                _set_clean(draw, msg, fd, world, depth, r, is_map)
                continue
            if not draw(st.booleans()) and not draw(st.booleans()):
                continue  # fuzzed as absent
            if is_map:
                vfd = fd.message_type.fields_by_name["value"]
                n = draw(st.one_of(st.integers(0, 4), st.sampled_from([9, 17, 100])))
                keys = draw(st.lists(_map_key(fd), min_size=n, max_size=n, unique=True))
                target = getattr(msg, fd.name)
                for k in keys:
                    if vfd.type == FD.TYPE_MESSAGE:
                        target[k].CopyFrom(
                            draw(message_strategy(vfd.message_type, world, depth + 1, r))
                        )
                    else:
                        target[k] = draw(_fuzz_value(vfd, world, depth))
            elif fd.is_repeated:
                n = draw(st.one_of(st.integers(0, 3), st.sampled_from([1001, 5000])))
                elem = _fuzz_value(fd, world, depth)
                values = (
                    [draw(elem)] * n if n > 10 else draw(st.lists(elem, min_size=n, max_size=n))
                )
                if fd.type == FD.TYPE_MESSAGE:
                    for v in values:
                        getattr(msg, fd.name).add().CopyFrom(v)
                else:
                    getattr(msg, fd.name).extend(values)
            elif fd.type == FD.TYPE_MESSAGE:
                getattr(msg, fd.name).CopyFrom(draw(_fuzz_value(fd, world, depth)))
            else:
                setattr(msg, fd.name, draw(_fuzz_value(fd, world, depth)))
        return msg

    return build()


def _set_clean(
    draw: st.DrawFn,
    msg: Message,
    fd: descriptor.FieldDescriptor,
    world: World,
    depth: int,
    rate: int,
    is_map: bool,
) -> None:
    """Give ``fd`` a plausible value, or leave it unset where it has none."""
    if is_map:
        vfd = fd.message_type.fields_by_name["value"]
        if fd.name == "envelopes":
            for dim in draw(st.sampled_from([["gpu"], ["gpu", "cpu"], ["inference"]])):
                getattr(msg, fd.name)[dim].CopyFrom(
                    draw(message_strategy(vfd.message_type, world, depth + 1, 0))
                )
        elif fd.name in _CLEAN_MAPS and (fd.name == "size" or draw(st.booleans())):
            key, values = _CLEAN_MAPS[fd.name]
            getattr(msg, fd.name)[key] = draw(st.sampled_from(values))
        return
    if fd.type == FD.TYPE_MESSAGE:
        # A spec; and WhatIf's change, one of its two forms (the second drawn replaces the
        # first), so that plausible WhatIfs reach the engine's copy.
        if fd.name == "spec" or (fd.name in ("acquire", "envelope") and draw(st.booleans())):
            getattr(msg, fd.name).CopyFrom(
                draw(message_strategy(fd.message_type, world, depth + 1, rate))
            )
        return
    hint = _hint(fd, world)
    if hint is None:
        return
    if fd.is_repeated:
        getattr(msg, fd.name).extend(draw(st.lists(hint, max_size=2)))
    elif fd.name == "name" and draw(st.booleans()):
        world.created += 1  # a fresh name: CreateCampaign can succeed
        setattr(msg, fd.name, f"fz-{world.created}")
    else:
        setattr(msg, fd.name, draw(hint))


# ---------------------------------------------------------------------------- one bad field

# The classes of bad value every number, name and map key meets in the targeted phase.
BAD_NUMBERS = [
    float("nan"), float("inf"), float("-inf"), -0.0, -1.0, -5e-324, 5e-324, 1e308, -1e308,
    1e16, 2.0**63,
]  # fmt: skip
BAD_STRINGS = [
    "", " ", "\x00", "\x00gpu", "gpu\x00", "\n", "gpu\n", "\t", "\r\n", "\x1b[31m", "\x7f",
    "\u0085", "\u200b", "\u202egpu", "\u2028", "\ufeff", "\udbff".encode(
        "utf-8", "surrogatepass"
    ).decode("utf-8", "replace"), "GPU", "gpu ", "a" * 64, "a" * 65, "a" * 129, "a" * 257,
    "x" * 5_000, "x" * 100_000, "💥",
]  # fmt: skip
# Plausible map keys, so that a bad value of a map reaches the checks behind its key's.
_GOOD_KEYS = {"labels": "job", "envelopes": "gpu"}


@dataclass(frozen=True)
class Slot:
    """Somewhere one bad value can go: a field's path from the request (each step a field
    and, for a map or list of messages, the key or index), and what goes there."""

    path: tuple[tuple[descriptor.FieldDescriptor, Any], ...]
    kind: str  # number, string, key (a map's key), bool, enum


def _is_map(fd: descriptor.FieldDescriptor) -> bool:
    return fd.message_type is not None and fd.message_type.GetOptions().map_entry


def slots(desc: descriptor.Descriptor, depth: int = 0) -> list[Slot]:
    """Every place in ``desc`` (and the messages it holds, 4 deep) where a number, a
    string, a map key, a flag or an enum number can be set."""
    out: list[Slot] = []
    for fd in desc.fields:
        if _is_map(fd):
            vfd = fd.message_type.fields_by_name["value"]
            good = _GOOD_KEYS.get(fd.name, "gpu")
            out.append(Slot(((fd, None),), "key"))
            if vfd.type == FD.TYPE_MESSAGE:
                if depth < 4:
                    out += [
                        Slot(((fd, good), *s.path), s.kind)
                        for s in slots(vfd.message_type, depth + 1)
                    ]
            else:
                out.append(Slot(((fd, good),), _kind(vfd)))
        elif fd.type == FD.TYPE_MESSAGE:
            if depth < 4:
                step = 0 if fd.is_repeated else None
                out += [
                    Slot(((fd, step), *s.path), s.kind) for s in slots(fd.message_type, depth + 1)
                ]
        elif _kind(fd):
            out.append(Slot(((fd, None),), _kind(fd)))
    return out


def _kind(fd: descriptor.FieldDescriptor) -> str:
    return {
        FD.TYPE_DOUBLE: "number",
        FD.TYPE_FLOAT: "number",
        FD.TYPE_STRING: "string",
        FD.TYPE_BOOL: "bool",
        FD.TYPE_ENUM: "enum",
    }.get(fd.type, "")


def _put(msg: Message, slot: Slot, value: Any) -> None:
    """Set ``value`` at ``slot`` of ``msg``, making the messages on its way."""
    m = msg
    for fd, step in slot.path[:-1]:
        holder = getattr(m, fd.name)
        if _is_map(fd):
            m = holder[step]
        elif fd.is_repeated:
            m = holder[0] if len(holder) else holder.add()
        else:
            m = holder
    fd, step = slot.path[-1]
    target = getattr(m, fd.name)
    if slot.kind == "key":
        vfd = fd.message_type.fields_by_name["value"]
        if vfd.type == FD.TYPE_MESSAGE:
            target[value].SetInParent()
        else:
            target[value] = "v" if vfd.type == FD.TYPE_STRING else 1.0
    elif _is_map(fd):
        target[step] = value
    elif fd.is_repeated:
        target.append(value)
    else:
        setattr(m, fd.name, value)


# The classes a short run sends to every place; a long run sends every value above.
SHORT_NUMBERS = [float("nan"), float("-inf"), -1.0, 1e308]
SHORT_STRINGS = ["", "\x00", "\u202egpu", "x" * 5_000]


@dataclass(frozen=True)
class Plant:
    """One bad value at one place of a request; with ``flags``, every flag of the request
    is set too (preemptible, exclusive, dry_run), so that the rules that read a flag meet
    the bad value (a preemptible campaign's guarantee is compared with 0)."""

    slot: Slot
    value: Any
    flags: bool

    def into(self, msg: Message, places: list[Slot]) -> Message:
        if self.flags:
            for s in places:
                if s.kind == "bool":
                    _put(msg, s, True)
        # A value the message class itself refuses (an enum number out of int32) is moot.
        with contextlib.suppress(TypeError, ValueError):
            _put(msg, self.slot, self.value)
        return msg


def plants(desc: descriptor.Descriptor, long: bool) -> list[Plant]:
    """Every place of ``desc`` that holds a number, a string, a map key or an enum, each
    with every bad value of its class; each once with the request's flags as drawn and,
    where it has flags, once with all of them set."""
    places = slots(desc)
    numbers = BAD_NUMBERS if long else SHORT_NUMBERS
    strings = BAD_STRINGS if long else SHORT_STRINGS
    values = {"number": numbers, "string": strings, "key": strings, "enum": [-1, 99]}
    flagged = (False, True) if any(s.kind == "bool" for s in places) else (False,)
    return [
        Plant(slot, v, flags)
        for slot in places
        if slot.kind in values
        for v in values[slot.kind]
        for flags in flagged
    ]


# ---------------------------------------------------------------------------- raw bytes


def _tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def _payload(wire: int, rng: random.Random) -> bytes:
    if wire == 0:
        return varint(rng.choice([0, 1, 1 << 63, (1 << 64) - 1, rng.getrandbits(70)]))
    if wire == 1:
        return struct.pack("<d", rng.choice([float("nan"), float("inf"), -1.0, 1e308]))
    if wire == 5:
        return os.urandom(4)
    if wire == 2:
        data = os.urandom(rng.choice([0, 3, 40]))
        return varint(len(data)) + data
    return b""


def raw_strategy(desc: descriptor.Descriptor) -> st.SearchStrategy[bytes]:
    """Bodies that are not what ``desc`` says: random bytes, truncated and overlong
    varints, each field with a wrong wire type, lengths past the end, groups nested past
    the parser's recursion limit, oversize fields near and past the request limit."""
    numbers = [f.number for f in desc.fields] or [1]
    wire_of = {
        f.number: (
            2
            if f.type in (FD.TYPE_STRING, FD.TYPE_BYTES, FD.TYPE_MESSAGE) or f.is_repeated
            else 1
            if f.type in (FD.TYPE_DOUBLE, FD.TYPE_FIXED64, FD.TYPE_SFIXED64)
            else 5
            if f.type in (FD.TYPE_FLOAT, FD.TYPE_FIXED32, FD.TYPE_SFIXED32)
            else 0
        )
        for f in desc.fields
    }

    def crafted(kind: int, number: int, r: int) -> bytes:
        rng = random.Random(r)
        if kind == 0:  # truncated varint: a tag whose continuation never comes
            return _tag(number, 0) + b"\xff\xff\xff"
        if kind == 1:  # overlong varint: eleven continuation bytes
            return _tag(number, 0) + b"\xff" * 10 + b"\x01"
        if kind == 2:  # wrong wire type for a known field
            right = wire_of.get(number, 0)
            wire = rng.choice([w for w in (0, 1, 2, 5) if w != right])
            return _tag(number, wire) + _payload(wire, rng)
        if kind == 3:  # a length past the end
            return _tag(number, 2) + varint(rng.choice([10, 1 << 20, (1 << 32) - 1])) + b"ab"
        if kind == 4:  # start-groups nested beyond the recursion limit
            return (_tag(number + 1000, 3)) * 300
        if kind == 5:  # an unmatched end-group, field number 0, the largest field number
            return rng.choice([_tag(number, 4), b"\x00\x00", _tag((1 << 29) - 1, 0) + b"\x01"])
        if kind == 6:  # oversize: a string field just under, or just over, the limit
            n = rng.choice([REQUEST_LIMIT - 64, REQUEST_LIMIT + 64])
            return _tag(number, 2) + varint(n) + b"x" * n
        if kind == 7:  # valid-looking fields, then junk
            return (
                _tag(number, wire_of.get(number, 0))
                + _payload(wire_of.get(number, 0), rng)
                + os.urandom(rng.choice([1, 7]))
            )
        # invalid UTF-8 in a string-typed position
        return _tag(number, 2) + varint(2) + b"\xff\xfe"

    return st.one_of(
        st.binary(max_size=256),
        st.builds(crafted, st.integers(0, 8), st.sampled_from(numbers), st.integers(0, 1 << 30)),
    )


# ---------------------------------------------------------------------------- the tally


@dataclass
class Tally:
    codes: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    sent: int = 0
    max_message: int = 0
    max_trailers: int = 0
    accepted: int = 0
    accepted_entries: int = 0
    timer_entries: int = 0
    refused: int = 0
    dry_runs: int = 0
    """Requests of ``DRY_RUNS`` answered OK (their windows are checked as refusals are)."""
    problems: list[str] = field(default_factory=list)
    stream_timeouts: list[str] = field(default_factory=list)
    """Streams that neither opened nor failed within the call's deadline."""

    def add(self, m: Method, o: Outcome) -> None:
        self.sent += 1
        self.codes[m.label][o.code.name] += 1
        self.max_message = max(self.max_message, len(o.message))
        self.max_trailers = max(self.max_trailers, o.trailer_bytes)
        if o.code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
            self.problem(f"{m.label}: {o.code.name}: {o.message[:200]!r}")
        if len(o.message) > MESSAGE_MAX:
            self.problem(f"{m.label}: a {len(o.message)}-character error message")
        if o.trailer_bytes > TRAILERS_MAX:
            self.problem(f"{m.label}: {o.trailer_bytes} bytes of trailers")

    def problem(self, text: str) -> None:
        if len(self.problems) < 50:
            self.problems.append(text)


def journals(o: Outcome) -> bool:
    """May this answer have journaled something? OK, an engine refusal, or a blocking
    Acquire the client stopped waiting for (its request was queued, then withdrawn)."""
    return (
        o.code == grpc.StatusCode.OK
        or o.reason in ENGINE_REASONS
        or o.code == grpc.StatusCode.DEADLINE_EXCEEDED
    )


# ---------------------------------------------------------------------------- driving


def drive(strategy: st.SearchStrategy[Any], n: int, at: int, fn: Callable[[Any], None]) -> None:
    """Run ``fn`` on up to ``n`` examples of ``strategy``, drawn deterministically from
    ``SEED + at``. Nothing is shrunk: ``fn`` records, it does not raise."""

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @seed(SEED + at)
    @given(strategy)
    def body(x: Any) -> None:
        fn(x)

    body()


def _bad_tokens(world: World) -> st.SearchStrategy[tuple[str, tuple[tuple[str, str], ...]]]:
    """(kind, metadata) for a caller that must be refused on any RPC."""
    return st.one_of(
        st.just(("none", ())),
        st.sampled_from(
            [
                ("malformed", (("authorization", "Basic dXNlcjpwYXNz"),)),
                ("malformed", (("authorization", "Bearer"),)),
                ("malformed", (("authorization", "Bearer " + "x" * 600),)),
                ("malformed", (("authorization", world.tokens["sci"]),)),
                ("wrong", md("bsr_" + "A" * 43)),
                ("wrong", md("not-a-token")),
                ("wrong", (("authorization", "Bearer   bsr_"),)),
            ]
        ),
        _pick(lambda: world.stale).map(lambda t: ("rotated", md(t))),
    )


def _good_tokens(world: World) -> st.SearchStrategy[tuple[str, tuple[tuple[str, str], ...]]]:
    return st.one_of(
        _pick(world.campaigns).map(lambda c: (f"campaign:{c}", md(world.tokens[c]))),
        st.just(("admin", md(world.admin))),
        st.just(("admin", md(world.admin))),
    )


def run(mode: Mode, work_dir: Path) -> Result:
    result = Result("fuzz")
    total = 10_000 if mode == "long" else 1_500
    ms = methods()
    with DrainedServer(
        work_dir / "state",
        "--config",
        str(_write(work_dir / "fuzz.toml", FUZZ_POOL)),
        "--rate-limit",
        "1000000",
        "--rate-burst",
        "1000000",
        "--max-streams",
        "100000",
    ) as server:
        channel = grpc.insecure_channel(
            server.address,
            options=[("grpc.max_send_message_length", 4 * REQUEST_LIMIT)],
        )
        try:
            _fuzz(server, channel, ms, total, result, mode == "long")
        finally:
            channel.close()
        if server.proc.poll() is not None:
            result.fail(f"the server exited with {server.proc.returncode} during the fuzz")
        else:
            rc = server.kill(signal.SIGTERM)
            result.figures["exit_on_sigterm"] = rc
            if rc != 0:
                result.fail(f"the server exited with {rc} on SIGTERM after the fuzz")
        result.figures["server_stderr_lines"] = server.stderr_lines
        if server.tracebacks:
            result.fail(f"the server logged {server.tracebacks} traceback(s)")
            result.lines.extend(list(server.stderr_tail)[-20:])
    # Everything the accepted requests journaled re-derives (the audit replays the journal).
    audit = subprocess.run(
        [sys.executable, "-m", "bursar.cli.main", "journal", "audit", "--state-dir",
         str(work_dir / "state")],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    result.figures["journal_audit_exit"] = audit.returncode
    result.lines.append(f"journal audit after the fuzz: exit {audit.returncode}")
    if audit.returncode != 0:
        result.fail(f"journal audit failed: {audit.stdout[-800:]} {audit.stderr[-400:]}")
    return result


def until_zero(read: Callable[[], int], timeout_s: float) -> int:
    """Poll ``read`` until it gives 0 or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _fuzz(
    server: DrainedServer,
    channel: grpc.Channel,
    ms: list[Method],
    total: int,
    result: Result,
    long_run: bool,
) -> None:
    probe = Probe(channel, server.admin())
    world = World(dict(server.tokens()), server.admin())
    # A stale token: the campaign "other" gets a new one before the fuzz starts.
    rotate = admin_pb2_grpc.AdminStub(channel).RotateToken
    world.stale.append(world.tokens["other"])
    world.tokens["other"] = rotate(
        admin_pb2.RotateTokenRequest(campaign="other"), metadata=md(world.admin)
    ).token
    tally = Tally()
    t0 = time.monotonic()
    health_checks = [0, 0]  # (checked, serving)

    def check_health() -> None:
        health_checks[0] += 1
        if probe.serving():
            health_checks[1] += 1
        else:
            tally.problem(f"health not SERVING after {tally.sent} requests")

    # --- phase 1: refused only; the journal must be byte-identical after the batch.
    refused_n = int(total * 0.3)
    probe.settle()
    before = probe.digest()
    per = max(1, refused_n // (2 * len(ms)))
    for i, m in enumerate(ms):
        who = _bad_tokens(world)
        if m.admin:
            who = st.one_of(
                who,
                _pick(world.campaigns).map(lambda c: ("campaign", md(world.tokens[c]))),
            )

        def refused(x: tuple[Any, ...], m: Method = m) -> None:
            (kind, meta), body = x
            o = call(channel, m, body, meta)
            tally.add(m, o)
            tally.refused += 1
            want = {
                "campaign": grpc.StatusCode.PERMISSION_DENIED,
            }.get(kind, grpc.StatusCode.UNAUTHENTICATED)
            # Oversize bodies are refused by gRPC before the service sees them.
            if len(body) > REQUEST_LIMIT:
                want = grpc.StatusCode.RESOURCE_EXHAUSTED
            if o.code != want:
                tally.problem(f"{m.label} with a {kind} token answered {o.code.name}")
            if tally.sent % 100 == 0:
                check_health()

        messages = message_strategy(m.request.DESCRIPTOR, world).map(
            lambda msg: msg.SerializeToString()
        )
        drive(st.tuples(who, messages), per, 1000 + i, refused)
        drive(st.tuples(who, raw_strategy(m.request.DESCRIPTOR)), per, 2000 + i, refused)
    after = probe.digest()
    if after != before:
        tally.problem(f"refused-only batch changed the journal: {before} -> {after}")
    refused_phase = tally.sent
    result.figures["refused_only"] = {
        "requests": refused_phase,
        "journal_entries": before[0],
        "journal_sha256_unchanged": after == before,
    }

    # --- phase 2: mixed, valid tokens; each request's journal window is accounted.
    remaining = total - refused_phase
    per_msg = max(1, int(remaining * 0.75) // len(ms))
    per_raw = max(1, (remaining - per_msg * len(ms)) // len(ms))
    last = [probe.status().journal_entries]
    harvest = _harvester(world)

    def mixed(m: Method) -> Callable[[tuple[Any, ...]], None]:
        def one(x: tuple[Any, ...]) -> None:
            (kind, meta), body = x
            o = call(channel, m, body, meta, timeout=1.0)
            tally.add(m, o)
            if m.streaming and o.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                tally.stream_timeouts.append(f"{m.label} {kind} {_describe(m, body)}")
            if o.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                probe.settle(quiet_s=0.05)
            now = probe.status().journal_entries
            grew = now - last[0]
            dry = m.name in DRY_RUNS
            if dry and o.code == grpc.StatusCode.OK:
                tally.dry_runs += 1
            if journals(o) and not dry:
                tally.accepted += 1
                tally.accepted_entries += grew
                if o.code == grpc.StatusCode.OK:
                    harvest(m, o.response)
            else:
                if not (dry and o.code == grpc.StatusCode.OK):
                    tally.refused += 1
                if grew:
                    window = [d for d in probe.decisions(last[0] + 1) if d.seq <= now]
                    foreign = [d for d in window if d.kind not in TIMER_KINDS]
                    if foreign:
                        kinds = sorted({pb.DecisionKind.Name(d.kind) for d in foreign})
                        tally.problem(
                            f"{m.label} ({kind}) {'answered' if dry else 'refused with'} "
                            f"{o.code.name} "
                            f"{o.reason or o.message[:80]!r} but the journal gained {kinds}"
                        )
                    tally.timer_entries += grew
            last[0] = now
            if tally.sent % 200 == 0:
                check_health()
                _release_all(channel, world)
                last[0] = probe.settle(quiet_s=0.05)

        return one

    for i, m in enumerate(ms):
        who = _good_tokens(world)
        messages = message_strategy(m.request.DESCRIPTOR, world).map(
            lambda msg: msg.SerializeToString()
        )
        drive(st.tuples(who, messages), per_msg, 3000 + i, mixed(m))
        drive(st.tuples(who, raw_strategy(m.request.DESCRIPTOR)), per_raw, 4000 + i, mixed(m))
    # Top up to the target with more messages (hypothesis stops early on small messages).
    round_ = 0
    while tally.sent < total and round_ < 20:
        for i, m in enumerate(ms):
            if tally.sent >= total:
                break
            messages = message_strategy(m.request.DESCRIPTOR, world).map(
                lambda msg: msg.SerializeToString()
            )
            n = min(per_msg, total - tally.sent)
            drive(st.tuples(_good_tokens(world), messages), n, 5000 + 100 * round_ + i, mixed(m))
        round_ += 1

    # --- phase 3: one bad value in an otherwise plausible request, for every RPC: each
    # number, string, map key and enum of the request (at any depth) meets each class of
    # bad value (plants()), with the request's flags off and on; accounted as the mixed
    # phase is. Admin RPCs as the admin; the Broker's as a campaign or the admin.
    codes_before = {k: collections.Counter(v) for k, v in tally.codes.items()}
    sent_before = tally.sent
    places = 0
    for i, m in enumerate(ms):
        todo = plants(m.request.DESCRIPTOR, long_run)
        places += len({p.slot for p in todo})
        every = slots(m.request.DESCRIPTOR)
        send = mixed(m)
        who = st.just(("admin", md(world.admin))) if m.admin else _good_tokens(world)

        def plant(
            x: tuple[Any, Message],
            todo: list[Plant] = todo,
            every: list[Slot] = every,
            send: Callable[[tuple[Any, ...]], None] = send,
        ) -> None:
            if todo:
                token, base = x
                send((token, todo.pop().into(base, every).SerializeToString()))

        round_ = 0
        # The base requests are drawn by hypothesis, which may stop early on small ones.
        while todo and round_ < 20:
            base = message_strategy(m.request.DESCRIPTOR, world, rate=0)
            drive(st.tuples(who, base), len(todo), 6000 + 100 * round_ + i, plant)
            round_ += 1
    targeted = {
        k: dict(sorted((v - codes_before.get(k, collections.Counter())).items()))
        for k, v in sorted(tally.codes.items())
    }
    result.figures["one_bad_field"] = {
        "requests": tally.sent - sent_before,
        "places": places,
        "by_rpc": targeted,
    }
    check_health()
    elapsed = time.monotonic() - t0
    # Every stream the fuzz opened was cancelled or ended: none may stay registered.
    streams = until_zero(lambda: probe.status().open_streams, 10.0)
    result.figures["open_streams_after"] = streams
    if streams:
        tally.problem(f"{streams} stream(s) still open on the server after the fuzz")

    for p in tally.problems:
        result.fail(p)
    codes = {k: dict(sorted(v.items())) for k, v in sorted(tally.codes.items())}
    result.figures.update(
        {
            "requests": tally.sent,
            "rpcs": len(ms),
            "rpcs_covered": len(codes),
            "by_rpc": codes,
            "unknown_or_internal": sum(
                c.get("UNKNOWN", 0) + c.get("INTERNAL", 0) for c in codes.values()
            ),
            "max_message_chars": tally.max_message,
            "max_trailer_bytes": tally.max_trailers,
            "accepted": tally.accepted,
            "accepted_journal_entries": tally.accepted_entries,
            "refused": tally.refused,
            "dry_runs_ok": tally.dry_runs,
            "timer_entries_in_refused_windows": tally.timer_entries,
            "health_checks": health_checks[0],
            "health_serving": health_checks[1],
            "requests_per_s": round(tally.sent / elapsed, 1),
            "stream_timeouts": len(tally.stream_timeouts),
        }
    )
    if len(codes) != len(ms):
        result.fail(f"only {len(codes)} of {len(ms)} RPCs were exercised")
    totals: collections.Counter[str] = collections.Counter()
    for c in tally.codes.values():
        totals.update(c)
    result.lines += [
        f"{tally.sent} requests over {len(codes)}/{len(ms)} RPCs in {elapsed:.0f} s "
        f"({tally.sent / elapsed:.0f}/s): "
        + ", ".join(f"{k} {v}" for k, v in sorted(totals.items())),
        f"UNKNOWN/INTERNAL: {result.figures['unknown_or_internal']}; longest error message "
        f"{tally.max_message} chars, largest trailers {tally.max_trailers} bytes",
        f"refused-only phase: {refused_phase} requests, journal ({before[0]} entries) "
        f"{'byte-identical' if after == before else 'CHANGED'}",
        f"mixed phase: {tally.accepted} accepted (journaled {tally.accepted_entries} entries), "
        f"{tally.refused - refused_phase} refused and {tally.dry_runs} WhatIf answered "
        f"(journal unchanged but for {tally.timer_entries} timer entries)",
        f"health SERVING {health_checks[1]}/{health_checks[0]} checks",
        f"one bad field: {tally.sent - sent_before} requests over {places} places "
        f"(numbers, strings, map keys, flags, enums) of the {len(ms)} request types: "
        + ", ".join(
            f"{k} {v}"
            for k, v in sorted(
                sum(map(collections.Counter, targeted.values()), collections.Counter()).items()
            )
        ),
    ]
    result.lines += [f"stream deadline: {t}" for t in tally.stream_timeouts[:10]]
    width = max(len(k) for k in codes)
    for name, c in codes.items():
        result.lines.append(f"  {name:<{width}}  " + " ".join(f"{k}={v}" for k, v in c.items()))


def _describe(m: Method, body: bytes) -> str:
    """A short account of a request body, for a report line."""
    try:
        text = str(m.request.FromString(body)).replace("\n", " ")
    except Exception:
        text = body[:40].hex()
    return f"{len(body)} bytes: {text[:300]}"


def _harvester(world: World) -> Callable[[Method, bytes | None], None]:
    """Learns from accepted replies: granted lease ids, rotated and created tokens."""

    def harvest(m: Method, body: bytes | None) -> None:
        if not body:
            return
        if m.name == "Acquire":
            lid = pb.AcquireResponse.FromString(body).lease.lease_id
            if lid and lid not in world.leases:
                world.leases.append(lid)
        elif m.name == "RotateToken":
            # Which campaign was rotated is not in the reply: find the token that stopped.
            token = admin_pb2.RotateTokenResponse.FromString(body).token
            world.stale.append(token)  # resolved by _refresh_tokens
        elif m.name == "CreateCampaign":
            got = admin_pb2.CreateCampaignResponse.FromString(body)
            world.tokens[got.campaign.spec.name] = got.token

    return harvest


def _release_all(channel: grpc.Channel, world: World) -> None:
    """Give back every live lease (as the admin) and re-learn which tokens still work, so
    that the pool does not fill up and the fuzz keeps campaign tokens that authenticate."""
    meta = md(world.admin)
    listed = pbg.BrokerStub(channel).ListLeases(pb.ListLeasesRequest(), metadata=meta, timeout=10)
    release = pbg.BrokerStub(channel).Release
    for lease in listed.leases:
        with contextlib.suppress(grpc.RpcError):  # it may have ended meanwhile
            release(pb.ReleaseRequest(lease_id=lease.lease_id), metadata=meta, timeout=10)
    _refresh_tokens(channel, world)
    # Fresh live leases for the lease RPCs (Renew, Release, RevokeLease...) to aim at.
    acquire = pbg.BrokerStub(channel).Acquire
    for name in ("sci", "other", "backfill"):
        with contextlib.suppress(grpc.RpcError):  # the fuzz may have changed its envelope
            got = acquire(
                pb.AcquireRequest(campaign=name, size={"gpu": 1}, duration_s=3600),
                metadata=meta,
                timeout=10,
            )
            world.leases.append(got.lease.lease_id)


def _refresh_tokens(channel: grpc.Channel, world: World) -> None:
    """A campaign token the fuzz rotated away is replaced: tokens that a RotateToken reply
    handed out are tried against each campaign whose token stopped working."""
    status = pbg.BrokerStub(channel).GetStatus

    def caller(token: str) -> str | None:
        try:
            return status(pb.GetStatusRequest(), metadata=md(token), timeout=10).caller
        except grpc.RpcError:
            return None

    fresh = {}
    for token in world.stale[-50:]:
        who = caller(token)
        if who and who.startswith("campaign:"):
            fresh[who.removeprefix("campaign:")] = token
    for name, token in list(world.tokens.items()):
        if name in fresh:
            if world.tokens[name] != fresh[name]:
                world.stale.append(world.tokens[name])
            world.tokens[name] = fresh[name]
        elif caller(token) is None:
            del world.tokens[name]  # rotated and the new token lost: leave it out
    world.stale = [t for t in world.stale if t not in set(world.tokens.values())]
    if not world.stale:
        world.stale.append("bsr_" + "B" * 43)
