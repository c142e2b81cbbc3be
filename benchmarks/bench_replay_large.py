"""A month of a large machine: EASY (and the bursar policy) on a 1.3-million-job trace,
with the wall time and the peak resident memory of each run.

    python benchmarks/bench_replay_large.py [--jobs N] [--trace FILE]
        [--policies easy bursar] [--keep DIR]

The trace is HPC2N tiled in time (copies of the cleaned log one after another, each
shifted by the log's span, job ids renumbered) cut at ``--jobs`` (1,300,000: about a
month of Fugaku), written once as gzipped SWF; ``--trace`` replays a file of your own
instead. Each policy runs in a fresh process (``bursar replay``'s own path: read, map,
replay, metrics), so its peak RSS is its own; the CPU column is the process's own time,
which a busy shared machine stretches less than the wall time. The goals: EASY in at most
20 s and under 300 MB, the bursar policy within 5x EASY's time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# Run as a script, the benchmarks folder is on the path: the same default log.
from bench_replay import DEFAULT

_CHILD = """
import json, resource, sys, time
from bursar.sim.replay.run import replay_trace
t0 = time.perf_counter()
r = replay_trace(sys.argv[1], sys.argv[2], strict=True)
wall = time.perf_counter() - t0
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall_s": wall, "cpu_s": u.ru_utime + u.ru_stime,
                  "peak_rss": u.ru_maxrss * 1024, "jobs": r.metrics["jobs"],
                  "p95_bsld": r.metrics["p95_bsld"]}))
"""


def tile(source: Path, out: Path, jobs: int) -> int:
    """Write copies of ``source``'s job lines one after another in time until ``jobs``
    lines; returns the number written. The header is the source's (its capacity)."""
    header: list[str] = []
    body: list[list[str]] = []
    with gzip.open(source, "rt") if source.suffix == ".gz" else open(source) as f:
        for line in f:
            if line.startswith(";"):
                header.append(line)
            elif line.strip():
                body.append(line.split())
    first = min(int(t[1]) for t in body)
    span = max(int(t[1]) for t in body) - first + 3600
    written = 0
    with gzip.open(out, "wt", compresslevel=1) as f:
        f.writelines(header)
        copy = 0
        while written < jobs:
            shift = copy * span
            for t in body:
                if written == jobs:
                    break
                written += 1
                t2 = [str(written), str(int(t[1]) + shift), *t[2:]]
                f.write(" ".join(t2) + "\n")
            copy += 1
    return written


def run(trace: Path, policy: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(trace), policy],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1_300_000)
    ap.add_argument("--trace", type=Path, default=None, help="replay this file instead")
    ap.add_argument("--source", type=Path, default=DEFAULT, help="the log to tile")
    ap.add_argument("--policies", nargs="+", default=["easy", "bursar"])
    ap.add_argument("--keep", type=Path, default=None, help="write the tiled trace here")
    ap.add_argument("--json", action="store_true", help="one JSON line per policy instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace
        if trace is None:
            trace = (args.keep or Path(tmp)) / f"hpc2n-tiled-{args.jobs}.swf.gz"
            if not trace.exists():
                tile(args.source, trace, args.jobs)
        if not args.json:
            print(trace.name)
            print(
                f"{'policy':<10}{'jobs':>12}{'wall (s)':>10}{'CPU (s)':>9}"
                f"{'peak RSS (MB)':>15}{'p95 bsld':>10}"
            )
        walls: dict[str, float] = {}
        for policy in args.policies:
            r = run(trace, policy)
            walls[policy] = r["wall_s"]
            if args.json:
                print(json.dumps({"policy": policy, **r}))
                continue
            print(
                f"{policy:<10}{int(r['jobs']):>12,}{r['wall_s']:>10.1f}{r['cpu_s']:>9.1f}"
                f"{r['peak_rss'] / 1e6:>15.0f}{r['p95_bsld']:>10.2f}"
            )
        if "easy" in walls and "bursar" in walls and not args.json:
            print(f"bursar / easy: {walls['bursar'] / walls['easy']:.1f}x")


if __name__ == "__main__":
    main()
