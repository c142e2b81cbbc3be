"""Snapshots: a restart from the newest snapshot and the journal's tail is the same broker
as a restart that replays the whole journal, and a snapshot that is not of this journal,
this build or this content is never loaded."""

from __future__ import annotations

import contextlib
import hashlib
import json
import pickle
import random
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import config

from bursar.broker import snapshot
from bursar.broker.errors import RequestError
from bursar.broker.events import Release, Renew, RequestLease, Tick
from bursar.broker.journal import Journal, replay
from bursar.broker.runtime import Runtime
from bursar.broker.supply import supply
from bursar.cli.main import main

CAMPAIGNS = ("sci", "other", "backfill")


def _workload(rt: Runtime, rng: random.Random, t: float, n: int) -> float:
    """``n`` seeded requests, releases, renewals and ticks through the runtime, with the
    reads a service makes in between (supply, reservations, the next timer)."""
    for _ in range(n):
        t += rng.choice((0.1, 0.5, 2.0, 7.0))
        r = rng.random()
        leases = sorted(rt.engine.leases)
        if r < 0.5 or not leases:
            ev = RequestLease(
                t,
                rng.choice(CAMPAIGNS),
                {"gpu": rng.choice((1, 2, 4, 8))},
                rng.choice((5.0, 30.0, 120.0)),
                blocking=rng.random() < 0.6,
            )
        elif r < 0.8:
            ev = Release(t, rng.choice(leases))
        elif r < 0.9:
            ev = Renew(t, rng.choice(leases), 60.0)
        else:
            ev = Tick(t)
        with contextlib.suppress(RequestError):  # a release of an ended lease, say
            rt.submit(ev)
        supply(rt.engine)
        for p in list(rt.engine.pending.values())[:2]:
            rt.engine.reservation(p.id)
        rt.engine.next_timer()
    return t


def _run(state: Path, seed: int, n: int, every: int, t: float = 0.0) -> float:
    with Runtime.open(state, config(), snapshot_every=every) as rt:
        return _workload(rt, random.Random(seed), t, n)


def test_restart_from_a_snapshot_is_the_same_broker_as_a_full_replay(tmp_path: Path) -> None:
    snap_dir, plain_dir = tmp_path / "snap", tmp_path / "plain"
    # The same seeded work in two halves, with a restart between them: one broker takes
    # snapshots (every 25 entries), the other none.
    t = _run(snap_dir, 1, 150, every=25)
    _run(plain_dir, 1, 150, every=0)
    snaps = snapshot.listing(snap_dir)
    assert [s.header.seq for s in snaps] == sorted((s.header.seq for s in snaps), reverse=True)
    assert 0 < len(snaps) <= snapshot.KEEP and not (plain_dir / snapshot.DIRNAME).exists()
    with Journal.open(snap_dir / "journal.sqlite") as j:
        engine, used = snapshot.restore(j, snap_dir)
        assert used == snaps[0].header.seq > 0
        assert snapshot.fingerprint(engine) == snapshot.fingerprint(replay(j))
        assert engine.state_digest() == replay(j).state_digest()
    _run(snap_dir, 2, 150, every=25, t=t)
    _run(plain_dir, 2, 150, every=0, t=t)
    # Byte for byte the same journal: the resumed engine decided exactly as the replayed one.
    with (
        Journal.open(snap_dir / "journal.sqlite") as a,
        Journal.open(plain_dir / "journal.sqlite") as b,
    ):
        assert a.last_seq > 300 and a.sha256() == b.sha256()
    result = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(snap_dir)])
    assert result.exit_code == 0, result.output
    assert result.output.count(": ok, matches the replay") == len(snapshot.listing(snap_dir))


def _rewrite(path: Path, header: dict | None = None, state: bytes | None = None) -> None:
    """Rewrite a snapshot file with a changed header or payload, hashes made consistent."""
    raw = path.read_bytes()
    line, payload = raw.split(b"\n", 1)
    h = json.loads(line)
    if state is not None:
        payload = zlib.compress(state)
        h["payload_sha256"] = hashlib.sha256(payload).hexdigest()
        h["payload_bytes"] = len(payload)
    h.update(header or {})
    path.write_bytes(json.dumps(h).encode() + b"\n" + payload)


def _newest(state: Path) -> snapshot.Snapshot:
    return snapshot.listing(state)[0]


def _resumed_from(state: Path) -> int:
    with Journal.open(state / "journal.sqlite") as j:
        engine, used = snapshot.restore(j, state)
        assert snapshot.fingerprint(engine) == snapshot.fingerprint(replay(j))
        return used


def test_a_damaged_snapshot_is_skipped_for_the_one_before(tmp_path: Path) -> None:
    _run(tmp_path, 3, 120, every=20)
    newest, older = snapshot.listing(tmp_path)
    raw = bytearray(newest.path.read_bytes())
    raw[-10] ^= 0xFF
    newest.path.write_bytes(bytes(raw))
    assert _resumed_from(tmp_path) == older.header.seq
    result = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1 and "damaged" in result.output


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"code": "0" * 64}, "another build"),
        ({"meta_sha256": "0" * 64}, "another pool or policy"),
        ({"entry_sha256": "0" * 64}, "not the one it was taken after"),
        ({"seq": 10**9}, "past the journal's last"),
        ({"format": "bursar-snapshot/0"}, "format"),
    ],
)
def test_a_snapshot_of_another_journal_or_build_is_not_loaded(
    tmp_path: Path, change: dict, why: str
) -> None:
    _run(tmp_path, 4, 60, every=20)
    for s in snapshot.listing(tmp_path):
        _rewrite(s.path, change)
    assert _resumed_from(tmp_path) == 0  # the whole journal replayed
    with Journal.open(tmp_path / "journal.sqlite") as j:
        assert why in (snapshot.problem(_newest(tmp_path), j) or "")


def test_a_snapshot_of_another_state_fails_the_audit(tmp_path: Path) -> None:
    _run(tmp_path, 5, 120, every=20)
    newest, older = snapshot.listing(tmp_path)
    # The older snapshot's state under the newer one's header: loads, but is not the state
    # the journal reaches at that entry.
    _rewrite(newest.path, state=zlib.decompress(older.path.read_bytes().split(b"\n", 1)[1]))
    result = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"snapshot at entry {newest.header.seq}: FAILED, the state it holds differs" in (
        result.output
    )


class _Evil:
    def __reduce__(self) -> tuple:
        import os

        return (os.system, ("echo pwned",))


def test_a_snapshot_may_only_hold_the_brokers_own_objects(tmp_path: Path) -> None:
    _run(tmp_path, 6, 60, every=20)
    _rewrite(_newest(tmp_path).path, state=pickle.dumps(_Evil()))
    with pytest.raises(Exception, match="may not refer to"):
        snapshot.load_state(_newest(tmp_path))


def test_a_restart_after_close_replays_nothing(tmp_path: Path) -> None:
    """Closing with enough entries since the newest snapshot writes one more."""
    with Runtime.open(tmp_path, config(), snapshot_every=100_000) as rt:
        _workload(rt, random.Random(7), 0.0, snapshot.CLOSE_MIN + 10)
        last = rt.journal.last_seq
    assert _newest(tmp_path).header.seq == last
    assert _resumed_from(tmp_path) == last


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80), every=st.integers(1, 30))
def test_any_snapshot_holds_the_state_the_replay_reaches(
    tmp_path_factory: pytest.TempPathFactory, seed: int, n: int, every: int
) -> None:
    state = tmp_path_factory.mktemp("snap")
    _run(state, seed, n, every=every)
    with Journal.open(state / "journal.sqlite") as j:
        for snap in snapshot.listing(state):
            assert snapshot.problem(snap, j) is None
            held = snapshot.load_state(snap)
            engine = replay_to(j, snap.header.seq)
            assert snapshot.fingerprint(held) == snapshot.fingerprint(engine)


def replay_to(j: Journal, seq: int):
    from bursar.broker.journal import apply_recorded, decode_entry_event, new_engine

    engine = new_engine(j)
    for s, event_json, _ in j.raw_entries():
        if s > seq:
            break
        apply_recorded(j, engine, s, decode_entry_event(j, s, event_json))
    return engine
