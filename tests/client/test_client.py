"""The async client against a real broker on loopback: typed results, typed errors, the
held-lease life cycle (renewal, preemption, release), watch, supply, the admin client,
and reconnecting across a broker restart."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from common import self_signed_cert
from service_support import LIFECYCLE, START, asleep_until, config, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.broker.service.limits import LimitSettings
from bursar.providers.client import (
    AlreadyExists,
    AsyncAdminClient,
    AsyncBrokerClient,
    Backoff,
    BrokerStatus,
    BursarClientError,
    CampaignSpec,
    DimEnvelope,
    FailedPrecondition,
    InvalidArgument,
    Lease,
    LeaseClass,
    LeaseEvent,
    LeaseEventKind,
    LeasePath,
    LeaseState,
    MeterResult,
    NotFound,
    OutOfRange,
    PermissionDenied,
    Refused,
    Shape,
    Supply,
    Unauthenticated,
    Unavailable,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)


def client(c, who: str = "sci", **kw) -> AsyncBrokerClient:
    token = c.admin_token if who == "admin" else c.tokens[who]
    kw.setdefault("backoff", FAST)
    kw.setdefault("rng", 1)
    return AsyncBrokerClient(c.address, token, **kw)


async def _follow(
    clock: ManualClock, done: Callable[[], bool], *others: ManualClock, limit: float = 60.0
) -> int:
    """Until ``done()``: each time the client sleeps on ``clock``, move it (and ``others``,
    the broker's clock) to that wake-up, as if that much time had passed. Returns how many
    times it did; fails if the clock would pass ``START + limit``."""
    moves = 0
    while not done():
        await until(lambda: done() or bool(clock.deadlines()))
        if done():
            break
        t = clock.deadlines()[0]
        assert t <= START + limit, "the client kept sleeping"
        for other in others:
            other.set(max(t, other.now()))
        clock.set(t)
        moves += 1
    return moves


def test_acquire_renew_release_return_typed_leases(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci:
            lease = await sci.acquire(
                {"gpu": 8}, 60, blocking=False, labels={"job": "a"}, lease_class="batch"
            )
            assert isinstance(lease, Lease)
            assert lease.id.startswith("L") and lease.campaign == "sci"
            assert lease.state is LeaseState.ACTIVE and lease.live and not lease.ended
            assert lease.path is LeasePath.WARM and lease.lease_class is LeaseClass.BATCH
            assert dict(lease.size) == {"gpu": 8.0} and len(lease.nodes) == 1
            assert dict(lease.labels) == {"job": "a"}
            assert lease.expires_at == pytest.approx(lease.starts_at + 60)

            renewed = await sci.renew(lease.id, 120)
            assert renewed.id == lease.id and renewed.expires_at > lease.expires_at + 50
            assert (await sci.get_lease(lease.id)).expires_at == renewed.expires_at
            assert [x.id for x in await sci.list_leases()] == [lease.id]

            released = await sci.release(lease.id)
            assert released.state is LeaseState.RELEASED and released.ended
            assert released.end_cause == "released" and released.ended_at is not None
            again = await sci.release(lease.id)  # idempotent
            assert again.state is LeaseState.RELEASED and again.ended_at == released.ended_at
            assert await sci.list_leases() == []

            status = await sci.status()
            assert isinstance(status, BrokerStatus) and status.caller == "campaign:sci"
            supply = await sci.supply(8)
            assert isinstance(supply, Supply) and supply.dims["gpu"].capacity == 24
            assert set(supply.campaigns) == {"sci"}  # a campaign token sees its own
            assert supply.time_to is not None and supply.time_to.warm_s == 0.0
            assert supply.time_to.best_s == 0.0
            metered = await sci.meter("inference", 50)
            assert metered == MeterResult(requested=50.0, granted=50.0, wait_s=0.0)

    run(scenario())


def test_acquire_takes_a_shape_as_keywords_or_an_object(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci:
            async with sci.held_lease({}, 60, shape=Shape(nodes=2, per_node={"gpu": 2})) as h:
                assert len(set(h.lease.nodes)) == 2 and dict(h.lease.size) == {"gpu": 4.0}
            two = await sci.acquire({}, 60, blocking=False, nodes=2, per_node={"gpu": 4})
            assert dict(two.size) == {"gpu": 8.0} and len(set(two.nodes)) == 2
            one = await sci.acquire({"gpu": 4}, 60, blocking=False, shape=Shape(nodes=1))
            assert dict(one.size) == {"gpu": 4.0} and len(one.nodes) == 1
            with pytest.raises(InvalidArgument) as bad:  # no node has 9 GPUs
                await sci.acquire({}, 60, blocking=False, nodes=1, per_node={"gpu": 9})
            (v,) = bad.value.field_violations
            assert v.field == "shape.per_node" and "largest node has 8 GPUs" in v.description
            with pytest.raises(InvalidArgument) as whole:  # a whole node has cores and memory
                await sci.acquire({}, 60, blocking=False, exclusive=True)
            assert "no envelope for cpu" in whole.value.field_violations[0].description
            with pytest.raises(ValueError, match="not both"):
                await sci.acquire({"gpu": 1}, 60, shape=Shape(nodes=1), nodes=1)
            supply = await sci.supply()
            # 12 GPUs on two nodes: one full, one with 4 free next to partly used cores.
            assert supply.dims["gpu"].stranded == 0.0 and supply.dims["gpu"].partial_free == 4.0

    run(scenario())


# sci's burst below the pool's 24 GPUs, so that it binds (a burst as large as the pool binds
# nothing the pool does not).
_SCI_BURST_20 = LIFECYCLE.replace(
    "[campaigns.sci.gpu]\nsustained = 8\nburst = 24",
    "[campaigns.sci.gpu]\nsustained = 8\nburst = 20",
)
assert _SCI_BURST_20 != LIFECYCLE


def test_each_error_type_comes_from_a_real_server_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with (
            serve(tmp_path, config(_SCI_BURST_20), clock=clock) as c,
            client(c) as sci,
            client(c, "other") as other,
        ):
            held = await sci.acquire({"gpu": 16}, 60, blocking=False)

            with pytest.raises(Refused) as refused:  # 16 + 16 > burst 20
                await sci.acquire({"gpu": 16}, 60, blocking=False)
            e = refused.value
            assert e.reason == "ABOVE_BURST" and e.retry_after > 0 and math.isfinite(e.retry_after)
            assert "burst ceiling" in e.message and e.metadata["campaign"] == "sci"

            blocked = asyncio.ensure_future(sci.acquire({"gpu": 16}, 60, timeout=0.5))
            await until(lambda: bool(c.core.engine.pending))  # queued
            clock.advance(0.5)  # the wait runs out on the broker's clock
            with pytest.raises(Refused) as waited:  # blocking, not granted in time
                await blocked
            assert waited.value.reason == "ABOVE_BURST" and "timeout" in waited.value.message
            assert float(waited.value.metadata["waited_s"]) == 0.5

            with pytest.raises(NotFound) as nf:
                await sci.get_lease("L999")
            assert "L999" in nf.value.message

            with pytest.raises(PermissionDenied) as denied:
                await other.release(held.id)
            assert denied.value.reason == "OTHER_CAMPAIGN"

            with pytest.raises(InvalidArgument) as bad:
                await sci.acquire({"gpu": 0}, 60, blocking=False)
            assert bad.value.reason == "INVALID_ARGUMENT" and bad.value.field_violations

            with pytest.raises(OutOfRange) as too_long:  # past max_lease_s = 3600
                await sci.acquire({"gpu": 8}, 7200, blocking=False)
            assert isinstance(too_long.value, InvalidArgument)

            await sci.release(held.id)
            with pytest.raises(FailedPrecondition) as ended:
                await sci.renew(held.id, 30)
            assert "already ended" in ended.value.message

            async with AsyncBrokerClient(c.address, "bsr_not-a-token") as stranger:
                with pytest.raises(Unauthenticated) as unauth:
                    await stranger.status()
            assert unauth.value.reason == "INVALID_TOKEN"

            async with AsyncAdminClient(c.address, c.tokens["sci"]) as not_admin:
                with pytest.raises(PermissionDenied) as admin_only:
                    await not_admin.list_campaigns()
            assert admin_only.value.reason == "ADMIN_ONLY"

            for err in (e, nf.value, denied.value, bad.value, ended.value, unauth.value):
                assert isinstance(err, BursarClientError) and str(err)

    run(scenario())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_broker_is_retried_with_backoff_then_unavailable() -> None:
    async def scenario() -> None:
        target = f"127.0.0.1:{_free_port()}"
        clock = ManualClock(START)
        async with AsyncBrokerClient(
            target, "t", backoff=FAST, rng=1, retry_timeout_s=0.5, clock=clock
        ) as cl:
            call = asyncio.ensure_future(cl.status())
            # The same seed gives the same delays: the client pauses exactly these, on its
            # clock, and gives up before a pause would end past the 0.5 s retry timeout.
            t, pauses = START, 0
            for delay in FAST.delays(random.Random(1)):
                if t + delay > START + 0.5:
                    break
                t += delay
                await asleep_until(clock, t)
                assert not call.done()
                clock.set(t)
                pauses += 1
            with pytest.raises(Unavailable) as exc:
                await call
            assert pauses >= 2 and clock.deadlines() == []
            assert exc.value.message

    run(scenario())


def test_backoff_is_exponential_capped_and_reproducible_from_its_seed() -> None:
    b = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, jitter=0.5)
    first = [d for d, _ in zip(b.delays(random.Random(7)), range(8), strict=False)]
    again = [d for d, _ in zip(b.delays(random.Random(7)), range(8), strict=False)]
    assert first == again
    caps = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(cap * 0.5 <= d <= cap for d, cap in zip(first, caps, strict=True))
    no_jitter = Backoff(initial_s=0.1, max_s=1.0, jitter=0.0).delays(random.Random(0))
    assert [next(no_jitter) for _ in range(5)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    with pytest.raises(ValueError):
        Backoff(initial_s=2.0, max_s=1.0)


def test_rate_limited_calls_wait_out_the_retry_delay(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = LimitSettings(rate=20, burst=2, max_streams=8)
        clock, client_clock = ManualClock(START), ManualClock(START)
        async with (
            serve(tmp_path, limits=limits, clock=clock) as c,
            client(c, clock=client_clock) as sci,
        ):

            async def six() -> None:
                for _ in range(6):
                    await sci.status()  # 2 at once, then one per 50 ms

            calls = asyncio.ensure_future(six())
            pauses = await _follow(client_clock, calls.done, clock)
            await calls
            # Four calls past the burst, at 20 a second: the client waited out at least
            # 0.2 s of the limiter's clock, pausing each time it was told to.
            assert pauses >= 4 and clock.now() >= START + 0.2 - 1e-9

    run(scenario())


def test_held_lease_renews_a_short_lease_past_its_duration_and_releases(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c, client(c, clock=clock) as sci:
            async with sci.held_lease({"gpu": 8}, 1.0, renew_margin_s=0.5) as h:
                assert h.active.is_set() and h.lease.state is LeaseState.ACTIVE
                assert h.lease.expires_at == START + 1.0
                # Renewed 0.5 s before each expiry, each time for another second.
                for k in range(1, 6):
                    renew_at = START + 0.5 * k
                    await asleep_until(clock, renew_at)
                    assert h.renewals == k - 1
                    clock.set(renew_at)
                    await until(lambda k=k: h.renewals == k)
                    assert h.lease.expires_at == renew_at + 1.0
                live = await sci.get_lease(h.id)  # at START + 2.5: well past the 1 s duration
                assert live.state is LeaseState.ACTIVE and live.expires_at == START + 3.5
                assert not h.ended.is_set() and h.error is None
            assert h.ended.is_set() and h.lease.state is LeaseState.RELEASED
            assert h.lease.size == {"gpu": 8.0}  # what it was is kept
            assert (await sci.get_lease(h.id)).state is LeaseState.RELEASED
            assert await h.release() == h.lease  # idempotent

    run(scenario())


def test_held_lease_is_released_when_the_block_raises(tmp_path: Path) -> None:
    class Boom(Exception):
        pass

    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci:
            handle = None
            with pytest.raises(Boom):
                async with sci.held_lease({"gpu": 8}, 30) as handle:
                    raise Boom
            assert handle is not None
            assert (await sci.get_lease(handle.id)).state is LeaseState.RELEASED
            assert await sci.list_leases() == []

    run(scenario())


def test_a_preemption_warning_reaches_the_handle_then_the_revocation(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci, client(c, "backfill") as back:
            warned: list[LeaseEvent] = []

            async def drain(ev: LeaseEvent) -> None:
                warned.append(ev)

            async with back.held_lease({"gpu": 16}, 30, on_preempt=drain) as h:
                assert h.lease.preemptible and h.lease.path is LeasePath.WARM
                claim = await sci.acquire({"gpu": 8}, 30, blocking=False)
                assert claim.path is LeasePath.RECLAIM and claim.state is LeaseState.STARTING

                await asyncio.wait_for(h.preempted.wait(), 5)
                assert h.preempt_event is not None
                assert h.preempt_event.kind is LeaseEventKind.PREEMPT_WARNING
                assert h.preempt_deadline == pytest.approx(claim.starts_at)
                assert h.preempt_event.for_request == claim.id
                assert h.lease.state is LeaseState.PREEMPTING
                await asyncio.wait_for(h.ended.wait(), 5)
                assert h.end_event is not None and h.end_event.kind is LeaseEventKind.REVOKED
                assert h.end_event.cause == "reclaimed"
                assert [ev.kind for ev in warned] == [LeaseEventKind.PREEMPT_WARNING]
            assert h.lease.state is LeaseState.REVOKED and h.error is None
            assert (await sci.get_lease(claim.id)).state is LeaseState.ACTIVE

    run(scenario())


def test_watch_reports_typed_events_and_ends_with_its_leases(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci:
            earlier = await sci.acquire({"gpu": 8}, 30, blocking=False)
            everything = sci.watch()  # the stream opens on the first read
            first = await asyncio.wait_for(anext(everything), 5)
            assert first.snapshot and first.kind is LeaseEventKind.ACTIVATED
            assert first.lease.id == earlier.id and first.lease.state is LeaseState.ACTIVE
            await sci.release(earlier.id)
            gone = await asyncio.wait_for(anext(everything), 5)
            assert gone.kind is LeaseEventKind.RELEASED and not gone.snapshot

            lease = await sci.acquire({"gpu": 8}, 30, blocking=False)
            granted = await asyncio.wait_for(anext(everything), 5)
            assert granted.kind is LeaseEventKind.GRANTED and granted.lease.id == lease.id

            one = sci.watch(lease.id)
            snap = await asyncio.wait_for(anext(one), 5)
            assert snap.snapshot and snap.kind is LeaseEventKind.ACTIVATED
            await sci.renew(lease.id, 60)
            await sci.release(lease.id)
            kinds = [ev.kind async for ev in one]  # ends once the lease has ended
            assert kinds == [LeaseEventKind.RENEWED, LeaseEventKind.RELEASED]
            rest = [await asyncio.wait_for(anext(everything), 5) for _ in range(2)]
            assert [ev.kind for ev in rest] == kinds
            await everything.aclose()

    run(scenario())


def test_watch_supply_streams_snapshots_as_the_pool_changes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci:
            stream = sci.watch_supply(min_interval_s=0.05, max_interval_s=5, units=8)
            first = await asyncio.wait_for(anext(stream), 5)
            assert first.dims["gpu"].available_warm == 16 and first.time_to is not None
            await sci.acquire({"gpu": 8}, 30, blocking=False)
            second = await asyncio.wait_for(anext(stream), 5)
            assert second.dims["gpu"].available_warm == 8
            assert second.campaigns["sci"].held == {"gpu": 8.0}
            await stream.aclose()

    run(scenario())


def test_admin_client_creates_updates_gets_lists_and_rotates(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, AsyncAdminClient(c.address, c.admin_token) as admin:
            spec = CampaignSpec(
                "agents",
                {"gpu": DimEnvelope(guarantee=0, sustained=4, burst=8, bucket=5000)},
                LeaseClass.INTERACTIVE,
            )
            created = await admin.create_campaign(spec)
            assert created.campaign.spec == spec and created.token.startswith("bsr_")
            assert created.campaign.token_issued_at is not None
            with pytest.raises(AlreadyExists):
                await admin.create_campaign(spec)

            async with AsyncBrokerClient(c.address, created.token) as agents:
                lease = await agents.acquire({"gpu": 8}, 30, blocking=False)
                assert lease.lease_class is LeaseClass.INTERACTIVE

            bigger = CampaignSpec("agents", {"gpu": DimEnvelope(0, 4, 16, None)}, "batch")  # type: ignore[arg-type]
            updated = await admin.update_campaign(bigger)
            assert updated.spec.envelopes["gpu"] == DimEnvelope(0, 4, 16, None)
            assert updated.spec.lease_class is LeaseClass.BATCH and updated.leases == 1
            assert math.isinf(updated.bucket["gpu"])
            got = await admin.get_campaign("agents")
            assert got.held == {"gpu": 8.0}
            names = [x.name for x in await admin.list_campaigns()]
            assert names == sorted(names) and "agents" in names
            with pytest.raises(NotFound):
                await admin.get_campaign("nope")

            new_token = await admin.rotate_token("agents")
            async with AsyncBrokerClient(c.address, created.token) as stale:
                with pytest.raises(Unauthenticated):
                    await stale.status()
            async with AsyncBrokerClient(c.address, new_token) as fresh:
                assert (await fresh.status()).caller == "campaign:agents"

    run(scenario())


def test_admin_token_acts_for_a_named_campaign(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c, "admin", campaign="sci") as admin:
            lease = await admin.acquire({"gpu": 8}, 30, blocking=False)
            assert lease.campaign == "sci"
            async with client(c, "admin") as everyone:
                assert [x.id for x in await everyone.list_leases()] == [lease.id]
                assert await everyone.list_leases("other") == []
                supply = await everyone.supply()
                assert set(supply.campaigns) == {"sci", "other", "backfill"}

    run(scenario())


def test_a_held_lease_and_a_watch_survive_a_broker_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stop the broker while a client holds a lease, restart it on the same port and
    state directory: the client reconnects with backoff, renews, and keeps the lease; an
    open watch resumes where it left off and reports what happened while it was away."""

    caplog.set_level(logging.INFO, logger="bursar.providers.client")

    async def scenario() -> None:
        port = _free_port()
        # The broker's clock and the clients' clock move together (the test moves both),
        # but apart: what the clients sleep for is on theirs alone.
        clock, client_clock = ManualClock(START), ManualClock(START)
        async with serve(tmp_path, port=port, clock=clock) as c:
            sci = client(c, retry_timeout_s=20, clock=client_clock)
            other = client(c, "other", retry_timeout_s=20, clock=client_clock)
            tokens = dict(c.tokens)
            # The first renewal falls due 0.5 s in: while the broker is down.
            handle = sci.held_lease({"gpu": 8}, 10.0, renew_margin_s=9.5)
            await handle.start()
            watch = other.watch()
            short = await other.acquire({"gpu": 8}, 0.75, blocking=False)
            granted = await asyncio.wait_for(anext(watch), 5)
            assert granted.lease.id == short.id
            # Read the next event in the background: it arrives after the restart.
            after = asyncio.ensure_future(anext(watch))

        # Down past `short`'s expiry, and until the renewal has been refused for it: the
        # renewal and the watch retry meanwhile.
        def renewal_retried() -> bool:
            return any(r.getMessage().startswith("Renew to") for r in caplog.records)

        await _follow(
            client_clock, lambda: client_clock.now() >= START + 1.0 and renewal_retried(), clock
        )
        assert handle.renewals == 0 and not after.done()
        async with serve(tmp_path, port=port, clock=clock) as c2:
            assert c2.tokens == tokens  # tokens live on in the state dir
            await _follow(client_clock, lambda: after.done() and handle.renewals >= 1, clock)
            ev = after.result()
            assert ev.lease.id == short.id and ev.kind is LeaseEventKind.EXPIRED
            # Not seen live: the resumed stream replayed it from the broker's journal, from
            # just after the last event this stream had delivered.
            assert not ev.snapshot and ev.seq > granted.seq
            assert ev.at == short.expires_at == START + 0.75  # expired on the broker's clock
            retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
            assert any(m.startswith("Renew to") for m in retried), retried
            # Renewing again, against the new server, until well past the lease's duration.
            await _follow(client_clock, lambda: client_clock.now() > START + 12.0, clock)
            assert handle.renewals >= 2 and not handle.ended.is_set() and handle.error is None
            # Each renewal was for 10 s, sent when both clocks read the same: the next one
            # is due 9.5 s before the expiry the broker gave it.
            await until(lambda: len(client_clock.deadlines()) == 1)
            assert client_clock.deadlines() == [handle.lease.expires_at - 9.5]
            live = await sci.get_lease(handle.id)
            assert live.state is LeaseState.ACTIVE and live.expires_at > clock.now()
            final = await handle.release()
            assert final.state is LeaseState.RELEASED
            await watch.aclose()
            await sci.close()
            await other.close()

    run(scenario(), timeout_s=40)


def test_many_held_leases_share_one_watch_stream(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = LimitSettings(rate=10_000, burst=10_000, max_streams=2)
        async with serve(tmp_path, limits=limits) as c, client(c) as sci:
            handles = [sci.held_lease({"gpu": 2}, 30) for _ in range(6)]

            async def streams(n: int) -> int:
                # The server counts a stream open or closed as it handles the call or its
                # cancellation, apart from the client's side: poll, for up to 10 s.
                for _ in range(200):
                    if (got := (await sci.status()).open_streams) == n:
                        return got
                    await asyncio.sleep(0.05)
                return (await sci.status()).open_streams

            for h in handles:
                await h.start()
            assert await streams(1) == 1
            assert all(h.active.is_set() and h.error is None for h in handles)
            # Events reach the right handle: release two behind their handles' backs.
            for h in handles[:2]:
                await sci.release(h.id)
            for h in handles[:2]:
                await asyncio.wait_for(h.ended.wait(), 5)
                assert h.end_event is not None and h.end_event.lease.id == h.id
            assert not any(h.ended.is_set() for h in handles[2:])
            for h in handles:
                await h.__aexit__(None, None, None)
            assert await sci.list_leases() == []
            assert await streams(0) == 0  # closed with the last handle

    run(scenario())


def test_a_cold_path_held_lease_becomes_active_when_its_node_is_up(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c, client(c) as sci:
            await sci.acquire({"gpu": 16}, 30, blocking=False)  # every warm GPU
            async with sci.held_lease({"gpu": 8}, 30) as h:
                assert h.lease.path is LeasePath.COLD and h.lease.state is LeaseState.STARTING
                assert not h.active.is_set() and h.lease.nodes == ()
                await asyncio.wait_for(h.active.wait(), 5)
                assert h.lease.state is LeaseState.ACTIVE and h.lease.nodes == ("c000",)

    run(scenario())


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_with_the_servers_certificate_as_root(tmp_path: Path) -> None:
    key, cert = self_signed_cert(tmp_path) or (None, None)
    assert key is not None and cert is not None

    async def scenario() -> None:
        async with serve(tmp_path / "state", tls_cert=cert, tls_key=key) as c:
            for tls in (cert, str(cert), cert.read_bytes()):
                async with client(c, tls=tls) as sci:
                    assert (await sci.status()).caller == "campaign:sci"
            async with client(c, retry_timeout_s=0.2) as plaintext:
                with pytest.raises(Unavailable):
                    await plaintext.status()

    run(scenario())


def test_a_blocking_acquire_waits_across_a_restart_without_leaking_a_lease(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        port = _free_port()
        async with serve(tmp_path, port=port) as c:
            sci, other = client(c), client(c, "other", retry_timeout_s=20)
            await sci.acquire({"gpu": 16}, 60, blocking=False)  # every warm GPU
            cold = await sci.acquire({"gpu": 8}, 60, blocking=False)  # and the cold one
            waiting = asyncio.ensure_future(other.acquire({"gpu": 8}, 30, timeout=8))
            await until(lambda: bool(c.core.engine.pending))  # queued: the pool is full
        async with serve(tmp_path, port=port) as c2:
            # Withdrawn at shutdown, the request is sent again and queued by the new server.
            await until(lambda: bool(c2.core.engine.pending))
            assert not waiting.done()
            await sci.release(cold.id)
            lease = await asyncio.wait_for(waiting, 10)
            assert lease.state in (LeaseState.STARTING, LeaseState.ACTIVE)
            assert [x.id for x in await other.list_leases()] == [lease.id]  # one, not two
        await sci.close()
        await other.close()

    run(scenario())
