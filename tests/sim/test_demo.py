"""The main job (`make demo`): the scripted demo session, its journal and its report."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from bursar.broker.audit import audit
from bursar.broker.journal import Journal
from bursar.cli.main import main
from bursar.sim.demo import run_demo


def test_demo_is_deterministic_and_audits_clean(tmp_path: Path) -> None:
    d1, sha1 = run_demo(tmp_path / "a")
    d1.broker.close()
    d2, sha2 = run_demo(tmp_path / "b")
    d2.broker.close()
    assert sha1 == sha2
    with Journal.open(tmp_path / "a" / "journal.sqlite") as j:
        report = audit(j)
    assert report.ok and report.decisions_checked > 100
    kinds = {k for (_, k) in d1.trace.counts}
    # The session exercises every path and the main refusals.
    assert {"grant", "reject", "preempt_warning", "revoke", "meter", "power_on"} <= kinds
    reasons = {why for *_, why in d1.trace.notable}
    assert any("burst" in r or "bucket" in r for r in reasons)


def test_bursar_demo_writes_a_report_a_person_can_open(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "0 mismatches" in result.output and "journal SHA-256" in result.output
    page = (out / "report.html").read_text()
    assert "<img" in page and "data:image/png;base64," in page and "victim" in page
    assert (out / "summary.json").exists()
    # The state dir is a journal the audit command accepts.
    audited = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(out)])
    assert audited.exit_code == 0, audited.output
    # Part 2: the agent session against the broker service over gRPC (tests in
    # test_demo_service.py), with its own state dir and a clean audit.
    for needle in ("PREEMPT_WARNING", "ACTIVATED", "RENEWED", "ABOVE_BURST", "service audit:"):
        assert needle in result.output
    assert result.output.count("0 mismatches") == 2
    audited = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(out / "service")])
    assert audited.exit_code == 0, audited.output
