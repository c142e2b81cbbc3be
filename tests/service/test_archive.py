"""Journal retention: old entries move to archive files at a verified snapshot; the broker
restarts from the snapshot, and the audit across the archives is the audit of the whole
history."""

from __future__ import annotations

import fcntl
import json
import random
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from service_support import config
from test_snapshot import _workload

from bursar.broker import snapshot
from bursar.broker.errors import JournalError
from bursar.broker.events import Tick
from bursar.broker.journal import Journal
from bursar.broker.runtime import Runtime
from bursar.cli.main import main


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["journal", *args])
    return r.exit_code, r.output


def _work(state: Path, seed: int, n: int, t: float) -> float:
    with Runtime.open(state, config(), snapshot_every=30) as rt:
        return _workload(rt, random.Random(seed), t, n)


def test_archives_keep_the_whole_history_auditable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    t = _work(state, 1, 120, 0.0)
    with Journal.open(state / "journal.sqlite") as j:
        whole_before = j.sha256()
        last = j.last_seq
    code, out = _cli("archive", "--state-dir", str(state), "--out", str(tmp_path / "a1.sqlite"))
    assert code == 0, out
    cut1 = snapshot.listing(state)[0].header.seq
    assert f"moved entries 1-{cut1}" in out
    with Journal.open(state / "journal.sqlite") as j:
        assert j.archived_through == cut1 and j.last_seq == last
        # (The cut may be the last entry: snapshots are written in the background, and
        # one due while another is still being written waits for a later commit.)
        assert next((e[0] for e in j.raw_entries()), last + 1) == cut1 + 1
    # Alone, the live journal is audited from the snapshot at the cut; with the archive,
    # from the start, and the whole history hashes as the journal did before the move.
    code, out = _cli("audit", "--state-dir", str(state))
    assert code == 0 and f"audited from the snapshot at entry {cut1}" in out, out
    code, out = _cli("audit", "--state-dir", str(state), "--archive", str(tmp_path / "a1.sqlite"))
    assert code == 0 and f"journal sha256:     {whole_before}" in out, out
    assert f"audited {last} events" in out

    # The broker restarts from the snapshot and goes on; a second archive chains on.
    t = _work(state, 2, 120, t)
    code, out = _cli("archive", "--state-dir", str(state), "--out", str(tmp_path / "a2.sqlite"))
    assert code == 0, out
    both = ["--archive", str(tmp_path / "a1.sqlite"), "--archive", str(tmp_path / "a2.sqlite")]
    code, out = _cli("audit", "--state-dir", str(state), *both)
    assert code == 0 and "0 mismatches" in out, out
    # The cut snapshot is kept as the new start, whatever the pruning of newer ones.
    with Journal.open(state / "journal.sqlite") as j:
        base = j.archived_through
    _work(state, 3, 120, t)
    assert base in {s.header.seq for s in snapshot.listing(state)}

    # Only the newer archive, or the two out of order: not the journal's history.
    code, out = _cli("audit", "--state-dir", str(state), "--archive", str(tmp_path / "a2.sqlite"))
    assert code == 1 and "starts at entry" in out, out
    code, out = _cli("audit", "--state-dir", str(state), *both[2:], *both[:2])
    assert code == 1 and "archive:" in out


def test_an_altered_archive_fails_the_audit(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _work(state, 4, 100, 0.0)
    a1 = tmp_path / "a1.sqlite"
    assert _cli("archive", "--state-dir", str(state), "--out", str(a1))[0] == 0
    with sqlite3.connect(a1) as conn:
        seq, decisions = conn.execute(
            "SELECT seq, decisions FROM entries LIMIT 1 OFFSET 5"
        ).fetchone()
        conn.execute(
            "UPDATE entries SET decisions = ? WHERE seq = ?",
            (json.dumps(json.loads(decisions)[:-1] or [{"kind": "forged"}]), seq),
        )
    code, out = _cli("audit", "--state-dir", str(state), "--archive", str(a1))
    assert code == 1 and "the archives' hash is not the one the journal recorded" in out, out


def test_a_new_build_rebuilds_the_start_from_the_archive(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _work(state, 5, 100, 0.0)
    a1 = tmp_path / "a1.sqlite"
    assert _cli("archive", "--state-dir", str(state), "--out", str(a1))[0] == 0
    # Every snapshot as another build of the engine would have written it.
    for s in snapshot.listing(state):
        raw = s.path.read_bytes()
        line, payload = raw.split(b"\n", 1)
        h = json.loads(line)
        h["code"] = "0" * 64
        s.path.write_bytes(json.dumps(h).encode() + b"\n" + payload)
    with pytest.raises(JournalError, match="bursar journal rebase"):
        Runtime.open(state, config())
    code, out = _cli("rebase", "--state-dir", str(state))
    assert code == 1 and "give the archive" in out
    code, out = _cli("rebase", "--state-dir", str(state), "--archive", str(a1))
    assert code == 0, out
    with Runtime.open(state, config()) as rt:
        assert rt.snapshots is not None and rt.snapshots.last > 0
    code, out = _cli("audit", "--state-dir", str(state), "--archive", str(a1))
    assert code == 0 and "0 mismatches" in out, out


def test_archiving_needs_the_broker_stopped_and_a_verified_snapshot(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Runtime.open(state, config(), snapshot_every=0) as rt:
        _workload(rt, random.Random(6), 0.0, 40)
    code, out = _cli("archive", "--state-dir", str(state), "--out", str(tmp_path / "a.sqlite"))
    assert code == 1 and "no verified snapshot" in out, out
    assert not (tmp_path / "a.sqlite").exists()
    _work(state, 7, 80, 1000.0)
    with open(state / "serve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, out = _cli("archive", "--state-dir", str(state), "--out", str(tmp_path / "a.sqlite"))
    assert code == 2 and "archiving needs the broker stopped" in out, out
    with Journal.open(state / "journal.sqlite") as j:
        assert j.archived_through == 0


def test_numbering_goes_on_after_a_cut_at_the_last_entry(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Runtime.open(state, config(), snapshot_every=100_000) as rt:
        _workload(rt, random.Random(8), 0.0, snapshot.CLOSE_MIN)
        last = rt.journal.last_seq
    assert snapshot.listing(state)[0].header.seq == last  # written at close
    assert _cli("archive", "--state-dir", str(state), "--out", str(tmp_path / "a.sqlite"))[0] == 0
    with Runtime.open(state, config()) as rt:
        assert len(rt.journal) == 0 and rt.journal.last_seq == last
        assert rt.submit(Tick(rt.engine.now + 1)).seq == last + 1
