"""The journal interface's two stores, SQLite and PostgreSQL, through one suite: the same
rows, hashes, replay and audit on either; then what only PostgreSQL has (leadership,
fencing) and ``bursar journal migrate``.

PostgreSQL is a private server the tests start (``tests/pg_support.py``)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner
from pg_support import PgServer, postgres_server
from test_journal import CAMPAIGNS, DEMO_POOL, _canon, drive

from bursar.broker.audit import audit
from bursar.broker.engine import Engine
from bursar.broker.errors import JournalError
from bursar.broker.events import ApplyPolicy, Tick
from bursar.broker.journal import JOURNAL_FILENAME, Journal, open_store, replay
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.cli.journal import journal as journal_cli


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a new, empty journal goes: a file, or a new database."""
    if request.param == "sqlite":
        return str(tmp_path / JOURNAL_FILENAME)
    server: PgServer = request.getfixturevalue("pg")
    return server.new_database()


def test_round_trip_entries_tail_and_length(location: str) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 200))
    with open_store(location, DEMO_POOL) as j:
        assert [j.append(e, ds) for e, ds in recorded[:150]] == list(range(1, 151))
        assert j.append_many(recorded[150:]) == list(range(151, 201))
        assert len(j) == j.last_seq == 200
        read = list(j.entries())
        assert [e for _, e, _ in read] == [e for e, _ in recorded]
        assert [_canon(ds) for _, _, ds in read] == [_canon(ds) for _, ds in recorded]
        assert [seq for seq, _, _ in j.entries(start=196)] == [196, 197, 198, 199, 200]
        flat = [(i + 1, _canon([d])) for i, (_, ds) in enumerate(recorded) for d in ds]
        assert [(seq, _canon([d])) for seq, d in j.tail(9)] == flat[-9:]
        assert j.raw_entry(3) is not None and j.raw_entry(10**6) is None


def test_the_same_events_hash_the_same_in_either_store(location: str, tmp_path: Path) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 300, seed=2))
    with Journal.open(tmp_path / "reference.sqlite", DEMO_POOL) as ref:
        ref.append_many(recorded)
        want_bytes, want = ref.canonical_bytes(), ref.sha256()
    with open_store(location, DEMO_POOL) as j:
        for e, ds in recorded:
            j.append(e, ds)
        assert j.canonical_bytes() == want_bytes
        assert j.sha256() == want == hashlib.sha256(want_bytes).hexdigest()
        assert replay(j, verify=True).state_digest() == engine.state_digest()
        report = audit(j)
        assert report.ok and report.events_checked == 300
        assert report.journal_sha256 == want


def test_deferred_commits_and_rollback(location: str) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 20))
    with open_store(location, DEMO_POOL) as j:
        for e, ds in recorded[:5]:
            j.append(e, ds)
        for e, ds in recorded[5:10]:
            j.append(e, ds, commit=False)
        assert j.uncommitted
        j.rollback()
        assert not j.uncommitted and j.last_seq == 5
        for e, ds in recorded[5:10]:
            j.append(e, ds, commit=False)
        j.commit()
    with open_store(location) as j:  # only what was committed is there
        assert [seq for seq, _, _ in j.entries()] == list(range(1, 11))


def test_the_decision_index_answers_as_a_scan(location: str) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 250, seed=3))
    with open_store(location, DEMO_POOL) as j:
        j.ensure_index()
        for e, ds in recorded:
            j.append(e, ds)
        assert j.update_index(100) == 100
        every = [
            (seq, i, d) for seq, _, ds in j.raw_entries() for i, d in enumerate(json.loads(ds))
        ]
        refs = sorted({d.get("lease_id") or d.get("request_id") for _, _, d in every} - {None})
        for campaign in ("", CAMPAIGNS[0].name):
            for kinds in ((), ("grant",), ("release", "expire")):
                for ref in ("", refs[0]):
                    want = [
                        (seq, i, d)
                        for seq, i, d in every
                        if (not campaign or d.get("campaign") == campaign)
                        and (not kinds or d["kind"] in kinds)
                        and (not ref or ref in (d.get("lease_id"), d.get("request_id")))
                    ]
                    got, start = [], 1
                    while True:
                        page, start = j.find_decisions(
                            start_seq=start, campaign=campaign, kinds=kinds, ref=ref, limit=7
                        )
                        got += page
                        if not start:
                            break
                    assert got == want, (campaign, kinds, ref)
        assert j.decisions_from(249, 5) == [
            (seq, json.loads(ds)) for seq, _, ds in j.raw_entries(249)
        ]


def test_specs_are_kept_checked_and_the_policy_in_force_followed(location: str) -> None:
    policy = PolicySpec(grace_s=10.0)
    with open_store(location, DEMO_POOL, policy) as j:
        j.append(Tick(at=1.0), [])
        newer = PolicySpec(grace_s=20.0)
        j.append(ApplyPolicy(at=2.0, policy=newer), [])
        assert j.current_policy == newer and j.policy_changed_at == 2
    with open_store(location) as j:
        assert j.pool == DEMO_POOL and j.policy == policy and j.current_policy.grace_s == 20.0
    with pytest.raises(JournalError, match="policy given differs from the one in force"):
        open_store(location, DEMO_POOL, policy)
    other = PoolSpec(groups=(NodeGroup(count=2, resources={"gpu": 8}),))
    with pytest.raises(JournalError, match="pool spec given differs"):
        open_store(location, other)


def test_opening_nothing_without_a_pool_is_refused(location: str) -> None:
    with pytest.raises(JournalError, match="no journal"):
        open_store(location)


# --- PostgreSQL only: leadership and fencing -----------------------------------------


def test_one_leader_at_a_time_and_a_deposed_leaders_late_append_is_refused(
    pg: PgServer,
) -> None:
    from bursar.broker.journal_pg import Deposed, PgJournal

    url = pg.new_database()
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 12))
    a = PgJournal.open(url, DEMO_POOL)
    b = PgJournal.open(url, DEMO_POOL)
    assert a.lead("a:1", 0.0) == 1
    assert b.lead("b:1", 0.0) is None  # the lock is a's
    assert b.leader() == (1, "a:1")
    for e, ds in recorded[:4]:
        a.append(e, ds)
    a.append(*recorded[4], commit=False)  # a batch in flight when the lead passes
    a._drop_lock_conn()  # a's lock session ends (as when its machine is cut off)

    def take() -> int:
        # The server frees the lock once it has seen a's session end: soon, not at once.
        while (epoch := b.lead("b:1", 1.0)) is None:
            time.sleep(0.02)
        return epoch

    with ThreadPoolExecutor(1) as pool:
        taking = pool.submit(take)
        time.sleep(0.5)
        assert not taking.done()  # the epoch bump waits for a's batch in flight
        a.commit()
        assert taking.result(timeout=10) == 2
    assert b.last_seq == 5 and b.leader() == (2, "b:1")
    with pytest.raises(Deposed, match="another broker leads now"):
        a.append(*recorded[5])  # the late append of a deposed leader
    with pytest.raises(Deposed):
        a.append_many(recorded[5:7])
    assert a.last_seq == 5
    assert b.append(*recorded[5]) == 6
    a.close()
    b.close()
    with PgJournal.open(url) as r:
        assert [seq for seq, _, _ in r.raw_entries()] == list(range(1, 7))
        assert audit(r).ok


# --- bursar journal migrate ---------------------------------------------------------


def test_migrate_copies_a_state_directory_and_checks_the_hashes(
    pg: PgServer, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    engine = Engine(DEMO_POOL, PolicySpec(grace_s=15.0))
    with Journal.open(state / JOURNAL_FILENAME, DEMO_POOL, PolicySpec(grace_s=15.0)) as j:
        j.append_many(drive(engine, 400, seed=5))
        change = ApplyPolicy(at=engine.now, policy=PolicySpec(grace_s=25.0))
        j.append(change, list(engine.apply(change)))
        want = j.sha256()
    url = pg.new_database()
    runner = CliRunner()
    done = runner.invoke(journal_cli, ["migrate", "--state-dir", str(state), "--to", url])
    assert done.exit_code == 0, done.output
    assert f"sha256 {want}" in done.output and "401 entries" in done.output
    with open_store(url) as p:
        assert p.sha256() == want and p.current_policy.grace_s == 25.0
    # The audit reads either store; the same hash.
    for args in (["--state-dir", str(state)], ["--journal", url]):
        out = runner.invoke(journal_cli, ["audit", *args])
        assert out.exit_code == 0, out.output
        assert f"journal sha256:     {want}" in out.output
    tail = runner.invoke(journal_cli, ["tail", "--journal", url, "-n", "3", "--json"])
    local = runner.invoke(journal_cli, ["tail", "--state-dir", str(state), "-n", "3", "--json"])
    assert tail.exit_code == 0 and tail.output == local.output and tail.output.count("\n") == 3
    # A database that already holds a journal is never written over.
    again = runner.invoke(journal_cli, ["migrate", "--state-dir", str(state), "--to", url])
    assert again.exit_code == 2 and "already holds a journal" in again.output


@pytest.mark.parametrize("run", ["demo", "scenario"])
def test_the_demo_and_the_scenario_audit_the_same_on_either_store(
    pg: PgServer, tmp_path: Path, run: str
) -> None:
    from bursar.cli.main import main

    state = tmp_path / run
    args = (
        ["demo", "--out", str(state), "--no-service"]
        if run == "demo"
        else ["sim", "run", "--seed", "1", "--out", str(state)]
    )
    runner = CliRunner()
    made = runner.invoke(main, args)
    assert made.exit_code == 0, made.output
    url = pg.new_database()
    moved = runner.invoke(main, ["journal", "migrate", "--state-dir", str(state), "--to", url])
    assert moved.exit_code == 0, moved.output

    def audited(*where: str) -> list[str]:
        out = runner.invoke(main, ["journal", "audit", *where])
        assert out.exit_code == 0, out.output
        return [
            line
            for line in out.output.splitlines()
            if line.startswith(("audited", "final state digest", "journal sha256"))
        ]

    on_sqlite = audited("--state-dir", str(state))
    assert len(on_sqlite) == 3 and " 0 mismatches" in on_sqlite[0]
    assert audited("--journal", url) == on_sqlite
