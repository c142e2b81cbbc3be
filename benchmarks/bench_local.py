"""CPU co-run on one shared machine, without and with the local backend's enforcement.

    .venv/bin/python benchmarks/bench_local.py [--repeat 3] [--seconds 2.5]

Two campaigns share this machine's CPUs. The measured campaign runs one CPU-bound worker
that executes fixed-size tasks back to back (each a pure-Python loop of ``--work``
iterations, some tens of ms) and records each task's latency; the interfering campaign runs
``--hogs`` busy workers (as many as there are CPUs by default, so it would take the whole
machine). Each repeat has four phases of ``--seconds``:

* unenforced: the workers are plain processes (the OS spreads them over every CPU): the
  measured worker alone, then alongside the hogs;
* enforced: each campaign holds a lease of half the machine's CPUs from the local backend
  (``LocalPool``, plan mode for cgroups: affinity only), and every worker starts through
  ``providers.launch.launch_argv``: the measured worker alone on its lease, then alongside
  the hogs pinned to theirs.

The figure is the interference ratio: the measured worker's p95 task latency alongside the
hogs over its p95 alone, per mode, in one run; the repeats give its range. 1.0 is no
effect. Needs at least 2 CPUs. The machine's other load is not controlled: the ranges show it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bursar.broker.backends.local import LocalPool, LocalSettings
from bursar.broker.backends.local_discovery import CgroupProbe, layout_nodes, read_machine
from bursar.providers.launch import launch_argv

TASKS = """
import json, sys, time
work, seconds = int(sys.argv[1]), float(sys.argv[2])
out, end = [], time.perf_counter() + seconds
while time.perf_counter() < end:
    t = time.perf_counter()
    x = 0
    for i in range(work):
        x += i * i
    out.append(time.perf_counter() - t)
print(json.dumps(out))
"""
HOG = [sys.executable, "-c", "while True: pass"]


def p95(xs: Sequence[float]) -> float:
    return statistics.quantiles(xs, n=20)[-1] if len(xs) >= 2 else xs[0]


def measure(argv: Sequence[str], hogs: Sequence[Sequence[str]]) -> float:
    """The measured worker's p95 task latency (s) while ``hogs`` run."""
    running = [subprocess.Popen(list(h), stdin=subprocess.DEVNULL) for h in hogs]
    try:
        time.sleep(0.2 if running else 0.0)  # the hogs are on their CPUs first
        out = subprocess.run(list(argv), capture_output=True, text=True, check=True)
    finally:
        for p in running:
            p.kill()
            p.wait()
    lat = json.loads(out.stdout)
    return p95(lat[1:] or lat)  # the first task pays for the interpreter's warm-up


def lease(pool: LocalPool, lid: str, cpus: int) -> Mapping[str, str]:
    pool.place(lid, ["local000"], time.time(), {"local000": {"cpu": cpus}})
    return pool.allocation(lid)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.5)
    ap.add_argument("--work", type=int, default=300_000)
    ap.add_argument("--hogs", type=int, default=0, help="interfering workers (0: one per CPU)")
    args = ap.parse_args(argv)
    nodes = layout_nodes(read_machine(gpus=False), split_numa=False)
    ncpu = len(nodes[0].cpus)
    if ncpu < 2:
        print("bench_local: needs at least 2 CPUs", file=sys.stderr)
        return 2
    hogs = args.hogs or ncpu
    task = [sys.executable, "-c", TASKS, str(args.work), str(args.seconds)]
    half = ncpu // 2
    print(
        f"machine: {ncpu} CPUs; measured campaign: 1 worker; interfering campaign: {hogs} "
        f"busy workers; enforced leases: {half} CPU(s) each; {args.seconds}s per phase"
    )
    rows: list[tuple[float, float, float, float]] = []
    for r in range(args.repeat):
        free_alone = measure(task, [])
        free_with = measure(task, [HOG] * hogs)
        with tempfile.TemporaryDirectory() as run:
            pool = LocalPool(
                nodes,
                LocalSettings(run_dir=Path(run), kill_grace_s=1.0),
                cgroup=CgroupProbe(None, "plan"),
            )
            mine, theirs = lease(pool, "M", half), lease(pool, "H", ncpu - half)
            pinned = launch_argv(mine, task)
            pinned_hogs = [launch_argv(theirs, HOG)] * hogs
            held_alone = measure(pinned, [])
            held_with = measure(pinned, pinned_hogs)
            pool.unplace("M", time.time())
            pool.unplace("H", time.time())
            pool.wait_reaped(5)
        rows.append((free_alone, free_with, held_alone, held_with))
        print(
            f"repeat {r + 1}: p95 ms alone/with hogs: unenforced {free_alone * 1e3:.1f}/"
            f"{free_with * 1e3:.1f} (ratio {free_with / free_alone:.2f}), enforced "
            f"{held_alone * 1e3:.1f}/{held_with * 1e3:.1f} (ratio {held_with / held_alone:.2f})"
        )
    free = [b / a for a, b, _, _ in rows]
    held = [d / c for _, _, c, d in rows]
    print(
        f"interference ratio (p95 with / p95 alone) over {args.repeat} repeats: "
        f"unenforced median {statistics.median(free):.2f} [{min(free):.2f}-{max(free):.2f}], "
        f"enforced median {statistics.median(held):.2f} [{min(held):.2f}-{max(held):.2f}]"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
