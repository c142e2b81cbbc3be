"""Slurm faults under `bursar serve --backend slurm`, on the same throw-away single-host
cluster the tests use (scripts/slurm-cluster.sh: 4 nodes x 8 fake GPUs).

* **node down mid-lease**: a lease holds an allocation; its node is set DOWN with
  ``scontrol update``. The broker must end the lease (REVOKED, with the node's loss as the
  cause) within a few polls, its Slurm job must end, and once the node is resumed the
  broker must offer its capacity again.
* **slurmctld restarted mid-allocation**: a blocking Acquire is sent while slurmctld is
  down (stopped just before, started again a moment later), and once more with slurmctld
  killed (SIGKILL) while the Acquire's salloc runs. The Acquire must either complete with
  an allocation or fail cleanly (a documented code, no UNKNOWN/INTERNAL), leaving no lease
  that believes it holds nothing, or a job that no lease holds.

Afterwards: every lease released, no Slurm job with the broker's prefix left, and the
journal audit (``bursar journal audit``) clean. Without Slurm's packages or root the
section is skipped, as the tests skip; with ``BURSAR_REQUIRE_SYSTEM_TESTS=1`` it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from common import Mode, Result, free_port_block
from fuzz import DrainedServer
from server import md

from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
NODES, GPUS, CPUS = 4, 8, 32
BINARIES = ("slurmctld", "slurmd", "salloc", "srun", "squeue", "sinfo", "scancel", "munged")
LIVE_JOB = {"RUNNING", "CONFIGURING", "PENDING", "COMPLETING"}

CAMPAIGNS = """
[campaigns.sci]
class = "batch"
gpu = { guarantee = 0, sustained = 32, burst = 32, bucket = "unlimited" }
cpu = { guarantee = 0, sustained = 128, burst = 128, bucket = "unlimited" }
"""


def missing() -> str | None:
    """Why the Slurm cluster cannot run here, or None (the same rule as the tests)."""
    gone = [b for b in BINARIES if shutil.which(b) is None]
    if gone:
        return f"Slurm packages missing ({', '.join(gone)}): run scripts/system-deps.sh"
    if os.geteuid() != 0:
        return "the test Slurm cluster needs root (slurmd runs job steps as any user)"
    return None


class Cluster:
    """The script's cluster in ``base``; slurmctld stopped and started by its recorded PID."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.env = {
            **os.environ,
            "SLURM_CLUSTER_NODES": str(NODES),
            "SLURM_CLUSTER_GPUS": str(GPUS),
            "SLURM_CLUSTER_CPUS": str(CPUS),
            "SLURM_CLUSTER_PORT": str(free_port_block(NODES + 1)),
        }
        out = subprocess.run(
            [str(SCRIPT), "start", str(base)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if out.returncode != 0:
            self.stop()
            raise RuntimeError(f"slurm-cluster.sh start failed: {out.stderr[-2000:]}")
        self.conf = out.stdout.strip().splitlines()[-1]
        self.env["SLURM_CONF"] = self.conf
        self.pidfile = base / "run" / "ours" / "slurmctld.pid"

    def stop(self) -> None:
        subprocess.run(
            [str(SCRIPT), "stop", str(self.base)], env=self.env, capture_output=True, timeout=90
        )

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def jobs(self) -> list[dict[str, Any]]:
        out = self.run("squeue", "--json")
        if out.returncode != 0:
            return []
        return list(json.loads(out.stdout)["jobs"])

    def job_states(self, prefix: str) -> dict[int, str]:
        """Live jobs whose name starts with ``prefix``: id -> state."""
        out = {}
        for j in self.jobs():
            state = j["job_state"]
            state = state[0] if isinstance(state, list) else state
            if str(j["name"]).startswith(prefix) and state in LIVE_JOB:
                out[int(j["job_id"])] = str(state)
        return out

    def node_state(self, node: str) -> str:
        out = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T")
        return out.stdout.strip()

    def ctld_pid(self) -> int:
        return int(self.pidfile.read_text().strip())

    def kill_ctld(self, sig: int) -> None:
        pid = self.ctld_pid()
        os.kill(pid, sig)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            if _zombie(pid):
                break
            time.sleep(0.05)

    def start_ctld(self) -> float:
        """Start slurmctld again on its saved state (no -c: jobs survive); seconds until
        it answers ``scontrol ping``. Its PID goes where the script's stop finds it."""
        t0 = time.monotonic()
        log = open(self.base / "log" / "slurmctld.stdout", "a")  # noqa: SIM115 (the daemon keeps it)
        proc = subprocess.Popen(
            ["slurmctld", "-D", "-f", self.conf],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.pidfile.write_text(f"{proc.pid}\n")
        while time.monotonic() - t0 < 60:
            if self.run("scontrol", "ping").returncode == 0:
                return time.monotonic() - t0
            time.sleep(0.1)
        raise RuntimeError("slurmctld did not come back within 60 s")


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def config_text(job_prefix: str) -> str:
    return f"""
[slurm]
partition = "debug"
job_prefix = "{job_prefix}"
poll_interval_s = 0.3
allocate_timeout_s = 20
[policy]
grace_s = 1.0
min_retry_s = 0.3
max_lease_s = 3600
{CAMPAIGNS}
"""


def until(check: Callable[[], Any], timeout_s: float, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(step)
    return None


def run(mode: Mode, work_dir: Path) -> Result:
    del mode  # the faults are the same in both modes
    result = Result("slurm")
    why = missing()
    if why:
        if os.environ.get("BURSAR_REQUIRE_SYSTEM_TESTS") == "1":
            result.fail(why)
        else:
            result.skipped = why
        return result
    # munged runs as user munge and must reach its socket under the (0700) work dir.
    os.chmod(work_dir, 0o711)
    try:
        cluster = Cluster(work_dir / "cluster")
    except RuntimeError as exc:
        result.fail(str(exc))
        return result
    old_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf  # the broker process inherits it
    try:
        _scenarios(result, cluster, work_dir)
    finally:
        for n in range(1, NODES + 1):
            cluster.run("scontrol", "update", f"nodename=node{n}", "state=resume")
        if cluster.run("scontrol", "ping").returncode != 0:
            cluster.start_ctld()
        cluster.stop()
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
    return result


def _scenarios(result: Result, cluster: Cluster, work_dir: Path) -> None:
    prefix = f"brel{uuid.uuid4().hex[:6]}"
    cfg = work_dir / "slurm.toml"
    cfg.write_text(config_text(prefix))
    state = work_dir / "state"
    server = DrainedServer(
        state,
        "--backend",
        "slurm",
        "--config",
        str(cfg),
        "--rate-limit",
        "10000",
        "--rate-burst",
        "10000",
    )
    try:
        channel = grpc.insecure_channel(server.address)
        stub = pbg.BrokerStub(channel)
        sci = md(server.tokens()["sci"])
        _node_down(result, cluster, stub, sci)
        _ctld_restart(result, cluster, server, stub, sci, "stopped before the Acquire", None)
        _ctld_restart(result, cluster, server, stub, sci, "killed during salloc", signal.SIGKILL)
        _no_leaks(result, cluster, stub, sci, prefix)
        channel.close()
        server.kill(signal.SIGTERM)
    finally:
        server.close()
    audit = subprocess.run(
        [sys.executable, "-m", "bursar.cli.main", "journal", "audit", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    result.figures["journal_audit_exit"] = audit.returncode
    result.lines.append(f"journal audit: exit {audit.returncode}")
    if audit.returncode != 0:
        result.fail(f"journal audit failed: {audit.stdout[-800:]} {audit.stderr[-400:]}")


def _lease(stub: pbg.BrokerStub, meta: Any, lid: str) -> pb.Lease:
    return stub.GetLease(pb.GetLeaseRequest(lease_id=lid), metadata=meta, timeout=10)


ENDED = {pb.LEASE_STATE_RELEASED, pb.LEASE_STATE_EXPIRED, pb.LEASE_STATE_REVOKED}


def _node_down(result: Result, cluster: Cluster, stub: pbg.BrokerStub, sci: Any) -> None:
    got = stub.Acquire(
        pb.AcquireRequest(size={"gpu": 4, "cpu": 4}, duration_s=600, timeout_s=30),
        metadata=sci,
        timeout=60,
    )
    lease = got.lease
    job = int(lease.allocation["job_id"])
    node = lease.allocation["nodes"].split(",")[0]
    events: list[tuple[float, str, str]] = []
    watch = stub.Watch(pb.WatchRequest(lease_ids=[lease.lease_id]), metadata=sci, timeout=120)

    def follow() -> None:
        try:
            for ev in watch:
                events.append((time.monotonic(), pb.LeaseEventKind.Name(ev.kind), ev.cause or ""))
        except grpc.RpcError:
            pass

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    until(lambda: events, 5)  # the snapshot: the stream is registered
    t0 = time.monotonic()
    down = cluster.run(
        "scontrol", "update", f"nodename={node}", "state=down", "reason=bursar-reliability"
    )
    if down.returncode != 0:
        result.fail(f"scontrol could not set {node} down: {down.stderr}")
        return
    ended = until(
        lambda: (lambda ls: ls if ls.state in ENDED else None)(_lease(stub, sci, lease.lease_id)),
        30,
    )
    ended_s = time.monotonic() - t0
    job_gone = until(lambda: job not in cluster.job_states(""), 30)
    job_s = time.monotonic() - t0
    revoked = [e for e in events if e[1] == "LEASE_EVENT_KIND_REVOKED"]
    fig: dict[str, Any] = {
        "node": node,
        "job": job,
        "lease_state": pb.LeaseState.Name(ended.state) if ended else "still live",
        "end_cause": ended.end_cause if ended else "",
        "lease_ended_s": round(ended_s, 2),
        "watch_revoked_s": round(revoked[0][0] - t0, 2) if revoked else None,
        "job_ended_s": round(job_s, 2) if job_gone else None,
    }
    if ended is None or ended.state != pb.LEASE_STATE_REVOKED:
        result.fail(f"node {node} down: the lease did not end as revoked ({fig})")
    elif not any(w in ended.end_cause for w in ("lost", "down", "NODE_FAIL")):
        result.fail(f"node {node} down: the lease ended with cause {ended.end_cause!r}")
    if not revoked:
        result.fail("node down: the Watch stream did not report REVOKED")
    if not job_gone:
        result.fail(f"node down: Slurm job {job} still runs")

    def warm_gpus() -> float:
        s = stub.GetSupply(pb.SupplyRequest(), metadata=sci, timeout=10)
        return s.dims["gpu"].warm_free

    # The test cluster runs with ReturnToService=2: once the killed job's steps are gone
    # the node registers again and Slurm puts it back to idle by itself.
    fig["node_state_after_1s"] = (time.sleep(1.0), cluster.node_state(node))[1]
    watch.cancel()

    # Down again with nothing on it, the node stays down: the broker must stop offering it,
    # and offer it again once it is resumed.
    t1 = time.monotonic()
    cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=bursar-idle")
    off = until(lambda: warm_gpus() <= (NODES - 1) * GPUS, 10, 0.1)
    fig["idle_down_withdrawn_s"] = round(time.monotonic() - t1, 2) if off else None
    if not off:
        result.fail(f"node {node} down: the broker still offers {warm_gpus()} warm GPUs")
    try:
        whole = stub.Acquire(
            pb.AcquireRequest(size={"gpu": NODES * GPUS}, duration_s=60, timeout_s=0),
            metadata=sci,
            timeout=60,
        )
        fig["whole_pool_while_down"] = pb.LeaseState.Name(whole.lease.state)
        stub.Release(pb.ReleaseRequest(lease_id=whole.lease.lease_id), metadata=sci, timeout=30)
        result.fail(f"node {node} down: the whole pool was granted anyway")
    except grpc.RpcError as err:
        fig["whole_pool_while_down"] = err.code().name  # type: ignore[attr-defined]
    t2 = time.monotonic()
    cluster.run("scontrol", "update", f"nodename={node}", "state=resume")
    idle = until(lambda: cluster.node_state(node) in ("idle", "mixed"), 60, 0.2)
    fig["node_idle_after_resume_s"] = round(time.monotonic() - t2, 2) if idle else None
    back = until(lambda: warm_gpus() >= NODES * GPUS, 30, 0.2)
    fig["capacity_back_s"] = round(time.monotonic() - t2, 2) if back else None
    if not idle or not back:
        result.fail(f"node {node} resumed: not usable again ({fig})")
    result.figures["node_down"] = fig
    result.lines += [
        f"node {node} set DOWN mid-lease: lease {fig['lease_state']} after "
        f"{fig['lease_ended_s']} s ({fig['end_cause']!r}), Watch REVOKED after "
        f"{fig['watch_revoked_s']} s, Slurm job ended after {fig['job_ended_s']} s; Slurm "
        f"had the node {fig['node_state_after_1s']!r} 1 s later (ReturnToService=2)",
        f"node {node} set DOWN idle: out of the broker's supply after "
        f"{fig['idle_down_withdrawn_s']} s, a whole-pool Acquire got "
        f"{fig['whole_pool_while_down']}; resumed: idle in {fig['node_idle_after_resume_s']} s, "
        f"offered again after {fig['capacity_back_s']} s",
    ]


def _lost_lines(server: DrainedServer) -> int:
    """How many times the broker has logged a node as lost (unknown, down, ...)."""
    return sum(" is " in ln and "node " in ln for ln in server.stderr_tail)


def _ctld_restart(
    result: Result,
    cluster: Cluster,
    server: DrainedServer,
    stub: pbg.BrokerStub,
    sci: Any,
    how: str,
    kill_sig: int | None,
) -> None:
    outcome: dict[str, Any] = {}

    # Unequal pieces (8 + 4 GPUs) make a heterogeneous job, which Slurm starts from its
    # backfill scheduler (within bf_interval, 1 s): salloc is still waiting when slurmctld
    # is killed.
    size = {"gpu": 2, "cpu": 2} if kill_sig is None else {"gpu": 12, "cpu": 12}

    def acquire() -> None:
        t = time.monotonic()
        try:
            got = stub.Acquire(
                pb.AcquireRequest(size=size, duration_s=600, timeout_s=60),
                metadata=sci,
                timeout=120,
            )
            outcome.update(
                code="OK", lease=got.lease.lease_id, job=got.lease.allocation.get("job_id")
            )
        except grpc.RpcError as err:
            outcome.update(code=err.code().name, message=(err.details() or "")[:200])  # type: ignore[attr-defined]
        outcome["s"] = round(time.monotonic() - t, 2)

    lost_before = _lost_lines(server)
    if kill_sig is None:
        cluster.kill_ctld(signal.SIGTERM)
    thread = threading.Thread(target=acquire, daemon=True)
    thread.start()
    in_flight = True
    if kill_sig is not None:
        time.sleep(0.3)  # salloc waits for the backfill scheduler now
        in_flight = thread.is_alive()
        cluster.kill_ctld(kill_sig)
    time.sleep(2.0)
    back_s = cluster.start_ctld()
    thread.join(150)
    time.sleep(1.0)  # a poll or three after the restart
    fig = {
        "how": how,
        "ctld_back_s": round(back_s, 2),
        **outcome,
        "nodes_reported_lost": _lost_lines(server) - lost_before,
        "acquire_in_flight_at_fault": in_flight,
    }
    if outcome.get("code") in (None, "UNKNOWN", "INTERNAL"):
        result.fail(f"slurmctld {how}: the Acquire answered {outcome}")
    if outcome.get("code") == "OK":
        lease = _lease(stub, sci, outcome["lease"])
        fig["lease_state"] = pb.LeaseState.Name(lease.state)
        fig["end_cause"] = lease.end_cause
        if lease.state == pb.LEASE_STATE_ACTIVE:
            job = lease.allocation.get("job_id")
            fig["het_groups"] = lease.allocation.get("het_groups")
            running = until(lambda: job and int(job) in cluster.job_states(""), 10)
            if not running:
                result.fail(f"slurmctld {how}: an active lease without a running job ({fig})")
            stub.Release(pb.ReleaseRequest(lease_id=outcome["lease"]), metadata=sci, timeout=30)
        elif lease.state != pb.LEASE_STATE_REVOKED:
            # The documented failure is the revoked lease (a failed allocation ends it).
            result.fail(f"slurmctld {how}: granted lease in state {fig}")
        elif lease.allocation.get("job_id"):
            result.fail(f"slurmctld {how}: a revoked lease still names a job ({fig})")
    else:
        # A failed Acquire must leave no live lease behind.
        live = stub.ListLeases(pb.ListLeasesRequest(), metadata=sci, timeout=10).leases
        fig["live_leases_after"] = len(live)
        if live:
            result.fail(f"slurmctld {how}: the failed Acquire left {len(live)} live lease(s)")
    key = "ctld_" + ("kill" if kill_sig else "stop")
    result.figures[key] = fig
    result.lines.append(
        f"slurmctld {how} (back in {fig['ctld_back_s']} s"
        + ("" if in_flight else "; the Acquire had already been answered")
        + "): blocking Acquire answered "
        f"{fig.get('code')} after {fig.get('s')} s"
        + (f" ({fig.get('message')!r})" if fig.get("message") else "")
        + (f", lease {fig['lease_state']}" if "lease_state" in fig else "")
        + (f" ({fig['end_cause']!r})" if fig.get("end_cause") else "")
        + f"; the broker logged {fig['nodes_reported_lost']} node(s) lost meanwhile"
    )
    if fig["nodes_reported_lost"]:
        # A restarted slurmctld lists idle nodes as "unknown" until their slurmd registers
        # again: the backend must wait for news, not end the leases placed there.
        result.fail(
            f"slurmctld {how}: the broker took {fig['nodes_reported_lost']} node(s) for lost "
            "while the restarted controller had not heard from them yet"
        )


def _no_leaks(
    result: Result, cluster: Cluster, stub: pbg.BrokerStub, sci: Any, prefix: str
) -> None:
    for lease in stub.ListLeases(pb.ListLeasesRequest(), metadata=sci, timeout=10).leases:
        stub.Release(pb.ReleaseRequest(lease_id=lease.lease_id), metadata=sci, timeout=30)
    t0 = time.monotonic()
    clean = until(lambda: not cluster.job_states(prefix + "-"), 30, 0.2)
    left = cluster.job_states(prefix + "-")
    result.figures["leaked_jobs"] = len(left)
    result.figures["jobs_gone_s"] = round(time.monotonic() - t0, 2) if clean else None
    result.lines.append(f"after releasing every lease: {len(left)} Slurm job(s) with the prefix")
    if left:
        result.fail(f"Slurm jobs left with the broker's prefix: {left}")
