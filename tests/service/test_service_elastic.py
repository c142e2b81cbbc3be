"""Elastic leases over real gRPC: an Acquire with an intent, its Watch stream (GRANTED,
RESIZED, RESIZE_WARNING, RESIZED), the lease's elastic view, and the refusals."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from service_support import (
    CAMPAIGNS,
    POOL,
    START,
    Client,
    asleep_until,
    config,
    fails,
    next_event,
    run,
    serve,
)

from bursar.broker.audit import audit
from bursar.broker.clock import ManualClock
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.providers.client import AsyncBrokerClient, Backoff, Intent

K = pb
# The service tests' pool without its cold node: a waiting request can only be served
# by what the elastic lease gives back.
WARM_ONLY = config(
    POOL[: POOL.index("[pool.groups.c]")] + POOL[POOL.index("[policy]") :] + CAMPAIGNS
)


def intent(**kw: object) -> pb.Intent:
    base: dict[str, object] = dict(
        min={"gpu": 2},
        max={"gpu": 16},
        speedup=pb.Speedup(amdahl_serial_fraction=0.05),
        remaining_work=20_000,
        deadline_s=3_000,
    )
    base.update(kw)
    return pb.Intent(**base)  # type: ignore[arg-type]


def client_intent(**kw: Any) -> Intent:
    """The client library's intent: 2 to 8 GPUs on a measured curve."""
    base: dict[str, Any] = dict(
        min={"gpu": 2},
        max={"gpu": 8},
        work=5_000,
        deadline_s=2_000,
        curve=((1, 1.0), (2, 1.9), (4, 3.5), (8, 6.0)),
    )
    return Intent(**{**base, **kw})


@contextlib.asynccontextmanager
async def with_client(tmp_path: Path) -> AsyncIterator[tuple[Client, AsyncBrokerClient]]:
    """The warm-only service on a manual clock, and the client library as campaign sci."""
    async with (
        serve(tmp_path, WARM_ONLY, clock=ManualClock(START)) as c,
        AsyncBrokerClient(c.address, c.tokens["sci"], backoff=Backoff(0.05, 0.3)) as sci,
    ):
        yield c, sci


def test_an_elastic_lease_grows_then_shrinks_for_a_waiting_request(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, WARM_ONLY, clock=clock) as c:
            stream = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
            await stream.initial_metadata()
            got = await c.broker.Acquire(
                pb.AcquireRequest(duration_s=600, intent=intent()), metadata=c.as_("sci")
            )
            lease = got.lease
            # Answered once granted and grown in the same decision step: the whole pool's
            # warm GPUs (two nodes of 8).
            assert dict(lease.size) == {"gpu": 16.0} and len(lease.nodes) == 2
            assert lease.elastic.units == 16 and lease.elastic.mode == "full"
            assert lease.elastic.deadline == START + 3_000
            granted = await next_event(stream)
            assert granted.kind == K.LEASE_EVENT_KIND_GRANTED
            grown = await next_event(stream)
            assert grown.kind == K.LEASE_EVENT_KIND_RESIZED
            assert dict(grown.lease.size) == {"gpu": 16.0} and grown.seq == granted.seq
            # Extra steps are no leases of their own.
            listed = await c.broker.ListLeases(pb.ListLeasesRequest(), metadata=c.as_("sci"))
            assert [x.lease_id for x in listed.leases] == [lease.lease_id]

            # Another campaign asks for 8 GPUs and waits: the lease is told to shrink.
            task = asyncio.ensure_future(c.acquire("other", 8, duration_s=60, timeout_s=30))
            warn = await next_event(stream)
            assert warn.kind == K.LEASE_EVENT_KIND_RESIZE_WARNING
            assert warn.deadline == START + 0.6 and dict(warn.resize_to) == {"gpu": 8.0}
            now = await c.broker.GetLease(
                pb.GetLeaseRequest(lease_id=lease.lease_id), metadata=c.as_("sci")
            )
            assert dict(now.size) == {"gpu": 16.0}
            assert now.elastic.resize_deadline == START + 0.6
            assert dict(now.elastic.resize_to) == {"gpu": 8.0}
            await asleep_until(clock, START + 0.6)
            clock.set(START + 0.6)
            shrunk = await next_event(stream)
            assert shrunk.kind == K.LEASE_EVENT_KIND_RESIZED
            assert dict(shrunk.lease.size) == {"gpu": 8.0} and shrunk.at == START + 0.6
            won = await task
            assert won.lease.campaign == "other" and abs(won.waited_s - 0.6) < 1e-6
            stream.cancel()

    run(scenario())


def test_elastic_refusals_over_the_wire(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            journal = c.journal_len()
            bad = await fails(
                c.broker.Acquire(
                    pb.AcquireRequest(
                        duration_s=60,
                        intent=intent(speedup=pb.Speedup(amdahl_serial_fraction=1.5)),
                    ),
                    metadata=c.as_("sci"),
                )
            )
            assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
            ((where, why),) = bad.field_violations
            assert where == "intent.speedup.amdahl_serial_fraction" and "[0, 1]" in why
            assert c.journal_len() == journal
            hopeless = await fails(
                c.broker.Acquire(
                    pb.AcquireRequest(duration_s=60, intent=intent(deadline_s=10)),
                    metadata=c.as_("sci"),
                )
            )
            assert hopeless.code == grpc.StatusCode.FAILED_PRECONDITION
            assert hopeless.reason == "DEADLINE_UNREACHABLE" and hopeless.retry_after_s is None
            preemptible = await fails(
                c.broker.Acquire(
                    pb.AcquireRequest(duration_s=60, intent=intent()), metadata=c.as_("backfill")
                )
            )
            assert preemptible.code == grpc.StatusCode.FAILED_PRECONDITION
            assert "preemptible" in preemptible.message

    run(scenario())


def test_the_client_library_asks_for_an_elastic_lease_and_the_journal_audits(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with with_client(tmp_path) as (_, sci):
            want = client_intent(decay=("linear", 600.0), degrade=(("fp16", 0.6, 0.9),))
            lease = await sci.acquire({}, 600, intent=want)
            assert dict(lease.size) == {"gpu": 8.0}
            assert lease.elastic is not None and lease.elastic.units == 8
            assert lease.elastic.max == {"gpu": 8.0} and lease.elastic.mode == "full"
            assert lease.elastic.marginal_utility == 0  # at max
            await sci.release(lease.id)

    run(scenario())
    journal = Journal.open(tmp_path / JOURNAL_FILENAME)
    try:
        report = audit(journal)
        assert report.ok and not report.mismatches
    finally:
        journal.close()


def test_what_if_an_elastic_request_arrived(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, WARM_ONLY, clock=ManualClock(START)) as c:
            journal = c.journal_len()
            ans = await c.broker.WhatIf(
                pb.WhatIfRequest(acquire=pb.AcquireRequest(duration_s=600, intent=intent())),
                metadata=c.as_("sci"),
            )
            assert ans.outcome == pb.DECISION_KIND_GRANT
            kinds = [d.kind for d in ans.decisions]
            assert kinds == [pb.DECISION_KIND_GRANT, pb.DECISION_KIND_RESIZE]
            assert c.journal_len() == journal and not c.core.engine.leases

    run(scenario())


def test_a_powers_of_two_lease_is_only_ever_resized_to_allowed_sizes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, WARM_ONLY, clock=ManualClock(START)) as c:
            # Another campaign holds 11 of the 16 warm GPUs: 5 are free.
            other = await c.acquire("other", 11, duration_s=600)
            stream = c.broker.Watch(pb.WatchRequest(campaign="sci"), metadata=c.as_("sci"))
            await stream.initial_metadata()
            got = await c.broker.Acquire(
                pb.AcquireRequest(
                    duration_s=600,
                    intent=intent(max={"gpu": 12}, size_rule="powers_of_two", deadline_s=10_000),
                ),
                metadata=c.as_("sci"),
            )
            lease = got.lease
            # 5 would be faster, but 5 is no power of two.
            assert dict(lease.size) == {"gpu": 4.0} and lease.elastic.units == 4
            sizes = []
            while not sizes:
                ev = await next_event(stream)
                if ev.kind == K.LEASE_EVENT_KIND_RESIZED:
                    sizes.append(ev.lease.size["gpu"])
            # The other's release frees 11: the lease grows to 8, not to its max of 12.
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=other.lease.lease_id), metadata=c.as_("other")
            )
            grown = await next_event(stream)
            assert grown.kind == K.LEASE_EVENT_KIND_RESIZED
            sizes.append(grown.lease.size["gpu"])
            assert sizes == [4.0, 8.0]
            held = c.core.engine.elastic.by_lease[lease.lease_id]
            assert held.intent.size_rule == "powers_of_two"
            assert held.intent.speed_model == "measured"  # unset on the wire: the default
            stream.cancel()

    run(scenario())


def test_the_client_library_sends_sizes_and_the_speed_model(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with with_client(tmp_path) as (c, sci):
            want = client_intent(speed_model="interpolated", sizes=(2, 6))
            lease = await sci.acquire({}, 600, intent=want)
            # 8 GPUs are free; 6 is the largest size it allows.
            assert dict(lease.size) == {"gpu": 6.0}
            held = c.core.engine.elastic.by_lease[lease.id].intent
            assert (held.speed_model, held.sizes, held.size_rule) == ("interpolated", (2, 6), "")
            await sci.release(lease.id)
            odd = Intent(min={"gpu": 1}, max={"gpu": 2}, work=1, deadline_s=1, speed_model="x")
            with pytest.raises(ValueError, match="measured, interpolated"):
                odd.to_proto()

    run(scenario())


def test_bad_sizes_rules_and_speed_models_are_refused_naming_the_field(tmp_path: Path) -> None:
    cases: list[tuple[pb.Intent, str, str]] = [
        (intent(size_rule="powers_of_three"), "intent.size_rule", "powers_of_two, divisors_of:B"),
        (intent(size_rule="divisors_of:0"), "intent.size_rule", "divisors_of:B"),
        (intent(size_rule="divisors_of:1e3"), "intent.size_rule", "divisors_of:B"),
        (intent(speed_model=7), "intent.speed_model", "SPEED_MODEL_INTERPOLATED"),
        (intent(sizes=[2, float("nan")]), "intent.sizes[1]", "finite"),
        (intent(sizes=[2, 0]), "intent.sizes[1]", "(0, inf)"),
        (intent(sizes=[2.0] * 65), "intent.sizes", "at most 64"),
        (intent(sizes=[4, 8]), "intent.min", "not among the sizes"),
        (intent(size_rule="divisors_of:12", min={"gpu": 5}), "intent.min", "not among"),
    ]

    async def scenario() -> None:
        async with serve(tmp_path, WARM_ONLY, clock=ManualClock(START)) as c:
            for it, field, says in cases:
                journal, state = c.journal_len(), c.core.engine.state_digest()
                bad = await fails(
                    c.broker.Acquire(
                        pb.AcquireRequest(duration_s=60, intent=it), metadata=c.as_("sci")
                    )
                )
                assert bad.code == grpc.StatusCode.INVALID_ARGUMENT, (field, bad)
                ((where, why),) = bad.field_violations
                assert where == field and says in why, (field, bad)
                assert (c.journal_len(), c.core.engine.state_digest()) == (journal, state)

    run(scenario())


def test_bursar_acquire_asks_for_an_elastic_lease_on_allowed_sizes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, WARM_ONLY, clock=ManualClock(START)) as c:
            await c.acquire("other", 11, duration_s=600)  # 5 of the 16 warm GPUs are free
            sci = ["--target", c.address, "--token", c.tokens["sci"]]
            elastic = ["--size", "gpu=2", "--max", "gpu=12", "--work", "20000"]
            elastic += ["--deadline", "10000", "--curve", "1:1,2:1.9,4:3.6,8:6.5,16:11"]

            async def bursar(*args: str) -> tuple[int, str]:
                # A process of its own: it forwards signals to its command (main thread only).
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "bursar.cli.main", "acquire", *args,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                )  # fmt: skip
                out, _ = await proc.communicate()
                return await proc.wait(), out.decode()

            # The command sees the size it was granted: 4, the largest power of two free.
            check = 'test "$BURSAR_LEASE_SIZE" = gpu=4'
            code, out = await bursar(
                *elastic, "--size-rule", "powers_of_two", *sci, "--", "sh", "-c", check
            )
            assert code == 0, out
            # A bad rule: the broker names the intent's field; nothing is granted.
            journal = c.journal_len()
            code, out = await bursar(*elastic, "--size-rule", "powers_of_three", *sci, "--", "true")
            assert code == 1 and "intent.size_rule" in out, out
            assert c.journal_len() == journal
            # Elastic options without --max: a usage error, before any call.
            code, out = await bursar("--size", "gpu=2", "--sizes", "2,4", *sci)
            assert code == 2 and "give --max" in out, out

    run(scenario())
