"""Why is a request waiting, and when will it run? ListPending over real gRPC, and the
client library's ``on_queued`` updates of a blocking acquire."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import grpc
from service_support import LIFECYCLE, START, asleep_until, config, fails, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.providers.client import AsyncBrokerClient, PendingRequest, ReasonCode


async def _list(c, who: str, **kw: str) -> pb.ListPendingResponse:  # type: ignore[no-untyped-def]
    return await c.broker.ListPending(pb.ListPendingRequest(**kw), metadata=c.as_(who))


def test_pending_requests_say_why_they_wait_and_when_they_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            held = await c.acquire("sci", 16, duration_s=100)  # every warm GPU
            cold = await c.acquire("sci", 8, duration_s=200)  # the cold node, booting
            assert cold.lease.path == pb.LEASE_PATH_COLD
            waiting_other = asyncio.ensure_future(c.acquire("other", 8, timeout_s=60))
            waiting_sci = asyncio.ensure_future(c.acquire("sci", 8, timeout_s=60))
            await until(lambda: len(c.core.engine.pending) == 2)

            everyone = await _list(c, "admin")
            assert everyone.at >= START
            by_campaign = {r.campaign: r for r in everyone.requests}
            assert set(by_campaign) == {"sci", "other"}
            other, sci = by_campaign["other"], by_campaign["sci"]
            # The pool is full for both. ("sci" holds all 24 GPUs, its burst, but a burst
            # as large as the pool binds nothing the pool does not: it waits for the pool.)
            assert other.reason == pb.REASON_POOL_FULL
            assert sci.reason == pb.REASON_POOL_FULL
            # When will it run: the pool frees 8 GPUs when the first lease ends (100 s).
            assert 0 < other.estimated_wait_s <= 100
            assert 0 < sci.estimated_wait_s <= 100
            assert sorted(r.position for r in everyone.requests) == [1, 2]
            assert dict(other.size) == {"gpu": 8.0} and other.queued_at >= START
            assert not other.HasField("reserved_at")  # not past its patience yet
            assert other.idempotency_key == ""

            # A campaign token sees its own requests only, with their places overall.
            mine = await _list(c, "other")
            assert [r.request_id for r in mine.requests] == [other.request_id]
            assert mine.requests[0].position == other.position
            one = await _list(c, "admin", campaign="sci")
            assert [r.request_id for r in one.requests] == [sci.request_id]
            picked = await _list(c, "admin", request_id=other.request_id)
            assert [r.request_id for r in picked.requests] == [other.request_id]

            await c.broker.Release(
                pb.ReleaseRequest(lease_id=held.lease.lease_id), metadata=c.as_("sci")
            )
            assert (await waiting_other).lease.campaign == "other"
            assert (await waiting_sci).lease.campaign == "sci"
            assert not (await _list(c, "admin")).requests

    run(scenario())


def test_list_pending_is_validated_like_the_other_calls(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            err = await fails(_list(c, "sci", campaign="other"))
            assert err.code == grpc.StatusCode.PERMISSION_DENIED
            err = await fails(_list(c, "admin", campaign="nobody"))
            assert err.code == grpc.StatusCode.NOT_FOUND
            err = await fails(_list(c, "admin", idempotency_key="k"))
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT
            err = await fails(_list(c, "sci", request_id="x" * 200))
            assert err.code == grpc.StatusCode.INVALID_ARGUMENT
            err = await fails(
                c.broker.ListPending(pb.ListPendingRequest(), metadata=(("authorization", "x"),))
            )
            assert err.code == grpc.StatusCode.UNAUTHENTICATED

    run(scenario())


def test_a_blocking_acquire_tells_on_queued_why_it_waits(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            held = await c.acquire("sci", 24, duration_s=100)  # warm and cold: the pool
            updates: list[PendingRequest] = []

            async with AsyncBrokerClient(c.address, c.tokens["other"]) as client:
                waiting = asyncio.ensure_future(
                    client.acquire(
                        {"gpu": 8},
                        30,
                        timeout=60,
                        on_queued=updates.append,
                        queued_poll_s=0.02,
                    )
                )
                await until(lambda: bool(updates))
                first = updates[0]
                assert first.reason is ReasonCode.POOL_FULL
                # The lease holding the pool ends in 100 s (plus the grace while one boots).
                assert 0 < first.estimated_wait_s <= 101 and first.position == 1
                assert first.reserved_at is None and first.campaign == "other"
                # Nothing changed: no second update however often the queue is read.
                await asyncio.sleep(0.2)
                assert len(updates) == 1
                # The same answer from list_pending, by the request's id.
                (again,) = await client.list_pending(request_id=first.request_id)
                assert again.reason is ReasonCode.POOL_FULL
                await c.broker.Release(
                    pb.ReleaseRequest(lease_id=held.lease.lease_id), metadata=c.as_("sci")
                )
                lease = await waiting
                assert lease.id == first.request_id

    run(scenario())


def test_a_request_past_its_patience_shows_its_reservation(tmp_path: Path) -> None:
    cfg = config(LIFECYCLE.replace("[policy]\n", "[policy]\nhol_patience_s = 1\n"))

    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, cfg, clock=clock) as c:
            held = await c.acquire("sci", 24, duration_s=100)  # the whole pool
            waiting = asyncio.ensure_future(c.acquire("other", 8, timeout_s=600))
            await until(lambda: bool(c.core.engine.pending))
            (before,) = (await _list(c, "other")).requests
            assert not before.HasField("reserved_at")
            await asleep_until(clock, START + 0.6)  # the cold node's boot: the next timer
            clock.set(START + 1.5)  # past the boot and the request's patience (1 s)
            await until(lambda: bool(c.core.engine.queue.aged))
            (aged,) = (await _list(c, "other")).requests
            # It holds a reservation: the capacity is due when the pool's lease ends.
            assert aged.HasField("reserved_at")
            assert START + 1.5 < aged.reserved_at <= START + 101
            assert math.isclose(
                aged.estimated_wait_s,
                aged.reserved_at - aged.queued_at - aged.waited_s,
                abs_tol=0.01,
            )
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=held.lease.lease_id), metadata=c.as_("sci")
            )
            await waiting

    run(scenario())
