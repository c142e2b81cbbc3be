"""Simulator wall time: one seed of the agent-burst scenario (2 simulated hours), and optionally
the full experiments of ``bursar sim experiments``.

    python benchmarks/bench_sim.py [--seeds 1 2 3] [--minutes 120]
    python benchmarks/bench_sim.py --experiments [--quick] [--workers N] [--scheduler ADDR]
        [--out DIR]

Runs each seed into a temporary state dir (journal included, as ``bursar sim run`` does)
and prints the wall time, the broker events applied and events/s (goal: <= 3 s per seed).
With ``--experiments`` it then runs every cell of the three sweeps on Dask (a local
cluster, one worker per core, unless ``--scheduler``) and prints the sweep's wall time
against the summed wall time of its cells (the parallel speed-up, cluster start and stop
included) and against one scenario seed measured in the same run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bursar.sim.scenario import run_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--minutes", type=float, default=120.0)
    ap.add_argument("--experiments", action="store_true", help="also time `bursar sim experiments`")
    ap.add_argument("--quick", action="store_true", help="the experiments' --quick grid")
    ap.add_argument("--workers", type=int, default=None, help="local cluster workers")
    ap.add_argument("--scheduler", default=None, help="a Dask scheduler address")
    ap.add_argument(
        "--out", type=Path, default=None, help="keep the experiments' JSON and PNGs here"
    )
    args = ap.parse_args()
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            t0 = time.perf_counter()
            r = run_seed(seed, Path(tmp) / f"seed-{seed}", duration=args.minutes * 60)
            wall = time.perf_counter() - t0
            walls.append(wall)
            print(
                f"seed {seed}: {wall:.2f} s wall, {r.events} events "
                f"({r.events / wall:.0f} events/s), journal {r.journal_sha256[:16]}"
            )
        per_seed = sum(walls) / len(walls)
        print(f"mean {per_seed:.2f} s per seed (goal <= 3 s)")
        if not args.experiments:
            return
        from rich.console import Console

        from bursar.sim.study import run_experiments

        results, table, _, wall = run_experiments(
            args.out or Path(tmp) / "experiments",
            seeds=tuple(args.seeds),
            quick=args.quick,
            scheduler=args.scheduler,
            workers=args.workers,
            console=Console(stderr=True),
        )
    cell_s = sum(r["wall_s"] for r in results)
    grid = "quick" if args.quick else "full"
    print(
        f"experiments ({grid} grid, {len(results)} cells, seeds {args.seeds}): {wall:.1f} s wall; "
        f"cells sum to {cell_s:.1f} s ({cell_s / wall:.2f}x parallel speed-up); "
        f"{wall / per_seed:.0f}x one scenario seed"
    )
    misses = [c["claim"] for c in table if not c["holds"]]
    print(
        f"claims: {len(table) - len(misses)} of {len(table)} hold"
        + (f"; miss: {misses}" if misses else "")
    )


if __name__ == "__main__":
    main()
