"""Simulator wall time: one seed of the §3 scenario (2 simulated hours), per seed.

    python benchmarks/bench_sim.py [--seeds 1 2 3] [--minutes 120]

Runs each seed into a temporary state dir (journal included, as ``bursar sim run`` does)
and prints the wall time, the broker events applied and events/s. Goal: <= 3 s per seed.
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
    print(f"mean {sum(walls) / len(walls):.2f} s per seed (goal <= 3 s)")


if __name__ == "__main__":
    main()
