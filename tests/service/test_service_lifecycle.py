"""The lease life cycle over real gRPC: warm, reclaim, cold, renew, release, expire, wait."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from service_support import (
    START,
    asleep_until,
    config,
    fails,
    md,
    next_event,
    run,
    serve,
    until,
)

from bursar.broker.clock import ManualClock
from bursar.broker.service.core import ServiceCore
from bursar.broker.service.server import create_server
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

K = pb.LeaseEventKind


def _kinds(events: list[pb.LeaseEvent]) -> list[str]:
    return [K.Name(e.kind).removeprefix("LEASE_EVENT_KIND_") for e in events]


def test_warm_acquire_renew_release_and_release_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            got = await c.acquire("sci", 8, duration_s=60, labels={"job": "a"})
            lease = got.lease
            assert lease.state == pb.LEASE_STATE_ACTIVE
            assert lease.path == pb.LEASE_PATH_WARM
            assert lease.campaign == "sci" and dict(lease.size) == {"gpu": 8.0}
            assert len(lease.nodes) == 1 and dict(lease.labels) == {"job": "a"}
            assert lease.granted_at == lease.starts_at == START
            assert lease.expires_at == START + 60
            assert got.price > 0 and got.credits > 0 and got.waited_s == 0

            renewed = await c.broker.Renew(
                pb.RenewRequest(lease_id=lease.lease_id, duration_s=120), metadata=c.as_("sci")
            )
            assert renewed.lease.expires_at > lease.expires_at + 50
            assert renewed.credits > 0

            fetched = await c.broker.GetLease(
                pb.GetLeaseRequest(lease_id=lease.lease_id), metadata=c.as_("sci")
            )
            assert fetched.expires_at == renewed.lease.expires_at
            listed = await c.broker.ListLeases(pb.ListLeasesRequest(), metadata=c.as_("sci"))
            assert [x.lease_id for x in listed.leases] == [lease.lease_id]

            released = await c.broker.Release(
                pb.ReleaseRequest(lease_id=lease.lease_id), metadata=c.as_("sci")
            )
            assert released.lease.state == pb.LEASE_STATE_RELEASED
            assert not released.already_ended and released.refund_credits > 0
            entries = c.journal_len()
            again = await c.broker.Release(
                pb.ReleaseRequest(lease_id=lease.lease_id), metadata=c.as_("sci")
            )
            assert again.already_ended and again.lease.state == pb.LEASE_STATE_RELEASED
            assert again.refund_credits == 0
            assert c.journal_len() == entries  # idempotent: nothing journaled

    run(scenario())


def test_reclaim_path_warns_the_victim_on_watch_then_activates_the_claimant(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c:
            victims = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("backfill"))
            claimants = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
            # The server sends headers once the stream is registered: from then on, no
            # event is missed.
            await victims.initial_metadata()
            await claimants.initial_metadata()
            back = await c.acquire("backfill", 16)
            assert back.lease.path == pb.LEASE_PATH_WARM
            ev = await next_event(victims)
            assert ev.kind == K.LEASE_EVENT_KIND_GRANTED and not ev.snapshot

            got = await c.acquire("sci", 8)
            lease = got.lease
            assert lease.path == pb.LEASE_PATH_RECLAIM
            # The victim gets the pool's grace period (0.6 s) to drain.
            assert lease.state == pb.LEASE_STATE_STARTING and lease.starts_at == START + 0.6
            assert list(lease.nodes) == []

            warn = await next_event(victims)
            assert warn.kind == K.LEASE_EVENT_KIND_PREEMPT_WARNING
            assert warn.lease.lease_id == back.lease.lease_id
            assert warn.lease.state == pb.LEASE_STATE_PREEMPTING
            assert abs(warn.deadline - lease.starts_at) < 1e-6
            assert warn.for_request == lease.lease_id
            # Nothing more happens until the clock reaches the deadline.
            await asleep_until(clock, lease.starts_at)
            clock.set(START + 0.5)
            victim = await c.broker.GetLease(
                pb.GetLeaseRequest(lease_id=back.lease.lease_id), metadata=c.as_("backfill")
            )
            assert victim.state == pb.LEASE_STATE_PREEMPTING
            clock.set(lease.starts_at)
            revoked = await next_event(victims)
            assert revoked.kind == K.LEASE_EVENT_KIND_REVOKED and revoked.cause == "reclaimed"
            assert revoked.at == warn.deadline

            granted = await next_event(claimants)
            assert granted.kind == K.LEASE_EVENT_KIND_GRANTED
            activated = await next_event(claimants)
            assert activated.kind == K.LEASE_EVENT_KIND_ACTIVATED
            assert activated.lease.state == pb.LEASE_STATE_ACTIVE and activated.lease.nodes
            assert activated.at == lease.starts_at
            victims.cancel()
            claimants.cancel()

    run(scenario())


def test_cold_path_grant_starts_later_and_watch_reports_activation(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c:
            await c.acquire("sci", 16)  # every warm GPU
            got = await c.acquire("sci", 8)
            lease = got.lease
            assert lease.path == pb.LEASE_PATH_COLD and lease.state == pb.LEASE_STATE_STARTING
            assert lease.starts_at == START + 0.6  # the pool's boot latency
            watch = c.broker.Watch(
                pb.WatchRequest(lease_ids=[lease.lease_id]), metadata=c.as_("sci")
            )
            snap = await next_event(watch)
            assert snap.snapshot and snap.kind == K.LEASE_EVENT_KIND_GRANTED
            await asleep_until(clock, lease.starts_at)  # the node's boot is the next timer
            clock.set(lease.starts_at)
            activated = await next_event(watch)
            assert activated.kind == K.LEASE_EVENT_KIND_ACTIVATED
            assert activated.at == lease.starts_at
            assert list(activated.lease.nodes) == ["c000"]
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=lease.lease_id), metadata=c.as_("sci")
            )
            released = await next_event(watch)
            assert released.kind == K.LEASE_EVENT_KIND_RELEASED
            # Watching named leases ends once they have all ended.
            assert await next_event(watch) is grpc.aio.EOF
            assert (await watch.code()) == grpc.StatusCode.OK

    run(scenario())


def test_unrenewed_lease_expires_on_the_timer(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c:
            got = await c.acquire("sci", 8, duration_s=0.5)
            assert got.lease.expires_at == START + 0.5
            watch = c.broker.Watch(
                pb.WatchRequest(lease_ids=[got.lease.lease_id]), metadata=c.as_("sci")
            )
            assert _kinds([await next_event(watch)]) == ["ACTIVATED"]
            await asleep_until(clock, got.lease.expires_at)
            clock.set(START + 0.25)  # short of the expiry: still live
            live = await c.broker.GetLease(
                pb.GetLeaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
            )
            assert live.state == pb.LEASE_STATE_ACTIVE
            clock.set(got.lease.expires_at)
            expired = await next_event(watch)
            assert _kinds([expired]) == ["EXPIRED"] and expired.at == got.lease.expires_at
            lease = await c.broker.GetLease(
                pb.GetLeaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
            )
            assert lease.state == pb.LEASE_STATE_EXPIRED and lease.ended_at == got.lease.expires_at
            # Releasing an expired lease is fine (idempotent) and says how it ended.
            rel = await c.broker.Release(
                pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
            )
            assert rel.already_ended and rel.lease.state == pb.LEASE_STATE_EXPIRED
            # Renewing it is a failed precondition.
            err = await fails(
                c.broker.Renew(
                    pb.RenewRequest(lease_id=got.lease.lease_id, duration_s=10),
                    metadata=c.as_("sci"),
                )
            )
            assert err.code == grpc.StatusCode.FAILED_PRECONDITION

    run(scenario())


def test_blocking_acquire_waits_for_capacity_and_gets_the_grant(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c:
            first = await c.acquire("other", 16)
            await c.acquire("sci", 8)  # the cold node: now nothing is free
            waiting = asyncio.ensure_future(c.acquire("sci", 8, timeout_s=10))
            await until(lambda: bool(c.core.engine.pending))  # queued
            clock.advance(0.25)
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=first.lease.lease_id), metadata=c.as_("other")
            )
            got = await waiting
            assert got.lease.state == pb.LEASE_STATE_ACTIVE and got.waited_s == 0.25
            assert got.lease.granted_at == START + 0.25

    run(scenario())


def test_blocking_acquire_that_times_out_withdraws_its_request(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c:
            await c.acquire("other", 16)
            await c.acquire("sci", 8)
            failing = asyncio.ensure_future(fails(c.acquire("sci", 8, timeout_s=0.5)))
            await asleep_until(clock, START + 0.5)  # the call's deadline, on the clock
            clock.set(START + 0.5)
            err = await failing
            assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.reason == "POOL_FULL" and err.retry_after_s is not None
            assert float(err.metadata["waited_s"]) == 0.5
            assert not c.core.engine.pending
            kinds = [
                d.kind
                for _, _, ds in c.core.runtime.journal.entries()
                for d in ds
                if getattr(d, "request_id", None) == err.metadata["request_id"]
            ]
            assert kinds == ["queue", "cancelled"]

    run(scenario())


def test_a_client_that_gives_up_leaves_no_request_or_lease_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            first = await c.acquire("other", 16)
            await c.acquire("sci", 8)
            with_deadline = c.broker.Acquire(
                pb.AcquireRequest(size={"gpu": 8}, duration_s=30, timeout_s=60),
                metadata=c.as_("sci"),
                timeout=0.3,
            )
            err = await fails(with_deadline)
            assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
            await until(lambda: not c.core.engine.pending)  # the server saw the cancellation
            # Capacity freed later goes to nobody: the request was withdrawn.
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=first.lease.lease_id), metadata=c.as_("other")
            )
            leases = await c.broker.ListLeases(pb.ListLeasesRequest(), metadata=c.as_("sci"))
            assert len(leases.leases) == 1

    run(scenario())


def test_meter_grants_what_the_bucket_holds_and_says_how_long_to_wait(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            got = await c.broker.Meter(
                pb.MeterRequest(dim="inference", amount=150), metadata=c.as_("sci")
            )
            assert got.requested == 150 and got.granted == 150 and got.wait_s == 0
            big = await c.broker.Meter(
                pb.MeterRequest(dim="inference", amount=5000), metadata=c.as_("sci")
            )
            assert big.granted <= 200 and big.wait_s > 0

    run(scenario())


def test_supply_pull_and_stream(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            s = await c.broker.GetSupply(pb.SupplyRequest(units=8), metadata=c.as_("sci"))
            assert s.dims["gpu"].capacity == 24 and s.dims["gpu"].warm_free == 16
            assert s.dims["gpu"].cold == 8 and s.price > 0
            assert set(s.campaigns) == {"sci"}  # a campaign sees its own signals only
            assert s.campaigns["sci"].bucket["gpu"] == 100000
            assert s.time_to.warm_s == 0 and s.time_to.cold_s == 0.6
            everyone = await c.broker.GetSupply(pb.SupplyRequest(), metadata=c.as_("admin"))
            assert set(everyone.campaigns) == {"sci", "other", "backfill"}
            assert everyone.campaigns["backfill"].bucket["gpu"] == float("inf")

            stream = c.broker.WatchSupply(
                pb.WatchSupplyRequest(min_interval_s=0.05), metadata=c.as_("sci")
            )
            await stream.initial_metadata()
            first = await next_event(stream)
            assert first.dims["gpu"].warm_free == 16
            await c.acquire("sci", 8)
            second = await next_event(stream)
            assert second.dims["gpu"].warm_free == 8 and second.at >= first.at
            assert second.campaigns["sci"].held["gpu"] == 8
            stream.cancel()

    run(scenario())


def test_list_decisions_filters_and_pages(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            a = await c.acquire("sci", 8)
            await c.acquire("other", 8)
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=a.lease.lease_id), metadata=c.as_("sci")
            )
            mine = await c.broker.ListDecisions(pb.ListDecisionsRequest(), metadata=c.as_("sci"))
            assert {d.campaign for d in mine.decisions} == {"sci"}
            kinds = [pb.DecisionKind.Name(d.kind) for d in mine.decisions]
            assert kinds == [
                "DECISION_KIND_CAMPAIGN",
                "DECISION_KIND_GRANT",
                "DECISION_KIND_RELEASE",
            ]
            assert mine.next_seq == 0
            grants = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(kinds=[pb.DECISION_KIND_GRANT]), metadata=c.as_("admin")
            )
            assert [d.campaign for d in grants.decisions] == ["sci", "other"]
            assert json.loads(grants.decisions[0].json)["lease_id"] == a.lease.lease_id
            one = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(lease_id=a.lease.lease_id), metadata=c.as_("admin")
            )
            assert [d.lease_id for d in one.decisions] == [a.lease.lease_id] * 2
            page = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(limit=2), metadata=c.as_("admin")
            )
            assert len(page.decisions) == 2 and page.next_seq > 0
            rest = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(start_seq=page.next_seq), metadata=c.as_("admin")
            )
            total = await c.broker.ListDecisions(pb.ListDecisionsRequest(), metadata=c.as_("admin"))
            assert len(page.decisions) + len(rest.decisions) == len(total.decisions)
            # A start past anything SQLite can hold (the field is a uint64) finds nothing.
            for start in (2**63, 2**64 - 1):
                far = await c.broker.ListDecisions(
                    pb.ListDecisionsRequest(start_seq=start), metadata=c.as_("admin")
                )
                assert (len(far.decisions), far.next_seq) == (0, 0)

    run(scenario())


def test_status_health_reflection_and_metrics(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, metrics_port=0) as c:
            await c.acquire("sci", 8)
            st = await c.broker.GetStatus(pb.GetStatusRequest(), metadata=c.as_("sci"))
            assert st.caller == "campaign:sci" and st.leases == 1 and st.campaigns == 3
            assert st.journal_entries == c.journal_len() and st.now >= st.engine_now

            health = health_pb2_grpc.HealthStub(c.channel)
            for name in ("", "bursar.v1.Broker", "bursar.v1.Admin"):
                h = await health.Check(health_pb2.HealthCheckRequest(service=name))
                assert h.status == health_pb2.HealthCheckResponse.SERVING

            refl = reflection_pb2_grpc.ServerReflectionStub(c.channel)
            call = refl.ServerReflectionInfo()
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            resp = await call.read()
            await call.done_writing()
            names = {s.name for s in resp.list_services_response.service}
            assert {"bursar.v1.Broker", "bursar.v1.Admin", "grpc.health.v1.Health"} <= names

            c.core.metrics.refresh(c.core.runtime, c.core.now(), 0)
            url = f"http://127.0.0.1:{c.running.metrics_port}/metrics"
            text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
            body = text.decode()
            assert 'bursar_leases{campaign="sci",state="active"} 1.0' in body
            assert 'bursar_grant_latency_seconds_count{path="warm"} 1.0' in body
            assert "bursar_price_credits_per_unit_hour " in body
            assert "bursar_journal_entries " in body
            assert 'bursar_bucket_level_unit_seconds{campaign="sci",dim="gpu"}' in body
            # GPU-only leases strand no GPU; the node holding one is partly used.
            assert 'bursar_fragmentation_units{dim="gpu",kind="stranded"} 0.0' in body
            assert 'bursar_fragmentation_units{dim="gpu",kind="partial_free"}' in body

    run(scenario())


def test_admin_creates_updates_lists_and_rotates(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            spec = pb.CampaignSpec(name="agents", lease_class=pb.LEASE_CLASS_INTERACTIVE)
            spec.envelopes["gpu"].burst = 8
            spec.envelopes["gpu"].sustained = 8
            spec.envelopes["gpu"].bucket = 1000
            created = await c.admin.CreateCampaign(
                admin_pb2.CreateCampaignRequest(spec=spec), metadata=c.as_("admin")
            )
            token = created.token
            assert created.campaign.spec.name == "agents" and created.campaign.token_issued_at > 0
            assert token.startswith("bsr_")
            got = await c.broker.Acquire(
                pb.AcquireRequest(size={"gpu": 4}, duration_s=10),
                metadata=(("authorization", f"Bearer {token}"),),
            )
            assert got.lease.lease_class == pb.LEASE_CLASS_INTERACTIVE

            spec.envelopes["gpu"].burst = 16
            updated = await c.admin.UpdateCampaign(
                admin_pb2.UpdateCampaignRequest(spec=spec), metadata=c.as_("admin")
            )
            assert updated.spec.envelopes["gpu"].burst == 16 and updated.leases == 1
            one = await c.admin.GetCampaign(
                admin_pb2.GetCampaignRequest(name="agents"), metadata=c.as_("admin")
            )
            assert one.held["gpu"] == 4
            listed = await c.admin.ListCampaigns(
                admin_pb2.ListCampaignsRequest(), metadata=c.as_("admin")
            )
            assert [x.spec.name for x in listed.campaigns] == ["agents", "backfill", "other", "sci"]

            rotated = await c.admin.RotateToken(
                admin_pb2.RotateTokenRequest(campaign="sci"), metadata=c.as_("admin")
            )
            err = await fails(c.acquire("sci", 1))
            assert err.code == grpc.StatusCode.UNAUTHENTICATED and err.reason == "INVALID_TOKEN"
            c.tokens["sci"] = rotated.token
            assert (await c.acquire("sci", 1)).lease.campaign == "sci"
            assert "sci" not in json.loads((tmp_path / "tokens.json").read_text())

    run(scenario())


def test_create_server_binds_a_free_port_apart_from_serve(tmp_path: Path) -> None:
    async def scenario() -> None:
        core = ServiceCore.open(tmp_path, config())
        try:
            server, port = create_server("127.0.0.1:0", core)
            assert port > 0
            await server.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                token = json.loads((tmp_path / "tokens.json").read_text())["sci"]
                st = await pbg.BrokerStub(ch).GetStatus(pb.GetStatusRequest(), metadata=md(token))
                assert st.caller == "campaign:sci"
            await server.stop(None)
        finally:
            core.close()

    run(scenario())


def test_a_token_rotation_ends_the_streams_the_old_token_opened(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            held = await c.acquire("sci", 4)
            watch = c.broker.Watch(
                pb.WatchRequest(lease_ids=[held.lease.lease_id]), metadata=c.as_("sci")
            )
            supply = c.broker.WatchSupply(
                pb.WatchSupplyRequest(min_interval_s=0.05, max_interval_s=60),
                metadata=c.as_("sci"),
            )
            admin_watch = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("admin"))
            other = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("other"))
            for s in (watch, supply, admin_watch, other):
                await s.initial_metadata()
            await next_event(watch)  # the snapshot
            await next_event(supply)
            await c.admin.RotateToken(
                admin_pb2.RotateTokenRequest(campaign="sci"), metadata=c.as_("admin")
            )
            for s in (watch, supply):
                err = await fails(asyncio.wait_for(next_event(s), 5))
                assert err.code == grpc.StatusCode.UNAUTHENTICATED, err
                assert err.reason == "TOKEN_ROTATED" and "new token" in err.message
            # Streams opened with other tokens go on.
            await c.acquire("other", 2)
            assert (await asyncio.wait_for(next_event(other), 5)).lease.campaign == "other"
            got = await asyncio.wait_for(next_event(admin_watch), 5)
            assert got.lease.campaign in ("sci", "other")
            for s in (admin_watch, other):
                s.cancel()

    run(scenario())
