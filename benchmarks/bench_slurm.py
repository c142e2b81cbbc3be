"""Bursar in front of Slurm against plain Slurm, side by side in one run.

    .venv/bin/python benchmarks/bench_slurm.py [--repeat 20] [--leases 50]

Uses the cluster ``SLURM_CONF`` names, or starts the project's test cluster
(scripts/slurm-cluster.sh: 4 nodes x 8 fake GPUs on this host) and stops it afterwards.

* Request -> resources usable: from asking until a job step has run inside the resources.
  Through Bursar: a gRPC Acquire to ``bursar serve --backend slurm`` (served in this
  process, loopback) that returns the lease with its allocation, then
  ``srun --jobid=N --overlap true`` (providers/launch.py). Plain Slurm: ``salloc --no-shell``
  of the same size, then the same ``srun``; and ``sbatch`` of the same size until the job is
  RUNNING (its batch script has started). Two sizes: one node (2 GPUs, 4 CPUs) and two
  whole nodes (16 GPUs, a heterogeneous job through Bursar).
* Leases per second: acquire + release cycles through Bursar (each an salloc and an
  scancel underneath) against salloc + scancel cycles straight on Slurm, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.progress import Progress

from bursar.broker.backends.slurm import SlurmPool, discover_pool
from bursar.broker.config import parse_config
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.local import local_broker
from bursar.broker.service.server import Settings
from bursar.providers.client import BrokerClient
from bursar.providers.launch import launch_argv

REPO = Path(__file__).resolve().parents[1]
PREFIX = f"bench{os.getpid()}"
CONFIG = f"""
[slurm]
partition = "debug"
job_prefix = "{PREFIX}"
poll_interval_s = 2
[policy]
max_lease_s = 3600
[campaigns.bench]
class = "batch"
gpu = {{ sustained = 32, burst = 32, bucket = "unlimited" }}
cpu = {{ sustained = 128, burst = 128, bucket = "unlimited" }}
"""
SIZES = {
    "1 node, 2 GPUs + 4 CPUs": ({"gpu": 2, "cpu": 4}, ["-N1", "-n1", "-c4", "--gres=gpu:2"]),
    "2 nodes, 16 GPUs": ({"gpu": 16}, ["-N2", "--ntasks-per-node=1", "--gres=gpu:8"]),
}


def free_ports(n: int) -> int:
    """A port P with P..P+n-1 free on 127.0.0.1 (slurmctld, then one slurmd per node)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        try:
            for q in range(p, p + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        return p
    raise SystemExit("no block of free ports for the Slurm daemons")


@contextmanager
def cluster() -> Iterator[str]:
    if os.environ.get("SLURM_CONF"):
        yield os.environ["SLURM_CONF"]
        return
    base = tempfile.mkdtemp(prefix="bursar-bench-slurm-")
    script = str(REPO / "scripts" / "slurm-cluster.sh")
    os.environ["SLURM_CLUSTER_PORT"] = str(free_ports(5))
    out = subprocess.run([script, "start", base], capture_output=True, text=True)
    if out.returncode != 0:
        subprocess.run([script, "stop", base], capture_output=True)
        raise SystemExit(f"scripts/slurm-cluster.sh start failed:\n{out.stderr}")
    os.environ["SLURM_CONF"] = out.stdout.strip().splitlines()[-1]
    try:
        yield os.environ["SLURM_CONF"]
    finally:
        subprocess.run([script, "stop", base], capture_output=True)


@contextmanager
def broker(state_dir: Path) -> Iterator[tuple[str, str]]:
    """``bursar serve --backend slurm`` on a thread of this process: (address, token)."""
    cfg = parse_config(CONFIG, "toml", source="<bench>", discover=discover_pool)
    assert cfg.slurm is not None
    with local_broker(
        state_dir=state_dir,
        config=cfg,
        limits=LimitSettings(rate=1e6, burst=1e6, max_streams=64),
        grace_s=Settings.grace_s,
        backend=SlurmPool(cfg.slurm),
    ) as b:
        yield b.address, b.tokens["bench"]


def run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def job_id(name: str) -> int:
    jobs = json.loads(run(["squeue", "--json"]))["jobs"]
    return max(int(j["job_id"]) for j in jobs if j["name"] == name and j["job_state"] == "RUNNING")


def wait_gone(job: int) -> None:
    # Plain and Bursar runs alike wait for the last allocation to leave, so that neither
    # measures the other's clean-up.
    for _ in range(200):
        jobs = json.loads(run(["squeue", "--json"]))["jobs"]
        if not [j for j in jobs if j["job_id"] == job and j["job_state"] != "CANCELLED"]:
            return
        time.sleep(0.05)


def bursar_usable(client: BrokerClient, size: dict[str, float]) -> float:
    t0 = time.perf_counter()
    lease = client.acquire(size, 600, blocking=False)
    run(launch_argv(lease, ["true"]))
    dt = time.perf_counter() - t0
    client.release(lease.id)
    wait_gone(int(lease.allocation["job_id"]))
    return dt


def salloc_usable(args: list[str], n: int) -> float:
    name = f"{PREFIX}plain{n}"
    t0 = time.perf_counter()
    run(["salloc", "--no-shell", "--quiet", "--immediate=30", f"--job-name={name}", *args])
    job = job_id(name)
    run(["srun", f"--jobid={job}", "--overlap", "--quiet", "true"])
    dt = time.perf_counter() - t0
    run(["scancel", str(job)])
    wait_gone(job)
    return dt


def sbatch_running(args: list[str]) -> float:
    t0 = time.perf_counter()
    job = int(run(["sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", "sleep 60"]))
    while True:
        jobs = json.loads(run(["squeue", "--json"]))["jobs"]
        if any(j["job_id"] == job and j["job_state"] == "RUNNING" for j in jobs):
            break
        time.sleep(0.02)
    dt = time.perf_counter() - t0
    run(["scancel", str(job)])
    wait_gone(job)
    return dt


def rate(progress: Progress, what: str, n: int, cycle: Callable[[int], None]) -> float:
    task = progress.add_task(what, total=n)
    t0 = time.perf_counter()
    for i in range(n):
        cycle(i)
        progress.advance(task)
    return n / (time.perf_counter() - t0)


def ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1e3:7.1f} ms  p90 {_p90(xs) * 1e3:7.1f} ms"


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="trials per size and path")
    ap.add_argument("--leases", type=int, default=50, help="cycles for the rate")
    args = ap.parse_args()
    with cluster() as conf, tempfile.TemporaryDirectory() as tmp:
        print(f"Slurm: SLURM_CONF={conf}; {args.repeat} trials per size, {args.leases} cycles")
        with broker(Path(tmp) / "state") as (address, token), BrokerClient(address, token) as c:
            results: dict[str, dict[str, list[float]]] = {}
            with Progress(transient=True) as progress:
                for label, (size, sargs) in SIZES.items():
                    r: dict[str, list[float]] = {"bursar": [], "salloc": [], "sbatch": []}
                    task = progress.add_task(label, total=args.repeat)
                    for i in range(args.repeat):
                        # Interleaved, so that drift on a shared machine hits all alike.
                        r["bursar"].append(bursar_usable(c, size))
                        r["salloc"].append(salloc_usable(sargs, i))
                        if i < max(3, args.repeat // 4):  # ~1 s each: a few suffice
                            r["sbatch"].append(sbatch_running(sargs))
                        progress.advance(task)
                    results[label] = r

                def bursar_cycle(_i: int) -> None:
                    lease = c.acquire({"gpu": 1, "cpu": 1}, 600, blocking=False)
                    c.release(lease.id)

                def plain_cycle(i: int) -> None:
                    name = f"{PREFIX}rate{i}"
                    run(["salloc", "--no-shell", "--quiet", "--immediate=30",
                         f"--job-name={name}", "-n1", "-c1", "--gres=gpu:1"])  # fmt: skip
                    run(["scancel", str(job_id(name))])

                b_rate = rate(progress, "leases through Bursar", args.leases, bursar_cycle)
                p_rate = rate(progress, "salloc + scancel", args.leases, plain_cycle)
    print("\nrequest -> resources usable (a job step has run inside them)")
    for label, r in results.items():
        ratio = statistics.median(r["bursar"]) / statistics.median(r["salloc"])
        print(f"  {label}")
        print(f"    Bursar-on-Slurm (Acquire + srun)   {ms(r['bursar'])}")
        print(f"    plain salloc (+ srun)             {ms(r['salloc'])}")
        print(f"    plain sbatch (until RUNNING)      {ms(r['sbatch'])}")
        print(f"    ratio Bursar / salloc: {ratio:.2f}x")
    print("\nleases per second (acquire + release, one at a time)")
    print(f"  Bursar-on-Slurm   {b_rate:6.1f} /s")
    print(f"  salloc + scancel  {p_rate:6.1f} /s")
    print(f"  ratio Bursar / plain: {b_rate / p_rate:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
