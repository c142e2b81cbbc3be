"""The local backend behind the real gRPC service on loopback: leases carry their CPUs,
workers started through ``launch_argv`` run on them, a full machine makes the next request
wait, a reclaim ends the victim's workers, and a Dask worker runs on its lease's CPUs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from local_support import (
    BUSY,
    LOCAL_CAMPAIGNS,
    cpus_allowed,
    exec_done,
    local_pool,
    nproc,
    start,
    until,
)
from service_support import worker_pythonpath

from bursar.broker.backends.local import LocalPool
from bursar.broker.backends.local_discovery import parse_cpulist
from bursar.broker.config import parse_config
from bursar.cli.main import main
from bursar.providers.client import Backoff, BrokerClient, LeasePath, LeaseState, Refused
from bursar.testing import local_broker as served

pytestmark = pytest.mark.skipif(nproc() < 2, reason="needs 2 CPUs in this process's affinity")

FAST = Backoff(initial_s=0.05, max_s=0.5)


@contextmanager
def local_broker(
    state_dir: Path, grace_s: float = 1.0
) -> Iterator[tuple[str, dict[str, str], LocalPool]]:
    """The service in this process, on a thread, on a free port, over this machine."""
    backend = local_pool(state_dir / "local", grace_s=grace_s, poll_s=0.2)
    spec = backend.pool_spec()
    cfg = parse_config(LOCAL_CAMPAIGNS, "toml", discover=lambda _s: spec)
    try:
        with served(state_dir=state_dir, config=cfg, backend=backend) as b:
            yield b.address, b.tokens, backend
    finally:
        backend.wait_reaped(10)


def test_leases_over_grpc_are_pinned_and_a_reclaim_ends_the_victims_workers(
    tmp_path: Path,
) -> None:
    procs = []
    with local_broker(tmp_path / "state") as (address, tokens, _):
        try:
            with (
                BrokerClient(address, tokens["sci"], backoff=FAST) as sci,
                BrokerClient(address, tokens["fill"], backoff=FAST) as fill,
            ):
                mine = sci.acquire({"cpu": 1}, 600, blocking=False)
                victim = fill.acquire({"cpu": 1}, 600, blocking=False)
                for lease in (mine, victim):
                    assert lease.allocation["backend"] == "local"
                a, b = mine.allocation["cpus"], victim.allocation["cpus"]
                assert a != b and len(parse_cpulist(a)) == len(parse_cpulist(b)) == 1
                for lease in (mine, victim):
                    procs.append(start(lease.allocation, BUSY))
                for p in procs:
                    until(lambda p=p: exec_done(p), 10, "exec")
                assert cpus_allowed(procs[0].pid) == parse_cpulist(a)
                assert cpus_allowed(procs[1].pid) == parse_cpulist(b)
                # The machine is full: a third lease of the same class is refused.
                with pytest.raises(Refused):
                    fill.acquire({"cpu": 1}, 600, blocking=False)
                # A batch request reclaims the preemptible lease: its worker ends within the
                # policy's grace period plus the kill grace.
                t0 = time.monotonic()
                grab = sci.acquire({"cpu": 1}, 600, blocking=False)
                assert grab.path is LeasePath.RECLAIM
                assert procs[1].wait(10) == -signal.SIGTERM
                assert time.monotonic() - t0 < 1.0 + 1.0 + 2.0
                ended = until(
                    lambda: (lambda x: x if x.state is LeaseState.REVOKED else None)(
                        fill.get_lease(victim.id)
                    ),
                    10,
                    "the victim to be revoked",
                )
                assert ended is not None
                got = until(
                    lambda: (lambda x: x if x.allocation.get("cpus") else None)(
                        sci.get_lease(grab.id)
                    ),
                    10,
                    "the reclaiming lease's allocation",
                )
                assert got.allocation["cpus"] == b  # the CPU the victim gave back
                assert procs[0].poll() is None
                sci.release(mine.id)
                assert procs[0].wait(10) == -signal.SIGTERM
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


@pytest.mark.slow
def test_a_dask_worker_on_a_one_cpu_lease_runs_on_that_cpu(tmp_path: Path) -> None:
    from dask_support import prologue
    from distributed import Client

    from bursar.providers.dask import BursarCluster

    with local_broker(tmp_path / "state") as (address, tokens, backend):

        async def scenario() -> tuple[list[int], list[int]]:
            async with (
                BursarCluster(
                    walltime=60,
                    cores=1,
                    memory="1GB",
                    broker=address,
                    campaign="sci",
                    token=tokens["sci"],
                    asynchronous=True,
                    scheduler_options={"dashboard_address": ":0", "host": "127.0.0.1"},
                    job_script_prologue=prologue(),
                    backoff=FAST,
                    log_directory=str(tmp_path / "logs"),
                ) as cluster,
                Client(cluster, asynchronous=True) as client,
            ):
                cluster.scale(jobs=1)
                deadline = time.monotonic() + 60
                while len(cluster.scheduler_info["workers"]) < 1:
                    assert time.monotonic() < deadline, "no Dask worker"
                    await asyncio.sleep(0.1)
                (lid,) = cluster.lease_ids()
                cpus, _ = backend.devices(lid)
                seen = await client.run(lambda: sorted(os.sched_getaffinity(0)))
                (worker_cpus,) = seen.values()
                return cpus, worker_cpus

        cpus, worker_cpus = asyncio.run(scenario())
        assert len(cpus) == 1 and worker_cpus == cpus


def test_serve_backend_local_needs_a_config(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["serve", "--backend", "local", "--state-dir", str(tmp_path)])
    assert r.exit_code == 2 and "--backend local needs --config FILE" in r.output


def affinity() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@pytest.mark.slow
def test_a_parsl_block_on_a_one_cpu_lease_runs_its_tasks_on_that_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import parsl
    from parsl.app.app import python_app
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor

    from bursar.providers.parsl import BursarProvider

    tests = worker_pythonpath()
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    with local_broker(tmp_path / "state") as (address, tokens, backend):
        provider = BursarProvider(
            broker=address,
            campaign="sci",
            token=tokens["sci"],
            backoff=FAST,
            resources_per_block={"cpu": 1},
            init_blocks=1,
            min_blocks=0,
            max_blocks=1,
            walltime=60,
            worker_init=f"export PYTHONPATH={tests}{os.pathsep}$PYTHONPATH",
        )
        config = Config(
            executors=[
                HighThroughputExecutor(
                    label="htex",
                    address="127.0.0.1",
                    cores_per_worker=1,
                    max_workers_per_node=1,
                    provider=provider,
                )
            ],
            run_dir=str(tmp_path / "runinfo"),
            strategy="none",
        )
        dfk = parsl.load(config)
        try:
            seen = python_app(affinity)().result(timeout=60)
            (lid,) = list(backend.placements())
            assert seen == backend.devices(lid)[0] and len(seen) == 1
        finally:
            dfk.cleanup()
            parsl.clear()


def test_bursar_serve_backend_local_as_a_process(tmp_path: Path) -> None:
    from server_support import Server

    cfg = tmp_path / "site.toml"
    cfg.write_text(LOCAL_CAMPAIGNS)
    state = tmp_path / "state"
    server = Server(state, "--backend", "local", "--config", str(cfg), "--local-kill-grace", "1")
    p = None
    try:
        # The enforcement in force, said once at start-up.
        (mode,) = [line for line in server.lines if "local backend:" in line]
        assert "cgroups: plan" in mode or "cgroups: cgroup" in mode
        with BrokerClient(server.address, server.tokens()["sci"], backoff=FAST) as sci:
            lease = sci.acquire({"cpu": 1}, 600, blocking=False)
            assert lease.allocation["run_dir"] == str((state / "local").resolve())
            p = start(lease.allocation, BUSY)
            until(lambda: exec_done(p), 10, "exec")
            assert cpus_allowed(p.pid) == parse_cpulist(lease.allocation["cpus"])
            sci.release(lease.id)
            assert p.wait(10) == -signal.SIGTERM
    finally:
        if p is not None and p.poll() is None:
            p.kill()
        server.kill(signal.SIGTERM)
        server.close()


def test_a_ray_node_on_a_one_cpu_lease_runs_on_that_cpu(tmp_path: Path) -> None:
    from ray_support import FAKE_NODE, worker_tags

    from bursar.providers.ray import BursarNodeProvider

    envs = tmp_path / "env"
    envs.mkdir()
    with local_broker(tmp_path / "state") as (address, tokens, backend):
        p = BursarNodeProvider(
            {
                "type": "external",
                "broker": address,
                "campaign": "sci",
                "token": tokens["sci"],
                "head_address": "127.0.0.1:6379",
                "state_dir": str(tmp_path / "ray-state"),
                # A stand-in for `ray start` that writes its environment and pid.
                "node_command": [sys.executable, "-c", FAKE_NODE, str(envs)],
                "stop_grace_s": 0.5,
                "lease_duration_s": 60,
                "drain_on_preempt": False,
            },
            "t",
        )
        try:
            p.create_node_with_resources_and_labels({}, worker_tags(), 1, {"CPU": 1}, {})
            (node,) = p.non_terminated_nodes({})
            env_file = envs / node
            until(env_file.exists, 30, "the node's process")
            env = json.loads(env_file.read_text())
            pid = int(env["PID"])
            cpus, _ = backend.devices(node)
            assert len(cpus) == 1 and cpus_allowed(pid) == cpus
            assert env["OMP_NUM_THREADS"] == "1" and env["CUDA_VISIBLE_DEVICES"] == ""
            p.terminate_node(node)
            until(lambda: not Path(f"/proc/{pid}").exists() or not _running(pid), 10, "end")
        finally:
            p.close()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
