"""One decision path through the service, over real gRPC on loopback: a retried Acquire
with its idempotency key gives one lease (a reply lost on the way back included), Watch
events carry their journal position and resume from it, ListDecisions reads the journal's
index, and a journal append that fails leaves the broker as it was."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import grpc
import pytest
from service_support import details, fails, next_event, run, serve

from bursar.broker.events import RequestLease
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.providers.client import AsyncBrokerClient, Backoff


class DroppingProxy:
    """A TCP proxy on loopback in front of the broker. While ``dropping``, nothing the
    broker sends reaches the client; ``cut()`` then closes every connection, so the client
    sees its call fail UNAVAILABLE although the broker answered it: a lost reply."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.dropping = False
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{port}"

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [cw, sw]

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter, back: bool) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await r.read(65536):
                    if back and self.dropping:
                        continue
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pump(cr, sw, False), pump(sr, cw, True))

    def cut(self) -> None:
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


def _requests(c) -> list[RequestLease]:
    return [e for _, e, _ in c.core.runtime.journal.entries() if isinstance(e, RequestLease)]


def test_an_acquire_retried_after_a_lost_reply_gives_one_lease(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            proxy = DroppingProxy(int(c.address.rsplit(":", 1)[1]))
            address = await proxy.start()
            sci = AsyncBrokerClient(
                address, c.tokens["sci"], backoff=Backoff(initial_s=0.05, max_s=0.2), rng=1
            )
            async with sci:
                await sci.status()  # connected
                proxy.dropping = True
                call = asyncio.ensure_future(sci.acquire({"gpu": 4}, 60, blocking=False))
                # The broker grants and journals the lease; its answer is dropped.
                while not c.core.engine.leases:
                    await asyncio.sleep(0.01)
                proxy.cut()
                proxy.dropping = False
                lease = await asyncio.wait_for(call, 10)
            await proxy.close()
            assert list(c.core.engine.leases) == [lease.id]
            requests = _requests(c)
            assert len(requests) == 1 and requests[0].idempotency_key

    run(scenario())


def test_the_same_key_gets_the_same_answer_and_journals_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            first = await c.acquire("sci", 4, idempotency_key="job-7")
            n = c.journal_len()
            again = await c.acquire("sci", 4, idempotency_key="job-7")
            assert again.lease.lease_id == first.lease.lease_id
            assert (again.tokens, again.price) == (first.tokens, first.price)
            assert c.journal_len() == n
            # Another campaign's key space is its own.
            other = await c.acquire("other", 4, idempotency_key="job-7")
            assert other.lease.lease_id != first.lease.lease_id
            # The same key for a different request is refused and changes nothing.
            n = c.journal_len()
            d = await fails(c.acquire("sci", 8, idempotency_key="job-7"))
            assert d.code is grpc.StatusCode.INVALID_ARGUMENT and "idempotency_key" in d.message
            assert c.journal_len() == n
            d = await fails(c.acquire("sci", 1, idempotency_key="x" * 200))
            assert d.code is grpc.StatusCode.INVALID_ARGUMENT and "128" in d.message
            assert c.journal_len() == n

    run(scenario())


def test_a_refusal_is_answered_again_and_a_queued_request_is_joined(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            await c.acquire("other", 16, duration_s=2.0)  # fills the warm pool's share
            refused = await fails(c.acquire("sci", 512, idempotency_key="big"))
            n = c.journal_len()
            again = await fails(c.acquire("sci", 512, idempotency_key="big"))
            assert (again.code, again.reason) == (refused.code, refused.reason)
            assert c.journal_len() == n

    run(scenario())


def test_watch_events_carry_their_journal_position_and_resume_without_gap(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            stream = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
            await stream.initial_metadata()  # sent once the stream is registered
            got = await c.acquire("sci", 2)
            await c.broker.Renew(
                pb.RenewRequest(lease_id=got.lease.lease_id, duration_s=120),
                metadata=c.as_("sci"),
            )
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
            )
            live = [await next_event(stream) for _ in range(3)]
            stream.cancel()
            kinds = [e.kind for e in live]
            assert kinds == [
                pb.LEASE_EVENT_KIND_GRANTED,
                pb.LEASE_EVENT_KIND_RENEWED,
                pb.LEASE_EVENT_KIND_RELEASED,
            ]
            positions = [(e.seq, e.index) for e in live]
            assert positions == sorted(positions) and len(set(positions)) == 3
            assert all(not e.snapshot for e in live)
            # Resume after the first: the journal replays exactly the two that follow.
            seq, index = positions[0]
            again = c.broker.Watch(
                pb.WatchRequest(from_seq=seq, from_index=index + 1), metadata=c.as_("sci")
            )
            replayed = [await next_event(again) for _ in range(2)]
            again.cancel()
            assert [(e.seq, e.index, e.kind) for e in replayed] == [
                (e.seq, e.index, e.kind) for e in live[1:]
            ]
            assert replayed[0].lease.expires_at == live[1].lease.expires_at
            # Past the journal's end: OUT_OF_RANGE, naming the field.
            bad = c.broker.Watch(
                pb.WatchRequest(from_seq=c.journal_len() + 5), metadata=c.as_("sci")
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await next_event(bad)
            d = details(err.value)
            assert d.code is grpc.StatusCode.OUT_OF_RANGE and "from_seq" in d.message

    run(scenario())


def test_list_decisions_filters_through_the_index(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            a = await c.acquire("sci", 2)
            await c.acquire("other", 2)
            lid = a.lease.lease_id
            resp = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(lease_id=lid), metadata=c.as_("sci")
            )
            assert [d.lease_id for d in resp.decisions] == [lid]
            assert resp.decisions[0].kind == pb.DECISION_KIND_GRANT
            every = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(limit=1000), metadata=c.as_("admin")
            )
            page1 = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(limit=2), metadata=c.as_("admin")
            )
            assert page1.next_seq and len(page1.decisions) <= 2
            rest = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(limit=1000, start_seq=page1.next_seq),
                metadata=c.as_("admin"),
            )
            assert [d.json for d in page1.decisions] + [d.json for d in rest.decisions] == [
                d.json for d in every.decisions
            ]
            assert rest.next_seq == 0

    run(scenario())


def test_a_failing_journal_append_fails_the_call_and_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            await c.acquire("sci", 2)
            before = c.core.engine.state_digest()
            n = c.journal_len()
            # Another connection takes the database's write lock: the broker's next append
            # fails (busy) like a full disk or a failing device would.
            blocker = sqlite3.connect(tmp_path / "journal.sqlite", isolation_level=None)
            blocker.execute("PRAGMA busy_timeout = 0")
            c.core.runtime.journal._conn.execute("PRAGMA busy_timeout = 0")
            blocker.execute("BEGIN IMMEDIATE")
            try:
                d = await fails(c.acquire("sci", 2))
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
            assert d.code is grpc.StatusCode.UNAVAILABLE
            assert c.core.engine.state_digest() == before and c.journal_len() == n
            # The next request works, and the engine matches the journal's replay.
            ok = await c.acquire("sci", 2)
            assert ok.lease.lease_id in c.core.engine.leases
            assert c.journal_len() == n + 1

    run(scenario())
