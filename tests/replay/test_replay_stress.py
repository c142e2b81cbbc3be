"""bursar whatif --stress: the candidates graded on generated workloads as well as on the
history, and a table that says which scenario each candidate fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.cli.main import main
from bursar.sim.replay.stress import SCENARIOS, scenario_params, summary


def _history(tmp_path: Path) -> Path:
    p = tmp_path / "history.swf"
    p.write_text(
        "; MaxProcs: 16\n"
        + "".join(
            f"{i} {i * 30} 0 {100 + 37 * (i % 7)} {1 + i % 8} -1 -1 {1 + i % 8} 600 -1 1 "
            f"{i % 5} 1 -1 1 1 -1 -1\n"
            for i in range(1, 301)
        )
    )
    return p


def test_stress_grades_every_scenario_and_names_the_ones_a_candidate_fails(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main,
        [
            "whatif",
            "--trace",
            str(_history(tmp_path)),
            "--policy",
            "fifo",
            "--candidate",
            "policy=easy",
            "--candidate",
            "capacity=4",
            "--stress",
            "--stress-jobs",
            "300",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads((out / "stress.json").read_text())
    rows = {r["label"]: r for r in data["candidates"]}
    assert set(rows["capacity=4"]["verdicts"]) == {"history", *SCENARIOS}
    # A quarter of the machine: the history's jobs wait far longer (rejected there).
    cap = rows["capacity=4"]
    assert "history" in cap["fails"]
    assert cap["fails"] == [s for s, v in cap["verdicts"].items() if v != "accepted"]
    assert f"capacity=4: fails in {', '.join(cap['fails'])}" in res.output
    assert set(rows["policy=easy"]["verdicts"]) == {"history", *SCENARIOS}
    md = (out / "stress.md").read_text()
    assert "| candidate | history | base | heavy-tail | burst | one-user | low-load |" in md
    for name in SCENARIOS:
        # Each scenario's workload and full report beside the table.
        assert (out / "stress" / name / f"{name}.swf.gz").is_file()
        assert (out / "stress" / name / "whatif.json").is_file()


def test_a_scenario_workload_is_the_same_for_the_same_seed() -> None:
    a = scenario_params("burst", 64, 500, 3)
    assert a == scenario_params("burst", 64, 500, 3) and a.burst is not None
    assert a.capacity == 64 and a.jobs == 500
    with pytest.raises(ValueError, match="unknown stress scenario 'storm'"):
        scenario_params("storm", 64, 500, 3)


def test_summary_lists_the_settings_each_candidate_fails() -> None:
    rows = summary({"history": {"a": "accepted", "b": "rejected"}, "burst": {"a": "rejected"}})
    assert rows == [
        {
            "label": "a",
            "verdicts": {"history": "accepted", "burst": "rejected"},
            "fails": ["burst"],
        },
        {
            "label": "b",
            "verdicts": {"history": "rejected", "burst": "not run"},
            "fails": ["history", "burst"],
        },
    ]
