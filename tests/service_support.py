"""Helpers for the gRPC service tests: small fast pools, a server on port 0, clients.

Each test runs its own event loop (``run``) with the server and its clients on it: the
same loop, real gRPC over loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from bursar.broker.clock import ManualClock
from bursar.broker.config import Config, parse_config
from bursar.broker.service.core import ServiceCore
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.server import Running, Settings, running
from bursar.protos.bursar.v1 import admin_pb2_grpc
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg
from bursar.testing import apoll_until as until

T = TypeVar("T")

# Two warm nodes (16 GPUs) and one cold node (8 GPUs); grace and boot well under a
# second, so that reclaim, cold-path and expiry tests take about a second each.
POOL = """
[pool]
boot_latency_s = 0.6
[pool.rate_capacity]
inference = 1000
[pool.groups.w]
count = 2
warm = 2
gpu = 8
cpu = 64
mem_gb = 512
[pool.groups.c]
count = 1
warm = 0
gpu = 8
cpu = 64
mem_gb = 512
[policy]
grace_s = 0.6
min_retry_s = 0.5
max_lease_s = 3600
[policy.warm_headroom]
gpu = 0
"""

CAMPAIGNS = """
[campaigns.sci]
class = "batch"
[campaigns.sci.gpu]
sustained = 8
burst = 24
bucket = 100000
[campaigns.sci.inference]
sustained = 100
burst = 200
bucket = 1000

[campaigns.other]
class = "batch"
[campaigns.other.gpu]
sustained = 8
burst = 24
bucket = 100000

[campaigns.backfill]
class = "opportunistic"
preemptible = true
[campaigns.backfill.gpu]
sustained = 24
burst = 24
"""

LIFECYCLE = POOL + CAMPAIGNS

START = 1_750_000_000.0
"""Where a test's ManualClock starts: a plausible epoch time. Tests add durations to it
the way the broker does (``START + 0.6``), so times compare exactly; a duration the broker
measures back from a time (a wait, a refill) is exact for binary fractions (0.25, 0.125)."""


def config(text: str = LIFECYCLE) -> Config:
    return parse_config(text, "toml", source="<test>")


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@dataclass
class Client:
    """One server and what a test needs to talk to it."""

    running: Running
    state_dir: Path
    channel: grpc.aio.Channel
    broker: pbg.BrokerStub
    admin: admin_pb2_grpc.AdminStub
    tokens: dict[str, str]
    admin_token: str
    extra_channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.running.address

    @property
    def core(self) -> ServiceCore:
        return self.running.core

    def as_(self, who: str) -> tuple[tuple[str, str], ...]:
        return md(self.admin_token if who == "admin" else self.tokens[who])

    def journal_len(self) -> int:
        return self.core.runtime.journal.last_seq

    async def acquire(
        self, who: str, gpus: float, duration_s: float = 30.0, timeout_s: float = 0.0, **kw: Any
    ) -> pb.AcquireResponse:
        return await self.broker.Acquire(
            pb.AcquireRequest(size={"gpu": gpus}, duration_s=duration_s, timeout_s=timeout_s, **kw),
            metadata=self.as_(who),
        )

    async def new_channel(self) -> grpc.aio.Channel:
        ch = grpc.aio.insecure_channel(self.address)
        self.extra_channels.append(ch)
        return ch


@asynccontextmanager
async def serve(
    state_dir: Path,
    cfg: Config | None = None,
    *,
    limits: LimitSettings | None = None,
    **settings: Any,
) -> AsyncIterator[Client]:
    s = Settings(
        state_dir=state_dir,
        config=cfg if cfg is not None else config(),
        port=0,
        metrics_port=settings.pop("metrics_port", None),
        limits=limits or LimitSettings(rate=10_000, burst=10_000, max_streams=64),
        grace_s=settings.pop("grace_s", 2.0),
    )
    s = replace(s, **settings)
    async with running(s) as r:
        tokens_file = state_dir / "tokens.json"
        tokens = json.loads(tokens_file.read_text()) if tokens_file.exists() else {}
        admin_token = r.core.admin_token_path.read_text().strip()
        channel = grpc.aio.insecure_channel(r.address)
        client = Client(
            r,
            state_dir,
            channel,
            pbg.BrokerStub(channel),
            admin_pb2_grpc.AdminStub(channel),
            tokens,
            admin_token,
        )
        try:
            yield client
        finally:
            for ch in [channel, *client.extra_channels]:
                await ch.close()


def run(coro: Awaitable[T], timeout_s: float = 30.0) -> T:
    """Run one test scenario on a fresh event loop, with an overall timeout."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


@dataclass
class Details:
    code: grpc.StatusCode
    message: str
    reason: str | None = None
    domain: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    retry_after_s: float | None = None
    field_violations: list[tuple[str, str]] = field(default_factory=list)
    quota: list[tuple[str, str]] = field(default_factory=list)


def details(err: grpc.aio.AioRpcError | grpc.RpcError) -> Details:
    """The status and google.rpc details of a failed call."""
    out = Details(err.code(), err.details() or "")
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is None:
        return out
    for any_ in status.details:
        if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            any_.Unpack(info)
            out.reason, out.domain, out.metadata = info.reason, info.domain, dict(info.metadata)
        elif any_.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            any_.Unpack(retry)
            out.retry_after_s = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
        elif any_.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            any_.Unpack(bad)
            out.field_violations = [(v.field, v.description) for v in bad.field_violations]
        elif any_.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
            q = error_details_pb2.QuotaFailure()
            any_.Unpack(q)
            out.quota = [(v.subject, v.description) for v in q.violations]
    return out


async def fails(call: Awaitable[Any]) -> Details:
    """Await ``call``; it must fail. Returns its status details."""
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return details(err)
    raise AssertionError("the call succeeded; expected an error status")


async def asleep_until(clock: ManualClock, t: float, timeout_s: float = 5.0) -> None:
    """Wait (polling the event loop) until something sleeps on ``clock`` until ``t``: the
    code under test has scheduled that wake-up, and advancing to ``t`` will run it."""
    await until(lambda: t in clock.deadlines(), timeout_s)


async def next_event(stream: Any, timeout_s: float = 5.0) -> Any:
    return await asyncio.wait_for(stream.read(), timeout_s)


def worker_pythonpath() -> str:
    """PYTHONPATH for the worker processes Parsl, Dask and Ray start for a test: they
    import the functions a test hands them by module name, from the test modules in any
    folder of tests/ and from the support modules in tests/ itself."""
    tests = Path(__file__).resolve().parent
    folders = sorted(d for d in tests.iterdir() if d.is_dir() and any(d.glob("test_*.py")))
    return os.pathsep.join(str(d) for d in (tests, *folders))
