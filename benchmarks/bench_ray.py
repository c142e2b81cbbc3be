"""Ray worker-node start through Bursar against a plain local raylet, in the same run.

    .venv/bin/python benchmarks/bench_ray.py [--trials 3]

One Ray head (no autoscaler) runs for the whole run, with a broker served in-process
over gRPC on loopback. Node start is the time from the call that asks for a node until
the node is alive in the head's GCS, and then until a task that needs the node's custom
resource has returned from it. Trials alternate:

* plain: ``ray start --address=HEAD --block`` started directly (the same command line,
  resources and labels the provider uses);
* Bursar: ``BursarNodeProvider.create_node_with_resources_and_labels`` (a non-blocking
  Acquire of a {cpu: 1} lease, then that raylet on the active lease), as Ray's
  autoscaler calls it.

Also printed: the time inside the create call (the Acquire), the time to terminate the
node (raylet stopped, lease released) and the resident memory of one node's processes.
Every process is stopped by PID at the end, never with ``ray stop``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import ray
from rich.progress import Progress

from bursar.broker.service.local import local_broker
from bursar.providers.ray import BursarNodeProvider
from bursar.providers.ray.local_head import local_head
from bursar.providers.ray.raylet import Proc, node_processes, proc_start, start_node, stop_processes

POOL = """
[pool]
boot_latency_s = 1
[pool.groups.node]
count = 1
warm = 1
gpu = 0
cpu = 4
mem_gb = 16
[policy]
grace_s = 2
[policy.warm_headroom]
cpu = 0

[campaigns.ray]
class = "batch"
[campaigns.ray.cpu]
sustained = 4
burst = 4
"""

RESOURCES = {"CPU": 1.0, "GPU": 0.0, "bench_node": 1.0}


@ray.remote(resources={"bench_node": 1}, num_cpus=1)
def ping() -> int:
    return 1


def alive_at(ip: str) -> bool:
    return any(n["Alive"] and n["NodeManagerAddress"] == ip for n in ray.nodes())


def wait_for(check: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the node did not come up")
        time.sleep(0.02)


def rss_mb(procs: set[Proc]) -> float:
    total = 0
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/statm") as f:
                total += int(f.read().split()[1]) * 4096
        except OSError:
            pass
    return total / 2**20


def plain_node(head: str, ip: str, logs: Path) -> dict[str, float]:
    node_id = f"plain-{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    popen = start_node(
        node_id=node_id,
        node_type="bench",
        head_address=head,
        ip=ip,
        resources=RESOURCES,
        labels={},
        env={},
        object_store_memory=100_000_000,
        extra_args=[],
        log_path=logs / "plain.log",
    )
    t_call = time.perf_counter() - t0
    wait_for(lambda: alive_at(ip))
    t_alive = time.perf_counter() - t0
    ray.get(ping.remote(), timeout=120)
    t_task = time.perf_counter() - t0
    root = Proc(popen.pid, proc_start(popen.pid) or 0)
    procs = node_processes(root, node_id)
    mem = rss_mb(procs)
    t1 = time.perf_counter()
    stop_processes(procs, 2.0, rescan=root, node_id=node_id)
    popen.wait(5)
    wait_for(lambda: not alive_at(ip))
    return {
        "call": t_call,
        "alive": t_alive,
        "task": t_task,
        "stop": time.perf_counter() - t1,
        "rss": mem,
    }


def bursar_node(p: BursarNodeProvider) -> dict[str, float]:
    t0 = time.perf_counter()
    created = p.create_node_with_resources_and_labels(
        {}, {"ray-user-node-type": "bench"}, 1, dict(RESOURCES), {}
    )
    t_call = time.perf_counter() - t0
    assert created
    (node_id,) = created
    ip = p.internal_ip(node_id)
    wait_for(lambda: alive_at(ip))
    t_alive = time.perf_counter() - t0
    ray.get(ping.remote(), timeout=120)
    t_task = time.perf_counter() - t0
    pid = p.raylet_pid(node_id)
    mem = rss_mb(node_processes(Proc(pid, proc_start(pid) or 0), node_id)) if pid else 0.0
    t1 = time.perf_counter()
    p.terminate_node(node_id)
    t_stop = time.perf_counter() - t1
    wait_for(lambda: not alive_at(ip))
    return {"call": t_call, "alive": t_alive, "task": t_task, "stop": t_stop, "rss": mem}


def summary(name: str, runs: list[dict[str, float]]) -> dict[str, float]:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(
        f"{name:<8} create call {med['call'] * 1000:7.1f} ms   node alive {med['alive']:5.2f} s"
        f"   first task {med['task']:5.2f} s   stop {med['stop']:4.2f} s"
        f"   node RSS {med['rss']:5.0f} MB   (median of {len(runs)})"
    )
    return med


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trials", type=int, default=3, help="nodes started per kind (default 3)")
    args = ap.parse_args(argv)
    plain: list[dict[str, float]] = []
    leased: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp,
        local_broker(POOL) as broker,
        local_head(state_dir=Path(tmp) / "state") as head,
    ):
        p = BursarNodeProvider(
            {
                "type": "external",
                "broker": broker.address,
                "campaign": "ray",
                "token": broker.tokens["ray"],
                "head_address": head.address,
                "state_dir": str(Path(tmp) / "state"),
                "node_ip_range": "127.0.0.2-127.0.0.100",
                "stop_grace_s": 2,
            },
            "bench",
        )
        ray.init(address=head.address, log_to_driver=False)
        try:
            with Progress(transient=True) as progress:
                task = progress.add_task("starting nodes", total=2 * args.trials)
                for i in range(args.trials):
                    plain.append(plain_node(head.address, f"127.0.0.{200 + i}", Path(tmp)))
                    progress.advance(task)
                    leased.append(bursar_node(p))
                    progress.advance(task)
        finally:
            ray.shutdown()
            p.close()
    print(f"Ray {ray.__version__}, Python {sys.version.split()[0]}; one worker node at a time")
    a = summary("plain", plain)
    b = summary("Bursar", leased)
    print(
        f"Bursar/plain: node alive x{b['alive'] / a['alive']:.2f}, first task "
        f"x{b['task'] / a['task']:.2f} ({(b['task'] - a['task']) * 1000:+.0f} ms)"
    )


if __name__ == "__main__":
    main()
