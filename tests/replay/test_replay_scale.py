"""A long trace replays in memory that grows with the jobs far more slowly than the
trace's text and Python objects would: a generated trace of 100,000 and of 400,000 jobs,
each replayed under EASY in a fresh process by ``benchmarks/bench_replay_large.py``
(whose full run is the 1.3-million-job month), and the peak RSS compared."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_replay_large.py"
MAX_BYTES_PER_JOB = 260
"""The marginal peak memory a job may cost a replay (read, mapped, scheduled, measured):
its compact columns take about 150 bytes and measure about 200 with the allocator's
slack; the whole text and a Python object per field, as before the columns, took about
520."""


def _trace(path: Path, jobs: int, seed: int = 7) -> Path:
    """A 256-processor machine at about 70% load: Poisson arrivals, log-uniform runtimes,
    power-of-two sizes."""
    rng = random.Random(seed)
    t = 0
    lines = ["; MaxProcs: 256\n"]
    for i in range(1, jobs + 1):
        t += int(rng.expovariate(1 / 400))  # about 70% load
        run = int(10 ** rng.uniform(1, 4.5))
        size = 2 ** rng.randint(0, 6)
        req = run * rng.choice((1, 2, 4))
        user = rng.randint(1, 300)
        lines.append(f"{i} {t} 0 {run} {size} -1 -1 {size} {req} -1 1 {user} 1 -1 1 1 -1 -1\n")
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.writelines(lines)
    return path


def _peak(trace: Path) -> dict[str, float]:
    """EASY's replay of ``trace`` in a fresh process, by the benchmark's own command."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--trace", str(trace), "--policies", "easy", "--json"],
        check=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_replay_memory_per_job_stays_small_as_the_trace_grows(tmp_path: Path) -> None:
    small = _peak(_trace(tmp_path / "small.swf.gz", 100_000))
    large = _peak(_trace(tmp_path / "large.swf.gz", 400_000))
    assert (small["jobs"], large["jobs"]) == (100_000, 400_000)
    per_job = (large["peak_rss"] - small["peak_rss"]) / 300_000
    assert per_job <= MAX_BYTES_PER_JOB, f"{per_job:.0f} bytes per job"
