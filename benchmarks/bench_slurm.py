"""Bursar in front of Slurm against plain Slurm, side by side in one run.

    .venv/bin/python benchmarks/bench_slurm.py [--repeat 20] [--leases 50] [--only slow]

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
* Warm Acquire latency while another lease's allocation is slow: rounds of ``--slow-acquires``
  warm Acquires (1 GPU + 1 CPU, each released after) with nothing slow, then as many while
  one other lease's salloc takes ``--slow-delay`` seconds (its salloc is started that late:
  Slurm itself sees nothing unusual), p50/p99 and their ratio, ``--slow-rounds`` times. The
  same through a broker that drives Slurm inline on its event loop (as before allocations
  moved to the actuator's threads), for contrast.
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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.progress import Progress

from bursar.broker.backends.slurm import SlurmCli, SlurmPool, discover_pool
from bursar.broker.config import parse_config
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.local import local_broker
from bursar.broker.service.server import Settings
from bursar.providers.client import BrokerClient
from bursar.providers.launch import launch_argv

REPO = Path(__file__).resolve().parents[1]
PREFIX = f"bench{os.getpid()}"
CONFIG = """
[slurm]
partition = "debug"
job_prefix = "{prefix}"
poll_interval_s = 2
[policy]
max_lease_s = 3600
[campaigns.bench]
class = "batch"
gpu = {{ sustained = 32, burst = 32, bucket = "unlimited" }}
cpu = {{ sustained = 128, burst = 128, bucket = "unlimited" }}
"""
SLOW_SIZE = {"gpu": 8.0, "cpu": 32.0}
"""The slow lease's size: one node whole (the test cluster's 8 GPUs and 32 CPUs), so that its
salloc is the one ``DelayedCli`` starts late (no warm lease asks for 8 GPUs), and each warm
lease goes whole on another node: sharing one, Slurm's own scheduling would couple them (a
job submitted while another there is still completing waits for a backfill pass, and so
does every job submitted after it; a lease split over two nodes is a heterogeneous job,
which Slurm starts from backfill only)."""
WARM_SIZE = {"gpu": 1.0, "cpu": 1.0}
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


class DelayedCli(SlurmCli):
    """Slurm's commands, with the salloc of a ``SLOW_SIZE`` lease started ``delay_s`` late;
    ``started`` is set when that salloc begins its wait."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(runner=self._run)
        self.delay_s = delay_s
        self.started = threading.Event()

    def _run(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        if argv[0] == "salloc" and f"--gres=gpu:{int(SLOW_SIZE['gpu'])}" in argv:
            self.started.set()
            time.sleep(self.delay_s)
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )


class InlineSlurmPool(SlurmPool):
    """The Slurm pool declared not slow: the service then makes its allocations inline, on
    its event loop, inside the Acquire (how every allocation was made before the actuator)."""

    slow = False


@contextmanager
def broker(
    state_dir: Path,
    prefix: str = PREFIX,
    pool: type[SlurmPool] = SlurmPool,
    cli: SlurmCli | None = None,
) -> Iterator[tuple[str, str]]:
    """``bursar serve --backend slurm`` on a thread of this process: (address, token)."""
    text = CONFIG.format(prefix=prefix)
    cfg = parse_config(text, "toml", source="<bench>", discover=discover_pool)
    assert cfg.slurm is not None
    with local_broker(
        state_dir=state_dir,
        config=cfg,
        limits=LimitSettings(rate=1e6, burst=1e6, max_streams=64),
        grace_s=Settings.grace_s,
        backend=pool(cfg.slurm, cli=cli),
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


def warm_acquires(c: BrokerClient, n: int) -> list[float]:
    """Seconds each of ``n`` warm Acquires took to answer (each released after)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        lease = c.acquire(WARM_SIZE, 600, blocking=False)
        out.append(time.perf_counter() - t0)
        c.release(lease.id)
    return out


def with_slow(c: BrokerClient, cli: DelayedCli, n: int) -> list[float]:
    """``warm_acquires`` while another client's Acquire waits for its slow allocation."""
    box: dict[str, object] = {}
    cli.started.clear()
    slow = threading.Thread(
        target=lambda: box.setdefault("lease", c.acquire(SLOW_SIZE, 600, blocking=False))
    )
    slow.start()
    if not cli.started.wait(30):
        raise SystemExit("the slow salloc never started")
    took = warm_acquires(c, n)
    slow.join()
    lease = box["lease"]
    c.release(lease.id)  # type: ignore[attr-defined]
    return took


def slow_rounds(
    address: str, token: str, cli: DelayedCli, rounds: int, n: int, progress: Progress, what: str
) -> tuple[list[float], list[float], list[float]]:
    """(latencies with none slow, latencies with one slow, per-round p50 ratios)."""
    none: list[float] = []
    one: list[float] = []
    ratios: list[float] = []
    task = progress.add_task(what, total=rounds)
    with BrokerClient(address, token) as c:
        warm_acquires(c, 3)  # the first calls open the channel
        for _ in range(rounds):
            a = warm_acquires(c, n)
            b = with_slow(c, cli, n)
            none += a
            one += b
            ratios.append(statistics.median(b) / statistics.median(a))
            progress.advance(task)
    return none, one, ratios


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def slow_report(label: str, none: list[float], one: list[float], ratios: list[float]) -> None:
    p50 = (pct(none, 0.5), pct(one, 0.5))
    p99 = (pct(none, 0.99), pct(one, 0.99))
    print(f"  {label}")
    print(f"    none slow   p50 {p50[0] * 1e3:8.1f} ms  p99 {p99[0] * 1e3:8.1f} ms")
    print(f"    one slow    p50 {p50[1] * 1e3:8.1f} ms  p99 {p99[1] * 1e3:8.1f} ms")
    print(
        f"    ratio one slow / none: p50 {p50[1] / p50[0]:.2f}x  p99 {p99[1] / p99[0]:.2f}x; "
        f"per-round p50 ratio median {statistics.median(ratios):.2f}x "
        f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x, {len(ratios)} rounds)"
    )


def ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1e3:7.1f} ms  p90 {_p90(xs) * 1e3:7.1f} ms"


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="trials per size and path")
    ap.add_argument("--leases", type=int, default=50, help="cycles for the rate")
    ap.add_argument("--slow-delay", type=float, default=2.0, help="seconds the slow salloc takes")
    ap.add_argument("--slow-rounds", type=int, default=5, help="rounds with and without")
    ap.add_argument("--slow-acquires", type=int, default=20, help="warm Acquires per round")
    ap.add_argument("--only", choices=["all", "slow"], default="all", help="sections to run")
    args = ap.parse_args()
    with cluster() as conf, tempfile.TemporaryDirectory() as tmp:
        print(f"Slurm: SLURM_CONF={conf}; {args.repeat} trials per size, {args.leases} cycles")
        slow: dict[str, tuple[list[float], list[float], list[float]]] = {}
        with Progress(transient=True) as progress:
            for label, pool in (
                ("actuator threads (bursar serve)", SlurmPool),
                ("inline on the event loop (before)", InlineSlurmPool),
            ):
                cli = DelayedCli(args.slow_delay)
                state = Path(tmp) / f"slow-{pool.__name__}"
                prefix = f"{PREFIX}{pool.__name__[:6].lower()}"
                with broker(state, prefix, pool, cli) as (address, token):
                    slow[label] = slow_rounds(
                        address, token, cli, args.slow_rounds, args.slow_acquires, progress, label
                    )
        print(
            f"\nwarm Acquire latency while another lease's salloc takes {args.slow_delay:g} s "
            f"({args.slow_acquires} Acquires per round and case)"
        )
        for label, (none, one, ratios) in slow.items():
            slow_report(label, none, one, ratios)
        if args.only == "slow":
            return
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
