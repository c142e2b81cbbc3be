"""The documented benchmark commands run as written (at small sizes: the figures
docs/results/benchmarks.md quotes come from the full runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_bench_engine_prints_decisions_per_second() -> None:
    out = _run(
        "benchmarks/bench_engine.py", "--campaigns", "50", "--pending", "300", "--events", "300"
    )
    assert "deep queue" in out and "decisions/s" in out


def test_bench_engine_scaling_prints_a_table_against_the_smallest_pool() -> None:
    out = _run(
        "benchmarks/bench_engine.py",
        "--scaling",
        "--campaigns",
        "40",
        "--nodes",
        "16,64",
        "--pendings",
        "100,400",
        "--events",
        "150",
        "--repeat",
        "2",
    )
    rows = [
        r for r in (line.split() for line in out.splitlines()) if len(r) == 8 and r[0].isdigit()
    ]
    assert len(rows) == 4
    # Each 16-node row is its own baseline.
    assert [r[-2] for r in rows if r[0] == "16"] == ["1.00", "1.00"]


@pytest.mark.parametrize("sizes", [[], ["--size-rule", "powers_of_two"]])
def test_bench_elastic_prints_cost_against_fixed_leases(sizes: list[str]) -> None:
    out = _run(
        "benchmarks/bench_elastic.py",
        "--leases",
        "20,60",
        "--nodes",
        "32",
        "--events",
        "150",
        "--repeat",
        "1",
        *sizes,
    )
    assert ("powers_of_two" if sizes else "every whole size") in out, out
    rows = [r for r in (line.split() for line in out.splitlines()) if r and r[0] in ("20", "60")]
    assert len(rows) == 2 and all("[" in r[-1] for r in rows), out


def test_bench_whatif_copies_the_engine_both_ways_and_each_copy_decides_alike() -> None:
    out = _run(
        "benchmarks/bench_whatif.py",
        *("--leases", "200", "--ended", "100", "--pending", "20", "--repeat", "2", "--service"),
    )
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {"pickle", "deepcopy", "service:", "WhatIf", "Acquire"}, out
    for name in ("pickle", "deepcopy"):
        assert "same digest: True" in rows[name] and "same decision: True" in rows[name], out
    assert "202 live leases" in rows["service:"], out  # 200, and the 2 timed Acquires


def test_bench_service_prints_the_ratio_to_the_empty_handler() -> None:
    out = _run(
        "benchmarks/bench_service.py", "--clients", "1,4", "--seconds", "0.5", "--rounds", "1"
    )
    assert "ratio" in out.lower() or "x empty" in out.lower(), out


def test_bench_dashboard_prints_the_ratio_with_streams_to_without() -> None:
    out = _run(
        "benchmarks/bench_dashboard.py",
        *("--clients", "2", "--seconds", "0.5", "--rounds", "2", "--streams", "2"),
    )
    rows = [line.split("|") for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 2, out
    # The streams got the opening state and the lease events of the pairs.
    assert all(int(r[-1]) > 2 for r in rows), out
    assert "ratio" in out and "median" in out, out


def test_bench_replay_prints_wall_times_against_parsing() -> None:
    traces = Path(os.environ.get("BURSAR_TRACES_DIR") or ROOT.parent / "shared" / "traces")
    if not (traces / "pwa-hpc2n" / "HPC2N-2002-2.2-cln.swf.gz").exists():
        pytest.skip(f"no HPC2N trace under {traces} (set BURSAR_TRACES_DIR)")
    out = _run(
        "benchmarks/bench_replay.py",
        "--policies",
        "fifo",
        "easy",
        "--bursar-jobs",
        "300",
        "--repeat",
        "1",
    )
    assert "bursar / easy" in out and "x parse" in out


def test_soak_runs_alone_and_prints_its_percentiles(tmp_path: Path) -> None:
    out = _run(
        "benchmarks/reliability/soak.py",
        "--mode",
        "short",
        "--agents",
        "4",
        "--seconds",
        "4",
        "--window",
        "2",
        "--out",
        str(tmp_path / "soak.json"),
    )
    assert "p99.9" in out, out
