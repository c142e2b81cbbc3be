"""The journal: round trip, canonical bytes, replay, audit, the CLI, and crash safety."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.broker import codec
from bursar.broker.audit import audit
from bursar.broker.decisions import Decision, Expired, Granted, PreemptWarned, Released, Revoked
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import JournalError, RequestError
from bursar.broker.events import CreateCampaign, Event, Release, RequestLease, Tick
from bursar.broker.journal import (
    JOURNAL_FILENAME,
    Journal,
    replay,
    spec_from_dict,
    spec_to_dict,
)
from bursar.broker.policy import Enforcement, NodeGroup, PolicySpec, PoolSpec
from bursar.cli.journal import journal as journal_cli

DEMO_POOL = PoolSpec(
    groups=(NodeGroup(count=8, resources={"gpu": 8, "cpu": 64, "mem_gb": 512}, warm=8),)
)
CAMPAIGNS = (
    CampaignSpec(
        "alpha", {"gpu": DimEnvelope(16, 16, 32, 20_000.0)}, lease_class=LeaseClass.INTERACTIVE
    ),
    CampaignSpec("beta", {"gpu": DimEnvelope(8, 16, 48, 20_000.0)}),
    CampaignSpec(
        "fill",
        {"gpu": DimEnvelope(0, 64, 64, None)},
        lease_class=LeaseClass.OPPORTUNISTIC,
        preemptible=True,
    ),
)
_ENDS = (Revoked, Expired, Released)


def drive(engine: Engine, n_events: int, seed: int = 0) -> Iterator[tuple[Event, list[Decision]]]:
    """Apply a deterministic mix of requests, releases and ticks; yield what was accepted.

    Events the engine refuses are skipped, as the service would: a refused event changes
    nothing and is never journaled.
    """
    rng = random.Random(seed)
    t = 0.0
    # lease id -> when it ends on its own (expiry or preemption deadline). Releases are
    # only sent strictly before that, so that none races an expiry due at the same instant.
    live: dict[str, float] = {}
    names = [c.name for c in CAMPAIGNS]
    queue: list[Event] = [CreateCampaign(at=t, spec=c) for c in CAMPAIGNS]
    produced = 0
    while produced < n_events:
        if queue:
            event = queue.pop(0)
        else:
            t += rng.choice((0.5, 1.0, 2.0))
            r = rng.random()
            releasable = sorted(lid for lid, end in live.items() if end > t)
            if r < 0.5:
                event = RequestLease(
                    at=t, campaign=rng.choice(names), size={"gpu": 4}, duration_s=60
                )
            elif r < 0.8 and releasable:
                lease_id = rng.choice(releasable)
                del live[lease_id]
                event = Release(at=t, lease_id=lease_id)
            else:
                event = Tick(at=t)
        try:
            decisions = engine.apply(event)
        except RequestError:
            continue
        for d in decisions:
            if isinstance(d, Granted):
                live[d.lease_id] = d.expires_at
            elif isinstance(d, PreemptWarned) and d.lease_id in live:
                live[d.lease_id] = min(live[d.lease_id], d.deadline)
            elif isinstance(d, _ENDS):
                live.pop(d.lease_id, None)
        produced += 1
        yield event, decisions


def record(path: Path, n_events: int, seed: int = 0) -> Engine:
    """Drive a fresh engine and journal every accepted event; return the live engine."""
    engine = Engine(DEMO_POOL)
    with Journal.open(path, DEMO_POOL) as j:
        for event, decisions in drive(engine, n_events, seed):
            j.append(event, decisions)
    return engine


def _canon(decisions: list[Decision]) -> str:
    return codec.dumps([codec.to_dict(d) for d in decisions])


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


# --- the journal itself ------------------------------------------------------------


def test_append_and_read_round_trip(tmp_path: Path) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 300))
    assert any(isinstance(d, Granted) for _, ds in recorded for d in ds)
    with Journal.open(tmp_path / "j.sqlite", DEMO_POOL) as j:
        seqs = [j.append(e, ds) for e, ds in recorded]
        assert seqs == list(range(1, 301))
        assert len(j) == 300
        read = list(j.entries())
    assert [seq for seq, _, _ in read] == seqs
    assert [e for _, e, _ in read] == [e for e, _ in recorded]
    # Decisions compare in canonical form: the codec reads an infinity nested in a
    # decision's ``inputs`` back as the string "inf", which encodes to the same bytes.
    assert [_canon(ds) for _, _, ds in read] == [_canon(ds) for _, ds in recorded]


def test_the_decision_index_answers_as_a_scan_of_the_entries_would(tmp_path: Path) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 400, seed=3))
    with Journal.open(tmp_path / "j.sqlite", DEMO_POOL) as j:
        j.ensure_index()
        for e, ds in recorded[:150]:
            j.append(e, ds)
        assert j.update_index(100) == 100 and j.update_index(100) == 50
        assert j.update_index() == 0
        for e, ds in recorded[150:]:
            j.append(e, ds)  # not indexed yet: a query brings the index up to date
        every = [
            (seq, i, d) for seq, _, ds in j.raw_entries() for i, d in enumerate(json.loads(ds))
        ]
        campaigns = sorted({d["campaign"] for _, _, d in every if "campaign" in d})
        refs = sorted({d.get("lease_id") or d.get("request_id") for _, _, d in every} - {None})
        for campaign in ["", *campaigns[:3]]:
            for kinds in ((), ("grant",), ("revoke", "expire")):
                for ref in ("", *refs[:2]):
                    want = [
                        (seq, i, d)
                        for seq, i, d in every
                        if (not campaign or d.get("campaign") == campaign)
                        and (not kinds or d["kind"] in kinds)
                        and (not ref or ref in (d.get("lease_id"), d.get("request_id")))
                    ]
                    got, start = [], 1
                    while True:  # page through, 7 at a time
                        page, start = j.find_decisions(
                            start_seq=start, campaign=campaign, kinds=kinds, ref=ref, limit=7
                        )
                        got += page
                        if not start:
                            break
                    assert got == want, (campaign, kinds, ref)


def test_entries_start_and_tail(tmp_path: Path) -> None:
    engine = Engine(DEMO_POOL)
    recorded = list(drive(engine, 50))
    with Journal.open(tmp_path / "j.sqlite", DEMO_POOL) as j:
        j.append_many(recorded)
        assert [seq for seq, _, _ in j.entries(start=45)] == [45, 46, 47, 48, 49, 50]
        all_decisions = [(i + 1, codec.encode(d)) for i, (_, ds) in enumerate(recorded) for d in ds]
        assert [(seq, codec.encode(d)) for seq, d in j.tail(7)] == all_decisions[-7:]
        assert [(seq, codec.encode(d)) for seq, d in j.tail(10_000)] == all_decisions
        assert j.tail(0) == []


def test_reopen_keeps_entries_and_specs(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    policy = PolicySpec(grace_s=10.0, enforcement=Enforcement.GRANT_INSTANT, max_lease_s=math.inf)
    engine = Engine(DEMO_POOL, policy)
    recorded = list(drive(engine, 40))
    with Journal.open(path, DEMO_POOL, policy) as j:
        for e, ds in recorded[:20]:
            j.append(e, ds)
    with Journal.open(path) as j:  # no specs: read what the file says
        assert j.pool == DEMO_POOL
        assert j.policy == policy
        assert len(j) == 20
    with Journal.open(path, DEMO_POOL, policy) as j:  # equal specs: fine, and appends go on
        assert [j.append(e, ds) for e, ds in recorded[20:]] == list(range(21, 41))
        entries = [(codec.encode(e), _canon(ds)) for _, e, ds in j.entries()]
        assert entries == [(codec.encode(e), _canon(ds)) for e, ds in recorded]


def test_reopen_with_other_specs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    Journal.open(path, DEMO_POOL).close()
    with pytest.raises(JournalError, match="policy given differs from the one in force"):
        Journal.open(path, DEMO_POOL, PolicySpec(grace_s=5.0))
    other_pool = PoolSpec(groups=(NodeGroup(count=4, resources={"gpu": 8}),))
    with pytest.raises(JournalError, match="pool spec given differs"):
        Journal.open(path, other_pool)


def test_open_refuses_missing_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="no journal at"):
        Journal.open(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()
    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    with pytest.raises(JournalError, match="not a Bursar journal"):
        Journal.open(foreign, DEMO_POOL)
    with sqlite3.connect(foreign) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    assert names == {"t"}  # nothing was added to someone else's database
    (tmp_path / "text.sqlite").write_text("not a database at all, " * 100)
    with pytest.raises(JournalError, match="cannot open journal"):
        Journal.open(tmp_path / "text.sqlite")


def test_spec_dicts_round_trip_and_normalise() -> None:
    policy = PolicySpec(
        warm_headroom={"gpu": 16},
        enforcement=Enforcement.GRANT_INSTANT,
        max_lease_s=math.inf,
        price_k=3,
    )
    d = json.loads(codec.dumps(spec_to_dict(policy)))
    assert d["enforcement"] == "grant_instant"
    assert d["max_lease_s"] == "inf"
    assert spec_from_dict(PolicySpec, d) == policy
    pool_d = spec_to_dict(DEMO_POOL)
    assert pool_d["groups"][0]["resources"] == {"cpu": 64.0, "gpu": 8.0, "mem_gb": 512.0}
    assert spec_from_dict(PoolSpec, pool_d) == DEMO_POOL
    # 60 and 60.0 are the same setting, so they must be the same bytes in the journal.
    assert spec_to_dict(PoolSpec(DEMO_POOL.groups, boot_latency_s=60)) == spec_to_dict(
        PoolSpec(DEMO_POOL.groups, boot_latency_s=60.0)
    )
    with pytest.raises(JournalError, match="unknown field"):
        spec_from_dict(PolicySpec, {**d, "from_the_future": 1})


def test_same_events_give_identical_canonical_bytes(tmp_path: Path) -> None:
    record(tmp_path / "a.sqlite", 400)
    # The second file is written in batches: the canonical form must not care.
    engine = Engine(DEMO_POOL)
    with Journal.open(tmp_path / "b.sqlite", DEMO_POOL) as b:
        b.append_many(drive(engine, 400))
    with Journal.open(tmp_path / "a.sqlite") as a, Journal.open(tmp_path / "b.sqlite") as b:
        raw = a.canonical_bytes()
        assert raw == b.canonical_bytes()
        assert a.sha256() == b.sha256() == hashlib.sha256(raw).hexdigest()
        lines = raw.decode().splitlines()
        assert len(lines) == 401
        assert json.loads(lines[0])["pool"] == spec_to_dict(DEMO_POOL)
        assert json.loads(lines[1])["seq"] == 1
    record(tmp_path / "c.sqlite", 400, seed=1)
    with Journal.open(tmp_path / "a.sqlite") as a, Journal.open(tmp_path / "c.sqlite") as c:
        assert a.sha256() != c.sha256()


def test_replay_reproduces_the_live_state(tmp_path: Path) -> None:
    live = record(tmp_path / "j.sqlite", 500)
    with Journal.open(tmp_path / "j.sqlite") as j:
        replayed = replay(j, verify=True)
    assert replayed.state_digest() == live.state_digest()
    assert replayed.now == live.now
    assert replayed.next_timer() == live.next_timer()


def test_replay_fails_and_audit_reports_an_event_the_engine_refuses(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.sqlite", DEMO_POOL) as j:
        j.append(Tick(at=5.0), [])
        j.append(Tick(at=1.0), [])  # time going back: never accepted by a live engine
        j.append(Tick(at=7.0), [])
        with pytest.raises(JournalError, match="entry 2"):
            replay(j)
        # The audit reports the refusal and goes on: the engine changed nothing.
        report = audit(j)
    assert [m.seq for m in report.mismatches] == [2]
    assert report.mismatches[0].expected.startswith("refused: at:")
    assert report.events_checked == 3


# --- audit --------------------------------------------------------------------------


def test_audit_of_a_clean_journal(tmp_path: Path) -> None:
    live = record(tmp_path / "j.sqlite", 500)
    with Journal.open(tmp_path / "j.sqlite") as j:
        report = audit(j)
        total = sum(len(ds) for _, _, ds in j.entries())
        assert report.ok
        assert report.mismatches == ()
        assert report.events_checked == len(j) == 500
        assert report.decisions_checked == total > 500
        assert report.state_digest == live.state_digest()
        assert report.journal_sha256 == j.sha256()


def _tamper_first_grant(path: Path) -> int:
    """Rewrite one recorded grant behind the journal's back; return its seq."""
    conn = sqlite3.connect(path)
    for seq, decisions_json in conn.execute("SELECT seq, decisions FROM entries ORDER BY seq"):
        decisions = json.loads(decisions_json)
        for d in decisions:
            if d["kind"] == "grant":
                d["expires_at"] += 3600.0  # an hour longer than policy allowed
                with conn:
                    conn.execute(
                        "UPDATE entries SET decisions = ? WHERE seq = ?",
                        (codec.dumps(decisions), seq),
                    )
                conn.close()
                return seq
    raise AssertionError("no grant to tamper with")


def test_audit_reports_a_tampered_row(state_dir: Path) -> None:
    path = state_dir / JOURNAL_FILENAME
    record(path, 300)
    seq = _tamper_first_grant(path)
    with Journal.open(path) as j:
        report = audit(j)
    assert not report.ok
    assert [m.seq for m in report.mismatches] == [seq]
    m = report.mismatches[0]
    assert json.loads(m.got)[0]["expires_at"] == json.loads(m.expected)[0]["expires_at"] + 3600

    result = CliRunner().invoke(journal_cli, ["audit", "--state-dir", str(state_dir)])
    assert result.exit_code == 1, result.output
    assert "audited 300 events" in result.output
    assert "1 mismatch" in result.output
    assert f"entry {seq}:" in result.output
    assert "expires_at" in result.output


def test_a_journal_from_before_decisions_carried_pieces_audits_clean(tmp_path: Path) -> None:
    """Grants and activations gained their per-node pieces later: a journal written before
    is audited on the fields it holds, and a wrong value in any of them is still found."""
    path = tmp_path / "j.sqlite"
    record(path, 300)
    conn = sqlite3.connect(path)
    stripped = 0
    with conn:
        for seq, decisions_json in list(conn.execute("SELECT seq, decisions FROM entries")):
            decisions = json.loads(decisions_json)
            for d in decisions:
                if d["kind"] in ("grant", "activate") and d.pop("pieces", None) is not None:
                    stripped += 1
            conn.execute(
                "UPDATE entries SET decisions = ? WHERE seq = ?", (codec.dumps(decisions), seq)
            )
    conn.close()
    assert stripped > 10
    with Journal.open(path) as j:
        assert audit(j).ok
    seq = _tamper_first_grant(path)
    with Journal.open(path) as j:
        assert [m.seq for m in audit(j).mismatches] == [seq]


def test_audit_reports_a_row_that_is_not_json(state_dir: Path) -> None:
    path = state_dir / JOURNAL_FILENAME
    record(path, 50)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE entries SET decisions = 'garbage' WHERE seq = 10")
    conn.close()
    with Journal.open(path) as j:
        report = audit(j)
    assert [m.seq for m in report.mismatches] == [10]
    assert report.journal_sha256 is None


# --- the CLI ------------------------------------------------------------------------


def test_cli_audit_clean_exits_0(state_dir: Path) -> None:
    record(state_dir / JOURNAL_FILENAME, 100)
    result = CliRunner().invoke(journal_cli, ["audit", "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    assert "audited 100 events" in result.output
    assert "0 mismatches" in result.output
    with Journal.open(state_dir / JOURNAL_FILENAME) as j:
        assert j.sha256() in result.output


def test_cli_on_missing_state_dir_or_journal_exits_2(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = tmp_path / "nowhere"
    for command in ("audit", "tail"):
        result = runner.invoke(journal_cli, [command, "--state-dir", str(missing)])
        assert result.exit_code == 2, result.output
        assert "does not exist" in result.output
        assert "--state-dir" in result.output
    result = runner.invoke(journal_cli, ["audit", "--state-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"no journal in {tmp_path}" in result.output
    assert not (tmp_path / JOURNAL_FILENAME).exists()  # looking must not create one


def test_cli_tail(state_dir: Path) -> None:
    record(state_dir / JOURNAL_FILENAME, 100)
    runner = CliRunner()
    result = runner.invoke(
        journal_cli, ["tail", "--state-dir", str(state_dir), "-n", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    with Journal.open(state_dir / JOURNAL_FILENAME) as j:
        expected = j.tail(5)
    assert [(r.pop("seq"), r) for r in rows] == [(s, codec.to_dict(d)) for s, d in expected]

    result = runner.invoke(journal_cli, ["tail", "--state-dir", str(state_dir), "-n", "30"])
    assert result.exit_code == 0, result.output
    assert "last 30 decisions" in result.output
    assert "grant" in result.output
    # For a person: ISO 8601 times (UTC); --json keeps the numbers.
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", result.output)
    assert "starts_at=1970-01-01T" in result.output  # a time field in the details too


def test_cli_help_texts() -> None:
    runner = CliRunner()
    for args in (["--help"], ["audit", "--help"], ["tail", "--help"]):
        result = runner.invoke(journal_cli, args)
        assert result.exit_code == 0
        assert "journal" in result.output
    assert "Exit status" in runner.invoke(journal_cli, ["audit", "--help"]).output


# --- crash safety -------------------------------------------------------------------

# The child journals every event before it acknowledges (prints) any grant in it, as the
# service must; the parent SIGKILLs it at an arbitrary point between or inside appends.
_CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from test_journal import DEMO_POOL, drive
from bursar.broker.decisions import Granted
from bursar.broker.engine import Engine
from bursar.broker.journal import Journal

journal = Journal.open(sys.argv[2], DEMO_POOL)
engine = Engine(DEMO_POOL)
for event, decisions in drive(engine, int(sys.argv[3])):
    journal.append(event, decisions)
    for d in decisions:
        if isinstance(d, Granted):
            sys.stdout.write(d.lease_id + "\n")
            sys.stdout.flush()
print("DONE", flush=True)
"""


def test_acknowledged_grants_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_FILENAME
    n_events = 200_000  # far more than it can do before the kill
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(Path(__file__).parent), str(path), str(n_events)],
        stdout=subprocess.PIPE,
        text=True,
    )
    acked: list[str] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 15
        while len(acked) < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked.append(line.strip())
        os.kill(child.pid, signal.SIGKILL)
        # Whatever it flushed before it died was acknowledged too.
        acked.extend(line.strip() for line in child.stdout)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert "DONE" not in acked, "the child finished before it was killed"
    assert len(acked) >= 400

    with Journal.open(path) as j:
        granted = Counter(
            d.lease_id for _, _, ds in j.entries() for d in ds if isinstance(d, Granted)
        )
        report = audit(j)
        engine = replay(j)
    assert not [lid for lid, n in granted.items() if n > 1], "a lease id was granted twice"
    missing = [lid for lid in acked if lid not in granted]
    assert not missing, f"acknowledged grants lost in the crash: {missing[:5]}"
    assert len(set(acked)) == len(acked)
    assert report.ok, report.mismatches[:3]
    assert report.events_checked > 0
    assert engine.state_digest() == report.state_digest


def test_a_journal_of_other_rules_is_audited_with_a_warning(tmp_path: Path) -> None:
    """A journal records the engine's rules version; one written under another (here: from
    before the version was recorded) fails its audit with a reason a person can act on,
    and its hash is what it was (the version is not part of the canonical form)."""
    from bursar.broker.engine import RULES_VERSION

    path = tmp_path / "j.sqlite"
    engine = Engine(DEMO_POOL)
    with Journal.open(path, DEMO_POOL) as j:
        for e, ds in drive(engine, 200):
            j.append(e, ds)
        assert j.rules_version == RULES_VERSION
        report = audit(j)
        assert report.ok, report
        sha = j.sha256()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM meta WHERE key = 'rules_version'")
    conn.close()
    with Journal.open(path) as j:
        assert j.rules_version == 1
        assert j.sha256() == sha
        report = audit(j)
    assert not report.ok
    assert report.mismatches == ()
    (problem,) = report.problems
    assert f"rules version 1 and this build decides by version {RULES_VERSION}" in problem
