"""BursarNodeProvider against a broker on a real Slurm cluster (scripts/slurm-cluster.sh):
each node's lease is an allocation and its process runs as a step of it (a stand-in for
`ray start`, as in test_ray_provider, then a real raylet that joins a Ray head and runs
a task); terminating the node ends the step and the allocation, and an allocation
cancelled behind the broker's back takes its node away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from client_support import until
from ray_support import FAKE_NODE, worker_tags
from slurm_support import (
    job_prefix_fixture,  # noqa: F401  (fixtures: job_prefix, slurm_cluster)
    job_state,
    slurm_broker,
    slurm_cluster_fixture,  # noqa: F401
)

from bursar.providers.client import BrokerClient, LeaseState
from bursar.providers.ray import BursarNodeProvider
from bursar.providers.ray.local_head import local_head

pytestmark = pytest.mark.usefixtures("slurm_cluster")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_nodes_run_as_steps_of_their_leases_allocations(tmp_path: Path, job_prefix: str) -> None:
    envs = tmp_path / "env"
    envs.mkdir()
    with slurm_broker(tmp_path / "state", job_prefix) as served:
        p = BursarNodeProvider(
            {
                "type": "external",
                "broker": served.address,
                "campaign": "wf",
                "token": served.tokens["wf"],
                "head_address": "127.0.0.1:6379",
                "state_dir": str(tmp_path / "ray-state"),
                "node_command": [sys.executable, "-c", FAKE_NODE, str(envs)],
                "stop_grace_s": 0.5,
                "lease_duration_s": 60,
                "drain_on_preempt": False,
            },
            "t",
        )
        try:
            with BrokerClient(served.address, served.tokens["wf"]) as c:
                nodes = []
                for _ in range(2):
                    p.create_node_with_resources_and_labels({}, worker_tags(), 1, {"CPU": 2}, {})
                    nodes = p.non_terminated_nodes({})
                a, b = sorted(nodes)
                jobs = {}
                for node in (a, b):
                    env_file = envs / node
                    until(env_file.exists, 30, f"node {node}'s step")
                    env = json.loads(env_file.read_text())
                    lease = c.get_lease(node)
                    jobs[node] = int(lease.allocation["job_id"])
                    # The node's process is a step of its lease's allocation.
                    assert env["SLURM_JOB_ID"] == str(jobs[node])
                    assert env["RAY_CLOUD_INSTANCE_ID"] == node
                    assert json.loads(env["RAY_OVERRIDE_RESOURCES"])["CPU"] == 2.0
                pid_a = int(json.loads((envs / a).read_text())["PID"])

                # Terminated: the step and the allocation end with the lease.
                p.terminate_node(a)
                assert c.get_lease(a).state is LeaseState.RELEASED
                until(lambda: not alive(pid_a), 10, "node a's step ended")
                until(lambda: job_state(jobs[a]) != "RUNNING", 10, "node a's allocation ended")

                # An allocation cancelled behind the broker's back: the node goes, with
                # its lease (whichever comes first: the step's end or the revocation).
                subprocess.run(["scancel", str(jobs[b])], check=True, timeout=30)
                until(lambda: p.non_terminated_nodes({}) == [], 15, "node b gone")
                until(lambda: b in p.ended_nodes(), 5, "node b ended")
                why = p.ended_nodes()[b]
                assert why.startswith(("revoked", "raylet exited")), why
                until(lambda: c.get_lease(b).ended, 10, "node b's lease ended")
        finally:
            p.close()


@pytest.mark.slow
def test_a_real_raylet_joins_the_cluster_from_inside_an_allocation(
    tmp_path: Path, job_prefix: str
) -> None:
    state = tmp_path / "ray-state"
    with (
        slurm_broker(tmp_path / "state", job_prefix) as served,
        local_head(state_dir=state, log_path=tmp_path / "head.log") as head,
    ):
        p = BursarNodeProvider(
            {
                "type": "external",
                "broker": served.address,
                "campaign": "wf",
                "token": served.tokens["wf"],
                "head_address": head.address,
                "state_dir": str(state),
                "stop_grace_s": 1,
                "ray_start_args": ["--include-log-monitor=false"],
            },
            "t",
        )
        ray.init(address=head.address, log_to_driver=False)
        try:
            p.create_node_with_resources_and_labels(
                {}, worker_tags(), 1, {"CPU": 1, "bursar_node": 1}, {}
            )
            (node,) = p.non_terminated_nodes({})

            @ray.remote(resources={"bursar_node": 1}, num_cpus=1)
            def job_id() -> str:
                return os.environ["SLURM_JOB_ID"]

            with BrokerClient(served.address, served.tokens["wf"]) as c:
                allocation = c.get_lease(node).allocation["job_id"]
            assert ray.get(job_id.remote(), timeout=120) == allocation
            p.terminate_node(node)
            until(lambda: sum(n["Alive"] for n in ray.nodes()) == 1, 30, "the raylet gone")
            until(lambda: job_state(int(allocation)) != "RUNNING", 10, "the allocation ended")
        finally:
            ray.shutdown()
            p.close()
