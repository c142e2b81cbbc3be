"""Part 2 of ``bursar demo``: an agent session against the real broker service, over
gRPC with the client library, printed as what happened and why."""

from __future__ import annotations

import fcntl
import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

from bursar.cli.main import main
from bursar.sim import demo_service
from bursar.sim.demo_service import (
    BACKFILL,
    SCIENCE,
    SessionError,
    fresh_state_dir,
    run_service_session,
)


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=200, color_system=None), buf


def _released(state_dir: Path) -> bool:
    """The server gave up the state directory (its lock can be taken)."""
    fd = os.open(state_dir / "serve.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_the_agent_session_runs_end_to_end_over_grpc(tmp_path: Path) -> None:
    state = tmp_path / "service"
    console, buf = _console()
    result = run_service_session(state, console)
    printed = buf.getvalue()

    assert result.ok and result.audit is not None and result.audit.decisions_checked > 10
    assert result.address.startswith("127.0.0.1:") and not result.address.endswith(":0")
    assert "0 mismatches" in result.audit_line and result.audit_line in printed
    assert result.wall_s < 15

    for s in result.steps:  # every step was printed as it happened
        assert s.what[:40] in printed

    def first(agent: str, needle: str) -> int:
        found = [i for i, s in enumerate(result.steps) if s.agent == agent and needle in s.what]
        assert found, f"no {agent} step with {needle!r} in:\n{result.text()}"
        return found[0]

    # 1. backfill: a preemptible lease, warm on the batch campaigns' lent reserve.
    granted = first(BACKFILL, "granted on the WARM path")
    backfill_active = first(BACKFILL, "watch: ACTIVATED")
    # 2. supply signals, with time to N GPUs per path and the bucket.
    supply = first(SCIENCE, "supply:")
    time_to = first(SCIENCE, "time to 160 GPUs")
    bucket = first(SCIENCE, "its bucket: 300,000 GPU-s")
    assert "cold 2.5 s" in result.steps[time_to].what
    # 3. reclaim: its own reserve taken back from backfill (the rest boots): the warning
    # with its deadline, an early release, the activation.
    claim = first(SCIENCE, "granted on the COLD path")
    warning = first(BACKFILL, "watch: PREEMPT_WARNING")
    drained = first(BACKFILL, "RELEASED")
    activated = first(SCIENCE, "watch: ACTIVATED")
    assert "deadline +" in result.steps[warning].what
    assert "before the deadline" in result.steps[drained].what
    # 4. renewal, then refusals with reason and retry-after.
    renewed = first(SCIENCE, "RENEWED")
    over_burst = first(SCIENCE, "Refused ABOVE_BURST, retry after")
    over_bucket = first(SCIENCE, "Refused BUCKET_EMPTY, retry after")
    # 5. everything released.
    released = first(SCIENCE, "release ")
    none_left = first("broker", "0 live leases")
    assert (
        granted
        < backfill_active
        < supply
        < time_to
        < bucket
        < claim
        < warning
        < drained
        < activated
        < renewed
        < over_burst
        < over_bucket
        < released
        < none_left
    )
    for needle in ("PREEMPT_WARNING", "ACTIVATED", "RENEWED", "ABOVE_BURST", "BUCKET_EMPTY"):
        assert needle in printed

    # The service stopped: the state directory is free, and its journal audits clean.
    assert _released(state)
    audited = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert audited.exit_code == 0, audited.output


def test_the_broker_stops_cleanly_when_the_session_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Boom(Exception):
        pass

    def fail(*_: object) -> str:
        raise Boom("an agent crashed")

    monkeypatch.setattr(demo_service, "_backfill_why", fail)
    state = tmp_path / "service"
    with pytest.raises(Boom):
        run_service_session(state, _console()[0])
    assert _released(state)
    # What it decided before failing was journaled and audits clean; a new session on the
    # same directory starts fresh.
    audited = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert audited.exit_code == 0, audited.output


def test_a_state_dir_is_reused_only_if_it_is_one(tmp_path: Path) -> None:
    old = tmp_path / "service"
    old.mkdir()
    for name in ("journal.sqlite", "journal.sqlite-wal", "tokens.json", "admin.token"):
        (old / name).write_text("x")
    fresh_state_dir(old)
    assert not old.exists()

    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(SessionError, match="choose another --out"):
        fresh_state_dir(other)
    assert (other / "notes.txt").exists()


def test_bursar_demo_no_service_skips_part_two(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--no-service", "--show", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "0 mismatches" in result.output and (out / "report.html").exists()
    assert "Part 2" not in result.output and not (out / "service").exists()


def test_bursar_demo_exits_1_when_the_service_session_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_: object) -> str:
        raise SessionError("the broker did [not] answer")

    monkeypatch.setattr(demo_service, "_backfill_why", fail)
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--show", "1", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "service session failed: the broker did [not] answer" in result.output
    assert _released(out / "service")
