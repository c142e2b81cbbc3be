"""``bursar whatif --power-sweep``: the cap sweep from the command line, on a small trace
and a small node-day power table written in Marconi100's schema."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bursar.cli.main import main

HEADER = (
    "node,day,ambient_mean,ambient_max,ambient_n,total_power_mean,total_power_max,total_power_n\n"
)


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    swf = tmp_path / "small.swf"
    lines = ["; MaxProcs: 10", "; UnixStartTime: 0"]
    for i, (submit, run_s, procs) in enumerate(
        [(0, 100, 8), (10, 50, 4), (20, 30, 2), (30, 60, 3)], 1
    ):
        lines.append(f"{i} {submit} 0 {run_s} {procs} -1 -1 {procs} {run_s} -1 1 1 1 -1 1 1 -1 -1")
    swf.write_text("\n".join(lines) + "\n")
    table = tmp_path / "cov.csv"
    table.write_text(
        HEADER
        + "".join(f"{n},2020-05-01,20,25,4320,{300 + 5 * n},{1500 + n},4320\n" for n in range(200))
    )
    return swf, table


def test_the_sweep_writes_its_report_with_the_floor_and_every_cap(tmp_path: Path) -> None:
    swf, table = _inputs(tmp_path)
    out = tmp_path / "out"
    r = CliRunner().invoke(
        main,
        [
            "whatif",
            "--trace",
            str(swf),
            "--power-sweep",
            "auto",
            "--node-power",
            str(table),
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "floor" in r.output
    rep = json.loads((out / "power-sweep.json").read_text())
    assert rep["policy"] == "easy"  # the default under --power-sweep
    assert rep["rows"][0]["cap_kw"] is None
    caps = [row["cap_kw"] for row in rep["rows"][1:]]
    assert caps == sorted(caps, reverse=True) and len(caps) > 3
    for row in rep["rows"][1:]:
        assert row["peak_kw"] <= row["cap_kw"]
        assert row["hours_above"] == 0.0
    # Below the floor the largest job is stranded.
    assert any(row["stranded"] for row in rep["rows"][1:] if row["cap_kw"] < rep["floor_kw"])
    md = (out / "power-sweep.md").read_text()
    assert "feasibility floor" in md and "| none |" in md


def test_bad_sweeps_are_usage_errors(tmp_path: Path) -> None:
    swf, table = _inputs(tmp_path)
    run = CliRunner().invoke
    base = ["whatif", "--trace", str(swf), "--node-power", str(table), "--out", str(tmp_path)]
    r = run(main, [*base, "--power-sweep", "lots"])
    assert r.exit_code == 2 and "give auto or caps in kW" in r.output
    r = run(main, [*base, "--power-sweep", "0.1"])
    assert r.exit_code == 1 and "above the machine's idle draw" in r.output
    r = run(main, [*base, "--power-sweep", "auto", "--policy", "sjf"])
    assert r.exit_code == 1 and "a power cap is kept by fifo, easy, conservative" in r.output
    r = run(main, [*base, "--power-sweep", "auto", "--candidate", "capacity=5"])
    assert r.exit_code == 2 and "--power-sweep runs alone" in r.output
    r = run(main, ["whatif", "--trace", str(swf)])
    assert r.exit_code == 2 and "Missing option '--candidate'" in r.output
    r = run(main, [*base[:-2], "--power-sweep", "auto", "--node-power", str(tmp_path / "none.csv")])
    assert r.exit_code == 1 and "no such file" in r.output


def test_replay_keeps_a_power_cap_and_reports_the_draw(tmp_path: Path) -> None:
    swf, table = _inputs(tmp_path)
    out = tmp_path / "run"
    args = ["replay", "--trace", str(swf), "--policy", "easy", "--node-power", str(table)]
    r = CliRunner().invoke(main, [*args, "--meter-power", "--out", str(out)])
    assert r.exit_code == 0, r.output
    metered = json.loads((out / "metrics.json").read_text())["power"]
    assert metered["stranded"] == 0
    # A cap just under the largest job's own draw strands it.
    cap = metered["floor_kw"] - 0.01
    r = CliRunner().invoke(main, [*args, "--power-cap", str(cap), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "stranded" in r.output
    m = json.loads((out / "metrics.json").read_text())
    assert m["power"]["stranded"] == 1 and m["power"]["peak_kw"] <= cap
    assert m["manifest"]["config"]["power"]["cap_w"] == cap * 1e3
    r = CliRunner().invoke(main, [*args, "--power-cap", "50", "--policy", "bursar"])
    assert r.exit_code == 1 and "a power cap is kept by" in r.output
