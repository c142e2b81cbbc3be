"""Trace replay wall time on HPC2N (202,870 jobs): parsing alone, then FIFO, EASY and
conservative backfill and the bursar policy, with strict invariants on and parsing
included (goals on the project's 2-core machine: FIFO <= 5 s, EASY <= 5 s, conservative
<= 30 s, bursar within 3x EASY).

    python benchmarks/bench_replay.py [--trace FILE] [--policies fifo easy conservative]
        [--no-bursar] [--bursar-jobs N] [--repeat K]

Each policy run reads the trace again (parse + filter + map + replay + metrics), as
``bursar replay`` does; the "x parse" column compares it with parsing alone measured in
the same run. The bursar policy (the full broker engine per decision) runs on the whole
trace unless ``--bursar-jobs N`` keeps its first N jobs. ``--repeat K`` runs every row K
times, interleaved (one round of every row, then the next) so that a slow spell of a
shared machine hits every row alike; each row shows its median and its range, and the
last line the bursar/EASY ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
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
    ap.add_argument("--bursar", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--bursar-jobs", type=int, default=None, help="bursar on the first N only")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    runs: list[tuple[str, int | None]] = [(p, None) for p in args.policies if p != "bursar"]
    if args.bursar or "bursar" in args.policies:
        runs.append(("bursar", args.bursar_jobs))
    walls: dict[str, list[float]] = {"parse": []}
    jobs: dict[str, int] = {}
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        trace = load_trace(args.trace)
        walls["parse"].append(time.perf_counter() - t0)
        jobs["parse"] = len(trace.jobs)
        for policy, limit in runs:
            t0 = time.perf_counter()
            r = replay_trace(args.trace, policy, strict=True, limit=limit)
            walls.setdefault(policy, []).append(time.perf_counter() - t0)
            jobs[policy] = r.metrics["jobs"]
    parse = statistics.median(walls["parse"])
    print(f"{args.trace.name}: {jobs['parse']:,} jobs after the default filter")
    print(f"runs per row: {len(walls['parse'])} (median, then min-max)")
    print(f"{'run':<28}{'wall (s)':>10}{'range (s)':>16}{'jobs/s':>12}{'x parse':>10}")
    labels = {"parse": "parse + filter (baseline)"}
    for policy, limit in runs:
        labels[policy] = (policy if limit is None else f"{policy} (first {limit:,})") + ", strict"
    for key, label in labels.items():
        ws = walls[key]
        med = statistics.median(ws)
        span = f"{min(ws):.2f}-{max(ws):.2f}"
        print(f"{label:<28}{med:>10.2f}{span:>16}{jobs[key] / med:>12,.0f}{med / parse:>10.1f}")
    if "bursar" in walls and "easy" in walls:
        ratios = [b / e for b, e in zip(walls["bursar"], walls["easy"], strict=True)]
        ratio = statistics.median(walls["bursar"]) / statistics.median(walls["easy"])
        print(
            f"bursar / easy: {ratio:.1f}x (per round {min(ratios):.1f}-{max(ratios):.1f}x)"
            + ("" if args.bursar_jobs is None else "; bursar on a prefix only")
        )


if __name__ == "__main__":
    main()
