"""Commit batches: requests that arrive together share one journal commit, a lone request
commits at once, and nothing is answered, published or actuated before the entry that
records it is committed (checked from a second connection to the journal file, which sees
committed entries only)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from service_support import POOL, START, config, run, serve, until

from bursar.broker import snapshot
from bursar.broker.clock import ManualClock
from bursar.broker.decisions import Granted
from bursar.broker.envelope import CampaignSpec, DimEnvelope
from bursar.broker.errors import JournalError
from bursar.broker.events import RequestLease
from bursar.broker.journal import JOURNAL_FILENAME, Journal, replay
from bursar.broker.runtime import HeldBack, Runtime
from bursar.broker.service.batcher import MAX_BATCH_WAIT_S
from bursar.broker.service.convert import AcquireArgs
from bursar.broker.service.core import ServiceCore
from bursar.protos.bursar.v1 import broker_pb2 as pb


class Reader:
    """The journal file as another process sees it: committed entries only."""

    def __init__(self, state_dir: Path) -> None:
        self.conn = sqlite3.connect(state_dir / JOURNAL_FILENAME)

    def entries(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    def holds_grant(self, lease_id: str) -> bool:
        # The canonical form has no spaces: the quotes make "L1" not match "L10".
        pattern = f'%"kind":"grant"%"lease_id":"{lease_id}"%'
        row = self.conn.execute(
            "SELECT COUNT(*) FROM entries WHERE decisions LIKE ?", (pattern,)
        ).fetchone()
        return row[0] > 0

    def close(self) -> None:
        self.conn.close()


def _open(tmp_path: Path, clock: ManualClock) -> ServiceCore:
    return ServiceCore.open(tmp_path, config(), clock=clock)


def _heard(tmp_path: Path) -> tuple[ServiceCore, Reader, int, list[int]]:
    """A core on a clock that never moves, a reader of its journal, the entries it holds,
    and the sequence numbers its listeners hear, in order."""
    core = _open(tmp_path, ManualClock(START))
    reader = Reader(tmp_path)
    before = reader.entries()
    heard: list[int] = []
    core.runtime.listen(lambda _event, outcome: heard.append(outcome.seq))
    return core, reader, before, heard


async def _acquire(core: ServiceCore, reader: Reader, seen: list[bool]) -> Granted:
    grant, _ = await core.acquire(AcquireArgs("sci", {"gpu": 1}, 30.0, 0.0, None, {}))
    # Checked in the same step the answer is ready in, before anything else runs.
    seen.append(reader.holds_grant(grant.lease_id))
    return grant


def test_a_lone_request_commits_at_once(tmp_path: Path) -> None:
    clock = ManualClock(START)  # never moves: no window to wait out
    core = _open(tmp_path, clock)
    reader = Reader(tmp_path)

    async def scenario() -> None:
        seen: list[bool] = []
        for _ in range(3):
            await _acquire(core, reader, seen)
            assert core.batcher.held == 0
        assert seen == [True, True, True]
        assert (core.batcher.commits, core.batcher.committed) == (3, 3)

    try:
        run(scenario())
    finally:
        reader.close()
        core.close()


def test_requests_that_arrive_together_share_one_commit(tmp_path: Path) -> None:
    core, reader, before, heard = _heard(tmp_path)

    async def scenario() -> None:
        seen: list[bool] = []
        tasks = [asyncio.ensure_future(_acquire(core, reader, seen)) for _ in range(10)]
        # One turn of the loop: every call has been decided and journaled, none committed,
        # so no one is answered and the listeners (Watch, the waiters) heard of nothing.
        await asyncio.sleep(0)
        assert core.batcher.held == 10 and reader.entries() == before
        assert heard == [] and not any(t.done() for t in tasks)
        grants = await asyncio.gather(*tasks)
        assert len({g.lease_id for g in grants}) == 10
        assert seen == [True] * 10
        assert (core.batcher.commits, core.batcher.committed) == (1, 10)
        assert reader.entries() == before + 10 and len(heard) == 10

    try:
        run(scenario())
    finally:
        reader.close()
        core.close()


def test_a_batch_its_calls_keep_joining_commits_after_the_window_on_the_clock(
    tmp_path: Path,
) -> None:
    clock = ManualClock(START)
    core = _open(tmp_path, clock)
    reader = Reader(tmp_path)
    before = reader.entries()

    async def busy(stop: asyncio.Event) -> None:
        # A call joins the batch at every turn of the loop: no turn is quiet.
        while not stop.is_set():
            core.meter("sci", "inference", 1.0)
            await asyncio.sleep(0)

    async def scenario() -> None:
        stop = asyncio.Event()
        spinner = asyncio.ensure_future(busy(stop))
        seen: list[bool] = []
        call = asyncio.ensure_future(_acquire(core, reader, seen))
        for _ in range(300):  # the batch keeps gathering
            await asyncio.sleep(0)
        assert not call.done() and reader.entries() == before
        clock.advance(MAX_BATCH_WAIT_S / 2)
        for _ in range(50):
            await asyncio.sleep(0)
        assert not call.done()
        clock.advance(MAX_BATCH_WAIT_S)
        await call
        assert seen == [True] and reader.entries() > before + 300
        stop.set()
        await spinner

    try:
        run(scenario())
    finally:
        reader.close()
        core.close()


def test_under_load_batches_gather_the_calls_the_last_one_held(tmp_path: Path) -> None:
    """Calls that arrive apart, the loop idle in between, commit one by one while batches
    do not gather; once a batch has held several calls, the next waits for as many, so
    the same calls share one commit; a batch that gathers one call stops the gathering."""
    core, reader, before, _ = _heard(tmp_path)
    # Far longer than the gaps below, so that a slow machine cannot end a window early.
    core.batcher.window_s = 1.0

    async def apart(n: int, seen: list[bool]) -> list[Granted]:
        tasks = []
        for _ in range(n):
            tasks.append(asyncio.ensure_future(_acquire(core, reader, seen)))
            await asyncio.sleep(0.01)  # a real wait: the loop runs dry in between
        return list(await asyncio.gather(*tasks))

    async def scenario() -> None:
        seen: list[bool] = []
        await apart(3, seen)
        assert (core.batcher.commits, core.batcher.gathering) == (3, 0)  # a lone call each time
        await asyncio.gather(*(_acquire(core, reader, seen) for _ in range(3)))
        assert (core.batcher.commits, core.batcher.gathering) == (4, 3)  # together: one commit
        calls = asyncio.ensure_future(apart(3, seen))
        await until(lambda: core.batcher.held == 2)
        assert reader.entries() == before + 6 and not calls.done()  # the batch waits
        await calls
        assert (core.batcher.commits, core.batcher.gathering) == (
            5,
            3,
        )  # apart, and still one commit
        assert reader.entries() == before + 9 and seen == [True] * 9
        # The load is gone: the lone call waits out the window, and gathering stops.
        await _acquire(core, reader, seen)
        assert (core.batcher.commits, core.batcher.gathering) == (6, 0)
        await _acquire(core, reader, seen)
        assert core.batcher.commits == 7 and core.batcher.held == 0 and all(seen)

    try:
        run(scenario())
    finally:
        reader.close()
        core.close()


def _deny_commits(journal: Journal, deny: bool) -> None:
    def authorize(action: int, arg1: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and arg1 == "COMMIT":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    journal._conn.set_authorizer(authorize if deny else None)


def test_a_failed_commit_fails_every_call_of_its_batch_and_none_happened(tmp_path: Path) -> None:
    core, reader, before, heard = _heard(tmp_path)

    async def scenario() -> None:
        seen: list[bool] = []
        _deny_commits(core.runtime.journal, True)
        results = await asyncio.gather(
            *(_acquire(core, reader, seen) for _ in range(4)), return_exceptions=True
        )
        assert all(isinstance(r, JournalError) for r in results), results
        # Rolled back: the engine is the journal's again, nobody heard of the grants.
        assert core.engine.leases == {} and heard == [] and seen == []
        assert core.runtime.journal.last_seq == before == reader.entries()
        assert not core.runtime.broken
        _deny_commits(core.runtime.journal, False)
        grant = await _acquire(core, reader, seen)
        assert seen == [True] and list(core.engine.leases) == [grant.lease_id]

    try:
        run(scenario())
    finally:
        reader.close()
        core.close()


def test_runtime_holds_outcomes_back_until_the_commit(tmp_path: Path) -> None:
    with Runtime.open(tmp_path, config(), at=START) as rt:
        reader = Reader(tmp_path)
        before = reader.entries()
        heard: list[int] = []
        rt.listen(lambda _event, outcome: heard.append(outcome.seq))
        held = rt.deferral = HeldBack(rt)
        a = rt.submit(RequestLease(START + 1, "sci", {"gpu": 8}, 600))
        b = rt.submit(RequestLease(START + 2, "sci", {"gpu": 8}, 600))
        assert (a.seq, b.seq) == (before + 1, before + 2) and len(held.entries) == 2
        assert heard == [] and reader.entries() == before
        assert dict(rt.backend.placements()) == {}  # not actuated yet
        assert [o.seq for o in held.commit()] == [a.seq, b.seq]
        assert heard == [a.seq, b.seq] and reader.entries() == before + 2
        assert len(dict(rt.backend.placements())) == 2
        reader.close()


def test_journal_batch_commit_and_rollback(tmp_path: Path) -> None:
    with Runtime.open(tmp_path, config(), at=START) as rt:
        j = rt.journal
        reader = Reader(tmp_path)
        base = j.last_seq
        j.update_index()
        ev = RequestLease(START + 1, "sci", {"gpu": 1}, 60)
        assert j.append(ev, [], commit=False) == base + 1
        assert j.append(ev, [], commit=False) == base + 2
        assert j.uncommitted and reader.entries() == base
        assert j.update_index() == 0  # entries waiting for their commit are not indexed
        j.rollback()
        assert j.last_seq == base and not j.uncommitted and reader.entries() == base
        assert j.append(ev, [], commit=False) == base + 1
        j.commit()
        assert reader.entries() == base + 1 and j.last_seq == base + 1
        # A committing append takes the open entries with it.
        j.append(ev, [], commit=False)
        j.append(ev, [])
        assert reader.entries() == base + 3 and not j.uncommitted
        reader.close()


def test_direct_callers_off_the_loop_commit_at_once(tmp_path: Path) -> None:
    core = _open(tmp_path, ManualClock(START))
    reader = Reader(tmp_path)
    try:
        before = reader.entries()
        core.meter("sci", "inference", 5.0)
        assert reader.entries() == before + 1 and core.batcher.held == 0
    finally:
        reader.close()
        core.close()


@pytest.mark.parametrize("n", [1, 3])
def test_close_commits_what_is_left(tmp_path: Path, n: int) -> None:
    clock = ManualClock(START)
    core = _open(tmp_path, clock)
    before = Reader(tmp_path).entries()

    async def scenario() -> None:
        # Submitted on the loop and never awaited: left for the batch that close() ends.
        for _ in range(n):
            core._submit(RequestLease(core.now(), "sci", {"gpu": 1}, 60))
        assert core.batcher.held == n

    run(scenario())
    core.close()
    reader = Reader(tmp_path)
    assert reader.entries() == before + n
    reader.close()


UNSORTED = (
    POOL
    + """
[campaigns.mixed]
class = "batch"
[campaigns.mixed.gpu]
sustained = 8
burst = 8
[campaigns.mixed.cpu]
sustained = 64
burst = 64
"""
)


def test_a_fresh_broker_is_the_engine_a_replay_builds(tmp_path: Path) -> None:
    """Campaigns created from the config or through the Admin service hold their envelopes
    in the order a replay of the journal decodes them: a snapshot of the live engine then
    matches the replay (its fingerprint compares dict order too)."""
    core = ServiceCore.open(tmp_path, config(UNSORTED), clock=ManualClock(START))
    try:
        mixed = core.engine.campaigns["mixed"]
        spec = CampaignSpec(
            name="later",
            envelopes={
                "gpu": DimEnvelope(sustained=8, burst=8),
                "cpu": DimEnvelope(sustained=64, burst=64),
            },
        )
        core.create_campaign(spec)
        assert list(mixed.buckets) == sorted(mixed.buckets)
        with Journal.open(tmp_path / JOURNAL_FILENAME) as j:
            replayed = replay(j)
        assert snapshot.fingerprint(core.engine) == snapshot.fingerprint(replayed)
    finally:
        core.close()


def test_each_call_waits_for_one_commit_and_an_acquire_answers_from_its_grant(
    tmp_path: Path,
) -> None:
    """Over gRPC: an Acquire awaits the batch once (the core's wait; the servicer adds
    none), as every other call does, and its lease, built from the grant, is the lease
    GetLease reads back."""

    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            batcher = c.core.batcher
            waits: list[int] = []
            durable = batcher.durable

            async def counted() -> None:  # the real wait, counted
                waits.append(batcher.held)
                await durable()

            batcher.durable = counted  # type: ignore[method-assign]
            got = await c.acquire("sci", 1)
            assert len(waits) == 1 and waits[0] == 1  # its own entry, held
            read = await c.broker.GetLease(
                pb.GetLeaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
            )
            assert got.lease == read and len(waits) == 2
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=c.as_("sci")
            )
            assert len(waits) == 3

    run(scenario())
