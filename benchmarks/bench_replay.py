"""Trace replay wall time on HPC2N (202,870 jobs): parsing alone, then FIFO, EASY and
conservative backfill with strict invariants on and parsing included (goals on the
project's 2-core machine: FIFO <= 5 s, EASY <= 5 s, conservative <= 30 s).

    python benchmarks/bench_replay.py [--trace FILE] [--policies fifo easy conservative]
        [--bursar-jobs N]

Each policy run reads the trace again (parse + filter + map + replay + metrics), as
``bursar replay`` does; the ratio column compares it with parsing alone measured in the
same run. ``--bursar-jobs N`` also times the bursar policy (the full broker engine per
decision) on the first N jobs.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from bursar.sim.replay.ingest import load_trace
from bursar.sim.replay.run import replay_trace

DEFAULT = (
    Path(
        os.environ.get("BURSAR_TRACES_DIR")
        or Path(__file__).resolve().parents[1].parent / "shared" / "traces"
    )
    / "pwa-hpc2n"
    / "HPC2N-2002-2.2-cln.swf.gz"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT)
    ap.add_argument("--policies", nargs="+", default=["fifo", "easy", "conservative"])
    ap.add_argument("--bursar-jobs", type=int, default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    trace = load_trace(args.trace)
    parse = time.perf_counter() - t0
    n = len(trace.jobs)
    print(f"{args.trace.name}: {n:,} jobs after the default filter")
    print(f"{'run':<28}{'wall (s)':>10}{'jobs/s':>12}{'x parse':>10}")
    print(f"{'parse + filter (baseline)':<28}{parse:>10.2f}{n / parse:>12,.0f}{1.0:>10.1f}")
    runs = [(p, None) for p in args.policies]
    if args.bursar_jobs:
        runs.append(("bursar", args.bursar_jobs))
    for policy, limit in runs:
        t0 = time.perf_counter()
        r = replay_trace(args.trace, policy, strict=True, limit=limit)
        wall = time.perf_counter() - t0
        jobs = r.metrics["jobs"]
        label = policy if limit is None else f"{policy} (first {limit:,})"
        print(f"{label + ', strict':<28}{wall:>10.2f}{jobs / wall:>12,.0f}{wall / parse:>10.1f}")


if __name__ == "__main__":
    main()
