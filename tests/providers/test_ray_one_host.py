"""Several Ray nodes on one host, as BursarNodeProvider starts them: four started at once
(as Ray's autoscaler launches them) all come up and each runs a task, and none of their
processes listens on anything but the loopback address; then the shipped example
(``examples/ray-cluster.yaml`` and ``examples/ray_driver.py``) against a default
``bursar serve``, as its header says to run it.

Real parts throughout: a real broker over gRPC, a real Ray head and raylets, Ray's own
autoscaler in the example. One Ray cluster per host: these run serially; cleanup is by
PID (never `ray stop`)."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import psutil
import pytest
import ray
import yaml
from client_support import ServerThread, server_thread, until
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ray_support import EXAMPLE, ray_config, worker_tags
from test_ray_provider import make

from bursar.providers.client import BrokerClient, read_token_file
from bursar.providers.ray.local_head import free_port, local_head, marked
from bursar.providers.ray.raylet import Proc, node_processes, proc_start
from bursar.providers.ray.start import keep_loopback
from bursar.providers.ray.store import all_records

pytestmark = pytest.mark.slow

DRIVER = EXAMPLE.parent / "ray_driver.py"
BURSAR = Path(sys.executable).parent / "bursar"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state", cfg=ray_config()) as s:
        yield s


def _loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    # Ray's servers listen on IPv6 sockets bound to ::ffff:127.0.0.1.
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def bound(pids: Iterable[int]) -> list[tuple[str, str, int]]:
    """The (process name, address, port) of every listening TCP socket and every
    unconnected UDP socket of ``pids``: what they serve on."""
    pids = set(pids)
    out = []
    for c in psutil.net_connections("inet"):
        if c.pid not in pids or not c.laddr:
            continue
        if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr):
            try:
                name = psutil.Process(c.pid).name()
            except psutil.NoSuchProcess:
                continue
            out.append((name, c.laddr.ip, c.laddr.port))
    return sorted(out)


def test_four_nodes_started_at_once_each_run_a_task_and_listen_on_loopback_only(
    server: ServerThread, tmp_path: Path
) -> None:
    def where() -> tuple[str, str]:
        return ray.get_runtime_context().get_node_id(), os.environ["BURSAR_LEASE_ID"]

    keep_loopback()  # this driver, like the example's, joins a head on 127.0.0.1
    ray_state = tmp_path / "ray-state"
    with local_head(state_dir=ray_state, log_path=tmp_path / "ray-head.log") as head:
        p = make(
            server,
            "ray",
            tmp_path,
            head_address=head.address,
            head_ip="127.0.0.1",  # the head, listed as in the monitor
            node_command=None,
            use_node_id_as_ip=True,
            stop_grace_s=1,
            lease_duration_s=120,
            ray_start_args=["--include-log-monitor=false"],
        )
        ray.init(address=head.address, log_to_driver=False)
        try:
            t0 = time.monotonic()
            # One create call for four nodes, as the autoscaler makes it (half a core
            # leased each: four fit the test pool's two).
            created = p.create_node_with_resources_and_labels(
                {"lease_size": {"cpu": 0.5}}, worker_tags(), 4, {"CPU": 1, "bursar_node": 1}, {}
            )
            assert created is not None and len(created) == 4
            nodes = sorted(created)

            def up() -> dict[str, str]:
                """Ray node id -> lease id of the leased nodes alive in Ray."""
                return {
                    n["NodeID"]: n["Labels"]["bursar.io/lease-id"]
                    for n in ray.nodes()
                    if n["Alive"] and "bursar.io/lease-id" in n.get("Labels", {})
                }

            alive = until(lambda: len(up()) == 4 and up(), 90, "four nodes alive in Ray")
            print(f"four nodes alive {time.monotonic() - t0:.1f} s after the create call")
            assert sorted(alive.values()) == nodes
            assert p.ended_nodes() == {}  # none died (before: "bind: Address already in use")

            # A task pinned to each node runs there, on that node's lease.
            f = ray.remote(num_cpus=1)(where)
            pinned = [
                f.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                for n in alive
            ]
            got = ray.get([g.remote() for g in pinned], timeout=120)
            assert got == list(alive.items())
            print(f"a task on each {time.monotonic() - t0:.1f} s after the create call")

            # Ray's v1 monitor keys nodes by Ray node id (use_node_id_as_ip): so does
            # the provider's internal_ip, the head's included.
            assert {p.internal_ip(n) for n in nodes} == set(alive)
            head_id = next(
                n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in alive
            )
            assert p.internal_ip("head") == head_id

            # Each node has a Ray temp dir of its own (its sockets), and listens on the
            # loopback address only: so does the head.
            temp_dirs = {n: p._nodes[n].temp_dir for n in nodes}
            assert len({d for d in temp_dirs.values() if d}) == 4
            node_pids = set()
            for n in nodes:
                pid = p.raylet_pid(n)
                assert pid is not None
                node_pids |= {q.pid for q in node_processes(Proc(pid, proc_start(pid) or 0), n)}
            served = bound(node_pids)
            assert sum(1 for name, _, _ in served if name == "raylet") >= 4, served
            assert [s for s in served if not _loopback(s[1])] == [], served
            head_pids = {q.pid for m in marked(head.mark) for q in node_processes(m)} - node_pids
            head_served = bound(head_pids)
            assert any(name == "gcs_server" for name, _, _ in head_served), head_served
            assert [s for s in head_served if not _loopback(s[1])] == [], head_served
        finally:
            ray.shutdown()
            p.close()
        assert not any(Path(d).exists() for d in temp_dirs.values() if d)
    with BrokerClient(server.address, server.tokens["ray"]) as c:
        assert c.list_leases() == []


def _bursar_serve(cwd: Path, port: int) -> subprocess.Popen[bytes]:
    """Plain ``bursar serve`` in ``cwd`` (the packaged demo pool, state in ./state), on
    ``port`` (the test's: free), once it listens."""
    log = cwd / "serve.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BURSAR), "serve", "--port", str(port), "--metrics-port", "0",
             "--dashboard-port", "0"],
            cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while "listening on" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"bursar serve did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def test_the_example_cluster_runs_its_driver_against_a_default_bursar_serve(
    tmp_path: Path,
) -> None:
    # The user's directory: `bursar serve` writes state/tokens.json here, and the head
    # (its monitor, which reads the YAML's token_file) and the driver run here too.
    cwd = tmp_path / "run"
    (cwd / "examples").mkdir(parents=True)
    port = free_port()
    serve = _bursar_serve(cwd, port)
    try:
        # The example as shipped; the test's only changes: the broker's free port, and
        # where the provider records its nodes (for the cleanup by PID).
        cfg = yaml.safe_load(EXAMPLE.read_text())
        assert cfg["provider"]["token_file"] == "state/tokens.json"
        cfg["provider"]["broker"] = f"127.0.0.1:{port}"
        cfg["provider"]["state_dir"] = str(tmp_path / "ray-state")
        cluster = cwd / "examples" / "ray-cluster.yaml"
        cluster.write_text(yaml.safe_dump(cfg))
        check = subprocess.run(
            [sys.executable, "-m", "bursar.providers.ray", "check", "examples/ray-cluster.yaml"],
            cwd=cwd, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        assert "you are campaign:adaptive-sci" in check.stdout

        token = read_token_file(cwd / "state" / "tokens.json", "adaptive-sci")
        with (
            local_head(
                Path("examples/ray-cluster.yaml"),
                state_dir=tmp_path / "ray-state",
                log_path=tmp_path / "ray-head.log",
                keep_logs=tmp_path / "logs",
                cwd=cwd,
            ) as head,
            BrokerClient(f"127.0.0.1:{port}", token) as leases,
        ):
            t0 = time.monotonic()
            run = subprocess.run(
                [sys.executable, str(DRIVER), "--address", head.address],
                cwd=cwd, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            print(run.stdout, f"driver: {time.monotonic() - t0:.1f} s")
            assert run.returncode == 0, run.stdout + run.stderr[-3000:]
            lines = run.stdout.splitlines()
            assert [ln.split(" on lease")[0] for ln in lines[:8]] == [
                f"{i}^2 = {i * i}" for i in range(8)
            ]
            ran_on = {ln.split(" on lease ")[1].split()[0] for ln in lines[:8]}
            assert lines[8].startswith(f"8 tasks on {len(ran_on)} leased nodes: ")
            assert len(ran_on) >= 2  # nodes started together (four, when it was written)
            # The nodes were the campaign's leases, sized from the node type.
            held = {lease.id: lease for lease in leases.list_leases()}
            assert ran_on <= set(held), (ran_on, held)
            for lease_id in ran_on:
                assert held[lease_id].campaign == "adaptive-sci"
                assert dict(held[lease_id].size) == {"cpu": 1.0, "mem_gb": 1.0}
            records = all_records(tmp_path / "ray-state")
            assert {r.node_id for r in records if r.temp_dir} >= ran_on
        # Stopped with the head: no node's Ray temp dir is left behind.
        assert not any(Path(r.temp_dir).exists() for r in records if r.temp_dir)
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
