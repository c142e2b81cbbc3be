"""Run a worker inside a local-backend lease: ``python -m bursar.providers.local_exec
--run-dir RUN --lease ID -- ARGV...`` (what ``providers.launch.launch_argv`` gives).

It reads the lease's record (``RUN/leases/ID/lease.json``, written by the broker's local
backend), refuses if the lease is no longer placed, registers its pid with the lease, joins
the lease's cgroup when it has one, pins itself to the lease's CPUs, sets
``CUDA_VISIBLE_DEVICES`` (the GPUs' UUIDs; empty for none) and the OpenMP/BLAS thread counts,
marks its environment with the lease (every descendant inherits the marker, which is how the
broker finds the lease's processes at its end), then execs ARGV: the worker keeps this pid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["THREAD_VARS", "lease_env", "main"]

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
EXIT_NO_LEASE = 75  # EX_TEMPFAIL: the lease ended (or never was) before the worker started


def lease_env(allocation: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker of the local lease runs with (on top of its own)."""
    count = allocation.get("cpu_count") or "1"
    env = {v: count for v in THREAD_VARS}
    env["CUDA_VISIBLE_DEVICES"] = allocation.get("gpus", "")
    env["BURSAR_LEASE_ID"] = allocation["lease_id"]
    env["BURSAR_LOCAL_RUN"] = allocation["run_dir"]
    return env


def _cpus(spec: str) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bursar.providers.local_exec")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--lease", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the worker's command line after --")
    lease_dir = Path(args.run_dir) / "leases" / args.lease
    try:
        record = json.loads((lease_dir / "lease.json").read_text())
    except (OSError, ValueError):
        print(f"local_exec: lease {args.lease} is not placed; not starting", file=sys.stderr)
        return EXIT_NO_LEASE
    alloc = record["allocation"]
    pid = os.getpid()
    (lease_dir / "pids").mkdir(parents=True, exist_ok=True)
    # Its start time, so the broker can tell this process from a later one with the same pid.
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    (lease_dir / "pids" / str(pid)).write_text(stat[19])
    if alloc.get("cgroup"):
        # Before exec, so the worker and all it starts are counted against the lease.
        Path(alloc["cgroup"], "cgroup.procs").write_text(str(pid))
    os.sched_setaffinity(0, _cpus(alloc["cpus"]))
    env = dict(os.environ)
    env.update(lease_env(alloc))
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"local_exec: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
