"""The facility experiments (``bursar sim experiments``) on the quick grid.

Each cell is a run of the real engine through the simulator. The claims are checked
with their stated bounds: prepaid extraction <= 1.1 B and grant-instant >= 3 B (for an
adversary with B = 25k GPU-s), and at 7x overbooking the guaranteed probe's p95 <= 2 s
with zero guarantee violations. The command itself runs on a real Dask local cluster,
and the cell runner on a scheduler given by address.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.cli.main import main
from bursar.sim.experiments import (
    ADVERSARY_BUCKET,
    QUICK,
    cells,
    experiment_claims,
    overbooking_config,
    run_cell,
)
from bursar.sim.scenario import max_excess
from bursar.sim.sweep import run_cells


def _row(rows: list[dict], prefix: str) -> dict:
    row = next(r for r in rows if r["claim"].startswith(prefix))
    print(f"\n{row['claim']}: measured {row['measured']} (bound {row['bound']})")
    return row


def test_max_excess_is_the_worst_interval_above_the_rate() -> None:
    # 100 GPUs for 10 s at R = 32: 680 GPU-s above R t.
    assert max_excess([(0.0, 0.0), (5.0, 100.0), (15.0, 0.0)], 32.0, 100.0) == 680.0
    # Two bursts with a refill between: the gap (20 s at 0) pays back 640 of the first
    # burst's 680, so the worst interval spans both: 680 - 640 + 680 = 720.
    steps = [(0.0, 100.0), (10.0, 0.0), (30.0, 100.0), (40.0, 0.0)]
    assert max_excess(steps, 32.0, 100.0) == pytest.approx(720.0)
    # A long gap resets it: the worst is one burst.
    steps = [(0.0, 100.0), (10.0, 0.0), (100.0, 100.0), (110.0, 0.0)]
    assert max_excess(steps, 32.0, 200.0) == pytest.approx(680.0)
    # At or below the rate there is nothing to extract; the end cuts a holding short.
    assert max_excess([(0.0, 32.0)], 32.0, 50.0) == 0.0
    assert max_excess([(0.0, 0.0), (40.0, 132.0)], 32.0, 50.0) == pytest.approx(1000.0)


def test_overbooking_configs_reach_the_factor_and_keep_guarantees_warm() -> None:
    for f in (2, 3, 4, 5, 6, 7):
        cfg = overbooking_config(f)
        gpu = [c.envelopes["gpu"] for c in cfg.campaigns]
        assert sum(e.burst for e in gpu) == 512 * f
        assert all(e.burst % 8 == 0 and e.burst <= 384 for e in gpu[3:])
        warm = sum(g.warm * g.resources["gpu"] for g in cfg.pool.groups)
        assert warm >= sum(e.guarantee for e in gpu) + 32
    names = [c.name for c in overbooking_config(7).campaigns]
    assert names[:3] == ["victim", "probe", "backfill"] and len(names) == 3 + 8
    with pytest.raises(ValueError, match="below"):
        overbooking_config(1)


def test_run_cell_rejects_an_unknown_sweep() -> None:
    with pytest.raises(ValueError, match="allowed: headroom, overbooking, enforcement"):
        run_cell({"sweep": "nope", "seed": 1, "duration_s": 60.0, "params": {}})


@pytest.fixture(scope="module")
def enforcement() -> list[dict]:
    return [run_cell(c) for c in cells(QUICK, [1], ["enforcement"])]


def test_claim_prepaid_extraction_within_1_1_b(enforcement: list[dict]) -> None:
    assert _row(experiment_claims(enforcement), "enforcement prepaid")["holds"]
    prepaid = [r for r in enforcement if r["params"]["enforcement"] == "prepaid"]
    for r in prepaid:
        assert r["measured"]["extracted_gpu_s"] <= 1.1 * ADVERSARY_BUCKET
    # The adversary does use its bucket (short leases get most of B): not a vacuous bound.
    short = min(prepaid, key=lambda r: r["params"]["lease_s"])
    assert short["measured"]["extracted_gpu_s"] >= 0.5 * ADVERSARY_BUCKET


def test_claim_grant_instant_leaks_at_least_3_b(enforcement: list[dict]) -> None:
    assert _row(experiment_claims(enforcement), "enforcement grant-instant")["holds"]
    leaks = {
        r["params"]["lease_s"]: r["measured"]["extracted_over_bucket"]
        for r in enforcement
        if r["params"]["enforcement"] == "grant_instant"
    }
    assert min(leaks.values()) >= 3.0
    # Leaks grow with lease length: tokens are only looked at when a lease is granted.
    assert leaks[max(leaks)] > leaks[min(leaks)]


def test_claim_overbooking_at_7x_guaranteed_probe(tmp_path: Path) -> None:
    r = run_cell({"sweep": "overbooking", "seed": 1, "duration_s": 2400.0, "params": {"factor": 7}})
    m = r["measured"]
    assert m["sum_burst_over_pool"] == 7.0 and m["storms"] == 8
    rows = experiment_claims([r])
    assert _row(rows, "overbooking at 7x: guaranteed probe p95")["holds"]
    assert _row(rows, "overbooking at 7x: guarantee violations")["holds"]
    assert m["probe_p95_s"] <= 2.0 and m["probe_refused"] == 0
    assert m["guarantee_violations"] == 0 and m["guaranteed_requests"] >= 40
    # The storms did storm: together they held most of the pool outside the guarantees.
    assert m["storms_mean_gpus_during_storm"] >= 200


def test_cells_run_on_a_dask_scheduler_given_by_address() -> None:
    from dask.distributed import LocalCluster

    todo = cells(QUICK, [4], ["enforcement"])[:2]
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        got = run_cells(run_cell, todo, scheduler=cluster.scheduler_address)
    assert [(r["params"], r["seed"]) for r in got] == [(c["params"], c["seed"]) for c in todo]
    assert got == [{**run_cell(c), "wall_s": g["wall_s"]} for c, g in zip(todo, got, strict=True)]


@pytest.mark.slow
def test_experiments_cli_quick_on_a_local_cluster(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    res = CliRunner().invoke(
        main,
        ["sim", "experiments", "--quick", "--seeds", "1", "--workers", "2", "--out", str(out)],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "experiments.json").read_text())
    want = cells(QUICK, [1])
    assert len(doc["cells"]) == len(want) == 10
    for got, cell in zip(doc["cells"], want, strict=True):
        assert {k: got[k] for k in cell} == cell
        assert got["measured"] and len(got["journal_sha256"]) == 64
    assert doc["grid"]["quick"] is True and doc["scheduler"].startswith("LocalCluster(2")
    assert {c["claim"].split(":")[0] for c in doc["claims"] if not c["holds"]} == set()
    for name in ("headroom", "overbooking", "enforcement"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert "Facility experiments, measured" in res.output
    assert "pass" in res.output and "10 cells" in res.output


def test_experiments_cli_rejects_bad_seeds() -> None:
    res = CliRunner().invoke(main, ["sim", "experiments", "--seeds", "1,x"])
    assert res.exit_code == 2
    assert "give integers separated by commas" in res.output


def test_experiments_cli_rejects_a_seed_given_twice(tmp_path: Path) -> None:
    # The same seed twice is the same run twice: pooled, it would weigh double.
    out = tmp_path / "out"
    res = CliRunner().invoke(main, ["sim", "experiments", "--seeds", "1,2,1", "--out", str(out)])
    assert res.exit_code == 2
    assert "seed 1 given more than once" in res.output
    assert not out.exists()
