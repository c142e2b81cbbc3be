"""Bad input changes nothing and the server keeps serving; many clients at once lose
and duplicate no grant."""

from __future__ import annotations

import asyncio
import os
import random
import struct
from collections import Counter
from pathlib import Path

import grpc
from common import varint
from service_support import POOL, config, fails, md, run, serve

from bursar.broker.audit import audit
from bursar.broker.decisions import Cancelled, Granted, Released
from bursar.broker.events import CancelRequest, Release, RequestLease
from bursar.broker.service.limits import LimitSettings
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg


def _field(number: int, wire: int, payload: bytes) -> bytes:
    return varint(number << 3 | wire) + payload


# Raw AcquireRequest bodies that are not what the contract says.
RAW_ACQUIRE = {
    "garbage": b"\xff\xff\xff\xff\xff",
    "truncated length": _field(2, 2, varint(16) + b"abc"),
    "invalid utf-8 in campaign": _field(1, 2, varint(2) + b"\xff\xfe"),
    # duration_s (a double, wire type 1) sent as a varint, size (a map) as fixed64.
    "wrong wire types": _field(3, 0, varint(60)) + _field(2, 1, struct.pack("<d", 8.0)),
    "size entry with a string value": _field(
        2, 2, varint(12) + _field(1, 2, varint(3) + b"gpu") + _field(2, 2, varint(5) + b"eight")
    ),
    "empty": b"",
}


def test_malformed_requests_get_errors_and_change_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            await c.acquire("sci", 8)
            before = c.journal_len()
            digest = c.core.engine.state_digest()
            raw = c.channel.unary_unary("/bursar.v1.Broker/Acquire")
            for name, body in RAW_ACQUIRE.items():
                d = await fails(raw(body, metadata=c.as_("sci")))
                assert d.code == grpc.StatusCode.INVALID_ARGUMENT, (name, d)
            bad = [
                pb.AcquireRequest(size={"gpu": 8}),  # no duration
                pb.AcquireRequest(size={"gpu": float("nan")}, duration_s=10),
                pb.AcquireRequest(size={"gpu": 1}, duration_s=float("inf")),
                pb.AcquireRequest(size={"gpu": 1}, duration_s=10, timeout_s=-1),
                pb.AcquireRequest(size={"gpu": 1}, duration_s=10, timeout_s=float("nan")),
                pb.AcquireRequest(size={"gpu": 1}, duration_s=10, lease_class=99),
                pb.AcquireRequest(size={"gpu": 1}, duration_s=10, labels={"": "x"}),
                pb.AcquireRequest(
                    size={"gpu": 1}, duration_s=10, labels={f"k{i}": "v" for i in range(100)}
                ),
                pb.AcquireRequest(size={f"d{i}": 1 for i in range(20)}, duration_s=10),
                pb.AcquireRequest(size={"gpu": 1, "inference": 5}, duration_s=10),
            ]
            for req in bad:
                d = await fails(c.broker.Acquire(req, metadata=c.as_("sci")))
                assert d.code == grpc.StatusCode.INVALID_ARGUMENT, (req, d)
                assert d.field_violations, d
            for call in (
                c.broker.Release(pb.ReleaseRequest(), metadata=c.as_("sci")),
                c.broker.Renew(pb.RenewRequest(lease_id="x" * 500), metadata=c.as_("sci")),
                c.broker.Meter(pb.MeterRequest(dim="inference"), metadata=c.as_("sci")),
                c.broker.Meter(pb.MeterRequest(amount=5), metadata=c.as_("sci")),
                c.broker.GetSupply(pb.SupplyRequest(units=1, dim="nope"), metadata=c.as_("sci")),
                c.broker.ListDecisions(pb.ListDecisionsRequest(limit=5000), metadata=c.as_("sci")),
                c.broker.ListDecisions(pb.ListDecisionsRequest(kinds=[77]), metadata=c.as_("sci")),
            ):
                d = await fails(call)
                assert d.code == grpc.StatusCode.INVALID_ARGUMENT, d
            # Oversized: beyond the 1 MiB receive limit, refused by gRPC itself.
            huge = pb.AcquireRequest(
                size={"gpu": 1}, duration_s=10, labels={"blob": "x" * (2 << 20)}
            )
            d = await fails(c.broker.Acquire(huge, metadata=c.as_("sci")))
            assert d.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert c.journal_len() == before
            assert c.core.engine.state_digest() == digest
            # And the server carries on.
            got = await c.acquire("sci", 8)
            assert got.lease.state == pb.LEASE_STATE_ACTIVE

    run(scenario())


def test_garbage_on_the_port_is_dropped_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            host, port = c.address.rsplit(":", 1)
            before = c.journal_len()
            payloads = [
                os.urandom(4096),
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + os.urandom(512),  # preface, then noise
                b"\x00" * 65536,
            ]
            idle_reader, idle_writer = await asyncio.open_connection(host, int(port))
            for payload in payloads:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(payload)
                await writer.drain()
                # The server answers (at most an HTTP/2 GOAWAY) and hangs up.
                await asyncio.wait_for(reader.read(), 5)
                writer.close()
            # A connection that says nothing does not hold anyone up.
            st = await c.broker.GetStatus(pb.GetStatusRequest(), metadata=c.as_("sci"))
            assert st.caller == "campaign:sci"
            assert (await c.acquire("sci", 8)).lease.state == pb.LEASE_STATE_ACTIVE
            assert c.journal_len() == before + 1
            idle_writer.close()
            del idle_reader

    run(scenario())


# Eight warm nodes (64 GPUs), four campaigns that may each burst to all of it.
MANY = POOL.replace("count = 2\nwarm = 2", "count = 8\nwarm = 8") + "".join(
    f"""
[campaigns.c{i}]
[campaigns.c{i}.gpu]
sustained = 64
burst = 64
"""
    for i in range(4)
)

CLIENTS = 64
ROUNDS = 8


def test_many_concurrent_clients_lose_and_duplicate_no_grant(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = LimitSettings(rate=100_000, burst=100_000, max_streams=64)
        async with serve(tmp_path, config(MANY), limits=limits) as c:
            campaigns = [f"c{i}" for i in range(4)]
            watches = {
                name: c.broker.Watch(pb.WatchRequest(), metadata=c.as_(name)) for name in campaigns
            }
            for w in watches.values():
                await w.initial_metadata()
            granted: list[str] = []
            refused = Counter()

            async def client(k: int) -> None:
                rng = random.Random(k)
                name = campaigns[k % 4]
                channel = await c.new_channel()
                stub = pbg.BrokerStub(channel)
                for _ in range(ROUNDS):
                    req = pb.AcquireRequest(
                        size={"gpu": rng.choice([1, 2, 4, 8])}, duration_s=30, timeout_s=0.3
                    )
                    try:
                        got = await stub.Acquire(req, metadata=md(c.tokens[name]))
                    except grpc.aio.AioRpcError as err:
                        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
                        refused[name] += 1
                        continue
                    granted.append(got.lease.lease_id)
                    await asyncio.sleep(rng.random() * 0.02)
                    await stub.Release(
                        pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=md(c.tokens[name])
                    )

            await asyncio.gather(*(client(k) for k in range(CLIENTS)))
            assert len(granted) > CLIENTS * ROUNDS // 2
            assert len(set(granted)) == len(granted), "a lease id was handed out twice"

            # Every grant in the journal went to a client, or was given back by the
            # service when a waiting client's timeout raced with it; every client's
            # lease was released exactly once.
            grants, released, withdrawn = [], Counter(), set()
            for _, event, decisions in c.core.runtime.journal.entries():
                for d in decisions:
                    if isinstance(d, Granted):
                        grants.append(d.lease_id)
                    elif isinstance(d, Released):
                        released[d.lease_id] += 1
                        if isinstance(event, CancelRequest):
                            withdrawn.add(d.lease_id)
                    elif isinstance(d, Cancelled):
                        assert isinstance(event, CancelRequest)
            assert len(set(grants)) == len(grants)
            assert set(grants) == set(granted) | withdrawn
            assert not (set(granted) & withdrawn)
            assert all(released[lid] == 1 for lid in grants)
            requests = sum(
                isinstance(e, RequestLease) for _, e, _ in c.core.runtime.journal.entries()
            )
            assert requests == CLIENTS * ROUNDS
            releases = sum(isinstance(e, Release) for _, e, _ in c.core.runtime.journal.entries())
            assert releases == len(granted)
            assert not c.core.engine.leases and not c.core.engine.pending
            c.core.engine.check_invariants()
            report = audit(c.core.runtime.journal)
            assert report.ok and report.events_checked == c.journal_len()

            # Each campaign's Watch stream saw each of its grants exactly once.
            for name, w in watches.items():
                want = {lid for lid in grants if c.core.engine.ended[lid].campaign == name}
                seen: Counter[str] = Counter()
                while sum(seen.values()) < len(want):
                    ev = await asyncio.wait_for(w.read(), 5)
                    if ev.kind == pb.LEASE_EVENT_KIND_GRANTED:
                        seen[ev.lease.lease_id] += 1
                assert set(seen) == want and set(seen.values()) == {1}
                w.cancel()

    run(scenario(), timeout_s=60)
