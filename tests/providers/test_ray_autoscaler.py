"""A real Ray cluster scaled by Ray's own autoscaler (v1, and v2 through Ray's
NodeProviderAdapter) through BursarNodeProvider, against a real broker over gRPC: a
task that needs a resource only leased nodes have brings a node up through a lease,
survives the lease's reclaim (Ray retries it on a replacement node) and the cluster
scales back to zero leases when idle.

One Ray cluster per host: these run serially; cleanup is by PID (never `ray stop`)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import ray
import yaml
from client_support import server_thread, until
from ray.core.generated.common_pb2 import NodeDeathInfo
from ray_support import cluster_yaml, ray_config, ray_head

from bursar.providers.client import BrokerClient, LeaseState
from bursar.providers.ray.local_head import marked

pytestmark = pytest.mark.slow


def refusals(state_dir: Path, campaign: str, reason: str) -> int:
    """Refused requests of ``campaign`` with ``reason`` in the broker's journal."""
    db = sqlite3.connect(f"file:{state_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT event, decisions FROM entries").fetchall()
    finally:
        db.close()
    return sum(1 for ev, dec in rows if f'"{campaign}"' in ev and reason in dec)


# One retry: the node of a reclaimed lease is drained in Ray as preempted before it
# stops, so Ray retries what the revocation killed without counting it; the crash of
# the second attempt takes the one retry, and the third attempt succeeds.
@ray.remote(resources={"bursar_node": 1}, num_cpus=1, max_retries=1)
def where(marks: str) -> str:
    """Record the attempt (``N-LEASE``); the first runs until its node is revoked, the
    second crashes its worker."""
    lease = os.environ["BURSAR_LEASE_ID"]
    attempt = len(os.listdir(marks))
    Path(marks, f"{attempt}-{lease}").write_text("")
    if attempt == 0:
        time.sleep(60)
    elif attempt == 1:
        os._exit(1)
    return lease


def attempts(marks: Path) -> list[str]:
    """The lease of each attempt, in order."""
    return [name.split("-", 1)[1] for name in sorted(os.listdir(marks))]


@pytest.mark.parametrize("v2", [False, True], ids=["autoscaler-v1", "autoscaler-v2"])
def test_ray_scales_through_bursar_leases_and_survives_a_reclaim(v2: bool, tmp_path: Path) -> None:
    state = tmp_path / "broker"
    ray_state = tmp_path / "ray-state"
    marks = tmp_path / "marks"
    marks.mkdir()
    with server_thread(state, cfg=ray_config()) as server:
        token = tmp_path / "ray.token"
        token.write_text(server.tokens["ray"])
        cfg = cluster_yaml(
            tmp_path / "cluster.yaml",
            broker=server.address,
            token_file=token,
            state_dir=ray_state,
        )
        with (
            BrokerClient(server.address, server.tokens["ray"]) as leases,
            ray_head(cfg, v2=v2, state_dir=ray_state, log_dir=tmp_path) as head,
        ):
            t0 = time.monotonic()
            phases: dict[str, float] = {}  # seconds since submission (shown with -s)

            def mark(phase: str) -> None:
                phases[phase] = round(time.monotonic() - t0, 1)

            ray.init(address=head.address, log_to_driver=False)
            try:
                ref = where.remote(str(marks))
                # Scale-up: a lease, then the task on that lease's node.
                (first,) = until(lambda: attempts(marks), 60, "the task started on a node")
                mark("task started on a leased node")
                lease = leases.get_lease(first)
                assert lease.state is LeaseState.ACTIVE
                assert dict(lease.size) == {"cpu": 1.0, "mem_gb": 1.0}
                assert lease.labels["engine"] == "ray" and lease.labels["purpose"] == "example"

                # A higher class reclaims the node's core; the node goes with its lease,
                # and until `hi` lets go the pool has no room for a replacement.
                with BrokerClient(server.address, server.tokens["hi"]) as hi:
                    held = hi.acquire({"cpu": 2}, 60, blocking=False)
                    until(lambda: leases.get_lease(first).ended, 10, "the lease revoked")
                    assert leases.get_lease(first).state is LeaseState.REVOKED
                    until(
                        lambda: refusals(state, "ray", "POOL_FULL"),
                        30,
                        "a replacement refused while the pool is full",
                    )
                    mark("revoked, replacement refused")
                    hi.release(held.id)

                # The task is retried on a replacement node, on a new lease; Ray saw the
                # first node's death as a preemption, which took none of its retries.
                second = ray.get(ref, timeout=90)
                mark("done on the replacement")
                assert second != first
                assert attempts(marks) == [first, second, second]
                (dead,) = [n for n in ray.nodes() if not n["Alive"]]
                assert dead["DeathReason"] == NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
                assert f"Bursar lease {first}" in dead["DeathReasonMessage"]

                # Idle: back to zero leases and the head alone.
                until(lambda: leases.list_leases() == [], 60, "zero leases")
                until(lambda: sum(n["Alive"] for n in ray.nodes()) == 1, 30, "the head alone")
                mark("zero leases, head alone")
                print(f"autoscaler {'v2' if v2 else 'v1'}: {phases}")
                ended = [leases.get_lease(i).state for i in (first, second)]
                assert ended == [LeaseState.REVOKED, LeaseState.RELEASED]
            finally:
                ray.shutdown()


def monitor_pid(mark: str) -> int:
    """The head's autoscaler monitor (Ray starts it as .../ray/autoscaler/[v2/]monitor.py)."""
    for proc in marked(mark):
        try:
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if any(Path(a).name == "monitor.py" and "autoscaler" in Path(a).parts for a in argv):
            return proc.pid
    raise AssertionError("no autoscaler monitor among the head's processes")


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_stopping_the_monitor_releases_its_nodes_leases(v2: bool, tmp_path: Path) -> None:
    ray_state = tmp_path / "ray-state"
    with server_thread(tmp_path / "broker", cfg=ray_config()) as server:
        token = tmp_path / "ray.token"
        token.write_text(server.tokens["ray"])
        path = cluster_yaml(
            tmp_path / "cluster.yaml", broker=server.address, token_file=token, state_dir=ray_state
        )
        cfg = yaml.safe_load(path.read_text())
        cfg["available_node_types"]["cpu_worker"]["min_workers"] = 1  # a node without a task
        path.write_text(yaml.safe_dump(cfg))
        with (
            BrokerClient(server.address, server.tokens["ray"]) as leases,
            ray_head(path, v2=v2, state_dir=ray_state, log_dir=tmp_path) as head,
        ):
            (lease,) = until(leases.list_leases, 60, "the min_workers node's lease")
            until(lambda: leases.get_lease(lease.id).state is LeaseState.ACTIVE, 30, "active")
            t0 = time.monotonic()
            os.kill(monitor_pid(head.mark), signal.SIGTERM)  # as `ray stop` does
            until(lambda: leases.get_lease(lease.id).ended, 20, "the lease ended")
            print(f"autoscaler {'v2' if v2 else 'v1'}: released {time.monotonic() - t0:.2f} s")
            assert leases.get_lease(lease.id).state is LeaseState.RELEASED


@ray.remote(resources={"bursar_node": 1}, num_cpus=1)
def held_until(path: str, marks: str) -> str:
    """Hold a leased node until ``path`` exists (marked in ``marks`` by its lease id
    meanwhile); the node's lease id."""
    Path(marks, os.environ["BURSAR_LEASE_ID"]).write_text("")
    while not os.path.exists(path):
        time.sleep(0.1)
    return os.environ["BURSAR_LEASE_ID"]


def journal(state_dir: Path, after: int = 0) -> list[tuple[int, str, str]]:
    """(seq, kind, lease or request id) of the broker's journal entries after ``after``."""
    db = sqlite3.connect(f"file:{state_dir / 'journal.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT seq, event FROM entries WHERE seq > ?", (after,)).fetchall()
    finally:
        db.close()
    out = []
    for seq, raw in rows:
        ev = json.loads(raw)
        out.append((seq, ev["kind"], ev.get("lease_id") or ev.get("request_id") or ""))
    return out


def restart(pid: int) -> subprocess.Popen[bytes]:
    """SIGKILL process ``pid`` (no exit handler runs: nothing is released) and start it
    again with the same command line, environment and directory, as a supervisor would."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    raw = Path(f"/proc/{pid}/environ").read_bytes().rstrip(b"\0").split(b"\0")
    env = dict(e.decode().split("=", 1) for e in raw if b"=" in e)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGKILL)
    until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10, "the monitor gone")
    return subprocess.Popen(
        [a.decode() for a in argv],
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_a_restarted_monitor_adopts_its_running_nodes(v2: bool, tmp_path: Path) -> None:
    state = tmp_path / "broker"
    ray_state = tmp_path / "ray-state"
    release = tmp_path / "release"
    marks = tmp_path / "marks"
    marks.mkdir()
    with server_thread(state, cfg=ray_config()) as server:
        token = tmp_path / "ray.token"
        token.write_text(server.tokens["ray"])
        cfg = cluster_yaml(
            tmp_path / "cluster.yaml", broker=server.address, token_file=token, state_dir=ray_state
        )
        with (
            BrokerClient(server.address, server.tokens["ray"]) as leases,
            ray_head(cfg, v2=v2, state_dir=ray_state, log_dir=tmp_path) as head,
        ):
            ray.init(address=head.address, log_to_driver=False)
            try:
                # Two tasks, each on a node of its own: two leases.
                refs = [held_until.remote(str(release), str(marks)) for _ in range(2)]
                # (A raylet that times out starting on a busy host is replaced: the
                # nodes are those the tasks run on.)
                ids = until(
                    lambda: len(os.listdir(marks)) == 2 and sorted(os.listdir(marks)),
                    120,
                    "both tasks running on leased nodes",
                )
                until(lambda: sorted(lease.id for lease in leases.list_leases()) == ids, 30)
                workers = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
                assert len(workers) == 3  # the head and the two nodes

                # The monitor dies uncleanly and is started again.
                seq = journal(state)[-1][0]
                monitor = restart(monitor_pid(head.mark))
                logs = head.temp_dir / "session_latest" / "logs"
                until(
                    lambda: (
                        sum(
                            f.read_text(errors="replace").count("adopted from a previous provider")
                            for f in logs.glob("monitor*")
                        )
                        >= 2
                    ),
                    60,
                    "the new monitor adopting both nodes",
                )
                assert monitor.poll() is None
                # The same leases, still active, renewed; the same Ray nodes, the tasks
                # still running on them; nothing acquired or released.
                assert sorted(lease.id for lease in leases.list_leases()) == ids
                assert {leases.get_lease(i).state for i in ids} == {LeaseState.ACTIVE}
                time.sleep(3)  # a few autoscaler updates of the new monitor
                assert {n["NodeID"] for n in ray.nodes() if n["Alive"]} == workers
                kinds = [(k, i) for _, k, i in journal(state, seq)]
                assert not [k for k in kinds if k[0] in ("request_lease", "release")], kinds
                assert {i for k, i in kinds if k == "renew"} == set(ids)

                # Idle once the tasks finish: scaled down by the new monitor, released.
                release.write_text("")
                assert sorted(ray.get(refs, timeout=30)) == ids
                until(lambda: leases.list_leases() == [], 60, "zero leases")
                assert {leases.get_lease(i).state for i in ids} == {LeaseState.RELEASED}
                kinds = [(k, i) for _, k, i in journal(state, seq)]
                assert sorted(i for k, i in kinds if k == "release") == ids
                assert not [k for k in kinds if k[0] == "request_lease"], kinds
            finally:
                ray.shutdown()
