"""The restart benchmark runs as docs/results/benchmarks.md shows it (at a small size): the restart from a
snapshot replays less than one snapshot interval, and the server comes up SERVING."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_restart_benchmark_runs_and_resumes_from_a_snapshot(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_restart.py"),
            "--decisions",
            "3000",
            "--every",
            "500",
            "--repeat",
            "1",
            "--work",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "snapshot restore:" in out and "to SERVING" in out and "full replay" in out, out
    (row,) = json.loads((tmp_path / "results.json").read_text())
    assert row["decisions"] == 3000 and row["tail"] == 499  # the longest tail: one short
    assert len(row["restore"]) == len(row["serving"]) == len(row["full"]) == 1
