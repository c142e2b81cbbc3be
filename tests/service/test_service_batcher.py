"""The commit batcher on its own: a real runtime and journal, a real event loop, no
service around it. Entries held together commit together, nothing reaches a listener
before its commit, a batch that keeps being joined commits at its entry bound, and a
failed commit fails every call of its batch and none of its events happened."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from service_support import START, config, run

from bursar.broker.clock import ManualClock
from bursar.broker.errors import JournalError
from bursar.broker.events import RequestLease
from bursar.broker.journal import JOURNAL_FILENAME
from bursar.broker.outcome import Outcome
from bursar.broker.runtime import Runtime
from bursar.broker.service.batcher import MAX_BATCH_ENTRIES, QUIET_TURNS, CommitBatcher


def _committed(state: Path) -> int:
    """Entries another connection sees: the committed ones only."""
    conn = sqlite3.connect(state / JOURNAL_FILENAME)
    try:
        return conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    finally:
        conn.close()


class Setup:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.rt = Runtime.open(state, config(), at=START)
        self.before = _committed(state)
        self.clock = ManualClock(START)
        self.commits: list[list[int]] = []
        self.failures: list[BaseException] = []
        self.batcher = CommitBatcher(
            self.rt,
            self.clock,
            on_commit=lambda outcomes: self.commits.append([o.seq for o in outcomes]),
            on_failure=self.failures.append,
        )
        self.rt.deferral = self.batcher
        self.heard: list[int] = []
        self.rt.listen(lambda _event, outcome: self.heard.append(outcome.seq))
        self.t = START

    def request(self) -> Outcome:
        self.t += 0.001
        return self.rt.submit(RequestLease(self.t, "sci", {"gpu": 1}, 600))

    async def call(self) -> int:
        """One call: its event, then its wait for the commit; the entries another
        connection sees when it goes on (in the same step)."""
        seq = self.request().seq
        await self.batcher.durable()
        assert seq in self.heard
        return _committed(self.state)


@pytest.fixture
def setup(tmp_path: Path):
    s = Setup(tmp_path)
    yield s
    s.rt.close()


def test_calls_ready_together_share_one_commit_and_nothing_is_heard_before_it(
    setup: Setup,
) -> None:
    async def scenario() -> None:
        calls = [asyncio.ensure_future(setup.call()) for _ in range(5)]
        await asyncio.sleep(0)  # every call has run up to its wait
        assert setup.batcher.held == 5 and setup.heard == []
        assert _committed(setup.state) == setup.before
        seen = await asyncio.gather(*calls)
        assert seen == [setup.before + 5] * 5
        assert len(setup.commits) == 1 and len(setup.commits[0]) == 5
        assert setup.batcher.gathering == 5  # the next batch gathers for as many

    run(scenario())


def test_a_lone_call_commits_alone_once_the_loop_is_quiet(setup: Setup) -> None:
    async def scenario() -> None:
        for i in range(3):
            assert await setup.call() == setup.before + i + 1
        assert [len(c) for c in setup.commits] == [1, 1, 1]
        assert setup.batcher.gathering == 0

    run(scenario())


@pytest.mark.parametrize(("late", "commits"), [(QUIET_TURNS - 2, 1), (QUIET_TURNS + 2, 2)])
def test_a_call_a_few_turns_late_joins_the_batch_a_later_one_opens_its_own(
    setup: Setup, late: int, commits: int
) -> None:
    async def after(turns: int) -> int:
        for _ in range(turns):
            await asyncio.sleep(0)
        return await setup.call()

    async def scenario() -> None:
        await asyncio.gather(setup.call(), after(late))
        assert len(setup.commits) == commits

    run(scenario())


def test_a_batch_joined_at_every_turn_commits_at_its_entry_bound(setup: Setup) -> None:
    async def scenario() -> None:
        waits = []
        # A call every turn, none quiet, the service's clock still: the bound decides.
        for _ in range(MAX_BATCH_ENTRIES - 1):
            setup.request()
            waits.append(asyncio.ensure_future(setup.batcher.durable()))
            await asyncio.sleep(0)
        assert setup.commits == [] and setup.batcher.held == MAX_BATCH_ENTRIES - 1
        setup.request()
        await setup.batcher.durable()  # the entry that reaches the bound commits them all
        assert [len(c) for c in setup.commits] == [MAX_BATCH_ENTRIES]
        await asyncio.gather(*waits)

    run(scenario())


def test_off_the_loop_an_entry_commits_as_it_is_held(setup: Setup) -> None:
    out = setup.request()
    assert setup.batcher.held == 0 and setup.heard == [out.seq]
    assert _committed(setup.state) == setup.before + 1


def _deny_commits(rt: Runtime, deny: bool) -> None:
    def authorize(action: int, arg1: str | None, *_: object) -> int:
        if action == sqlite3.SQLITE_TRANSACTION and arg1 == "COMMIT":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    rt.journal._conn.set_authorizer(authorize if deny else None)


def test_a_failed_commit_fails_its_calls_and_none_of_its_events_happened(setup: Setup) -> None:
    async def scenario() -> None:
        _deny_commits(setup.rt, True)
        results = await asyncio.gather(*(setup.call() for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, JournalError) for r in results), results
        assert len(setup.failures) == 1 and setup.heard == [] and setup.commits == []
        assert setup.rt.engine.leases == {} and setup.batcher.held == 0
        assert setup.rt.journal.last_seq == setup.before == _committed(setup.state)
        _deny_commits(setup.rt, False)
        assert await setup.call() == setup.before + 1  # the next batch commits

    run(scenario())


def test_settled_waits_for_what_was_appended_while_it_waited(setup: Setup) -> None:
    """An entry appended while a batch commits (here: by a listener of its entry) opens
    the next batch, which commits on its own; ``settled`` returns once both have."""
    follow: list[Outcome] = []

    def once(_event: object, outcome: Outcome) -> None:
        if not follow:
            follow.append(setup.request())

    setup.rt.listen(once)

    async def scenario() -> None:
        setup.request()
        await setup.batcher.settled()
        assert len(follow) == 1
        assert setup.batcher.held == 0 and _committed(setup.state) == setup.before + 2
        assert [len(c) for c in setup.commits] == [1, 1]

    run(scenario())
