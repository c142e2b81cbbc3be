"""The agent-burst scenario: determinism, a clean audit, the CLI, and the prototype's claims.

Claims are checked with their stated bounds and the measured values are printed (run with
``-s`` to see them). Claims that the current agents and engine do not reproduce are
strict xfails with the measured value and why (see the module end). The experiments'
claims (enforcement, overbooking) are in test_sim_experiments.py.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from bursar.broker.audit import audit
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.cli.main import main
from bursar.sim.scenario import IDLE_KINDS, SeedRun, claims, run_seed

SHORT_S = 2400.0  # 40 minutes: the storm starts at 30


def test_same_seed_same_journal_hash(tmp_path: Path) -> None:
    a = run_seed(7, tmp_path / "a", duration=SHORT_S)
    b = run_seed(7, tmp_path / "b", duration=SHORT_S)
    c = run_seed(8, tmp_path / "c", duration=SHORT_S)
    assert a.journal_sha256 == b.journal_sha256
    assert a.series == b.series and a.metrics["events"] == b.metrics["events"]
    assert c.journal_sha256 != a.journal_sha256


def test_short_scenario_journal_audits_clean(tmp_path: Path) -> None:
    r = run_seed(3, tmp_path, duration=SHORT_S)
    with Journal.open(tmp_path / JOURNAL_FILENAME) as j:
        rep = audit(j)
    assert rep.ok, rep.mismatches[:3]
    assert rep.events_checked == r.events
    assert rep.journal_sha256 == r.journal_sha256


def test_sim_run_cli_writes_report_metrics_and_a_state_dir(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main, ["sim", "run", "--seed", "5", "--out", str(out), "--minutes", "20"]
    )
    assert res.exit_code == 0, res.output
    assert "sha256" in res.output
    page = (out / "report.html").read_text()
    assert "<script" in page and "http://" not in page and "https://" not in page
    m = json.loads((out / "metrics.json").read_text())
    assert set(m["seeds"]) == {"5"} and m["claims"]
    journaled = next(c for c in m["claims"] if c["claim"] == "every decision is journaled")
    assert journaled["holds"] and "0 mismatches" in journaled["measured"]
    res = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert m["journals"]["5"]["sha256"] in res.output


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), minutes=st.integers(20, 45))
def test_idle_breakdown_accounts_for_every_idle_gpu(seed: int, minutes: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        r = run_seed(seed, Path(d), duration=minutes * 60.0)
    s = r.series
    for i in range(len(s["t"])):
        held = sum(xs[i] for xs in s["held"].values())
        kinds = [s["idle"][k][i] for k in IDLE_KINDS]
        assert all(x >= -1e-6 for x in kinds), (s["t"][i], kinds)
        assert held + sum(kinds) == pytest.approx(512.0, abs=0.01)
        by_campaign = sum(xs[i] for xs in s["idle_reserve"].values())
        assert by_campaign == pytest.approx(s["idle"]["reserve"][i], abs=0.01)
    idle = r.metrics["idle_gpus"]
    assert sum(idle[k] for k in IDLE_KINDS) == pytest.approx(idle["total"], abs=0.05)
    assert idle["total"] == pytest.approx(512.0 * (1 - r.metrics["utilisation"]), abs=0.1)


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> list[SeedRun]:
    base = tmp_path_factory.mktemp("claims")
    return [run_seed(s, base / f"seed-{s}") for s in (1, 2, 3)]


def _claim(pooled: list[SeedRun], prefix: str) -> dict:
    row = next(c for c in claims(pooled) if c["claim"].startswith(prefix))
    print(f"\n{row['claim']}: measured {row['measured']} (bound {row['bound']})")
    return row


def test_claim_storm_consumption_within_b_plus_rt(pooled: list[SeedRun]) -> None:
    row = _claim(pooled, "storm consumption")
    assert row["holds"]
    for r in pooled:
        assert r.metrics["storm"]["max_interval_excess_gpu_s"] <= 150_000


def test_claim_storm_reverts_toward_sustained(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "storm reverts")["holds"]


def test_claim_isolation_victim_p95_and_no_violations(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "victim grant latency")["holds"]
    assert _claim(pooled, "guarantee violations")["holds"]


def test_claim_adaptive_produces_more_science(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "adaptive / naive science")["holds"]


def test_claim_naive_pays_twice_per_unit_of_science(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "naive / adaptive credit cost per unit")["holds"]


def test_claim_backfill_lifts_utilisation_to_85_percent(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "mean pool utilisation")["holds"]


def test_claim_storm_inference_held_to_sustained(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "storm inference")["holds"]


def test_naive_loses_tasks_only_to_io(pooled: list[SeedRun]) -> None:
    # Its leases are sized to compute time: every task it starts fits its lease without
    # I/O waits, so whatever it loses counts as lost to I/O, and only tasks that waited.
    for r in pooled:
        rs = [x for k, x in r.records if k == "task" and x["campaign"] == "naive-sci"]
        assert rs and all(x["compute_fits"] for x in rs)
        lost = [x for x in rs if not x["done"]]
        assert all(x["io_wait_s"] > 0 for x in lost)
        m = r.metrics["naive"]
        assert m["lost_to_lease_length"] == 0 and m["tasks_unfit"] == 0
        assert m["lost_to_io"] == pytest.approx(sum(x["value"] for x in lost), abs=1e-3)


# Claims the current agents and engine do not reproduce: kept as strict xfails, so a
# change that makes one hold fails here until the marker is removed. Measured on seeds
# 1, 2, 3 pooled (`bursar sim run`); the bounds are fixed in advance and not tuned toward.


@pytest.mark.xfail(
    strict=True,
    reason="measured 18.4% vs bound 25% (seeds 14.3, 26.5, 14.4%): naive's fs_bw bucket "
    "(900 GB) never runs out (its GPU bucket paces it to a few leases in two hours), so "
    "only the 2000 MB/s burst ceiling throttles it: a step waits (its I/O - 20 GB, one "
    "10 s window) / 2000 MB/s. It loses the tasks with little slack on their lease (a "
    "lease's longest task has none) whose steps move more than 20 GB: 7 tasks over 3 seeds",
)
def test_claim_naive_loses_a_quarter_of_its_science_to_io(pooled: list[SeedRun]) -> None:
    assert _claim(pooled, "naive science lost to I/O")["holds"]
