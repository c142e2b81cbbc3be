"""BursarNodeProvider with an elastic node type, against a real broker over gRPC: each
unit of the lease is a Ray node. First the provider's contract with stand-in node
processes (as tests/providers/test_ray_provider.py does), then a real Ray cluster whose tasks run
throughout a growth and a shrink, the shrunk unit drained in Ray before the deadline.

One Ray cluster per host: these run serially; cleanup is by PID (never `ray stop`)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from client_support import ServerThread, server_thread, until
from elastic_support import GRACE_S, elastic_config
from ray.autoscaler.tags import TAG_RAY_LAUNCH_REQUEST
from ray.core.generated.common_pb2 import NodeDeathInfo
from test_ray_provider import RESOURCES, create, make, node_env, node_proc

from bursar.providers.client import BrokerClient, LeaseState
from bursar.providers.ray import TAG_ELASTIC_OF
from bursar.providers.ray.local_head import local_head
from bursar.providers.ray.raylet import alive
from bursar.providers.ray.settings import SettingsError, node_settings

ELASTIC = {"min": 1, "max": 2, "work": 5000, "deadline": 3000, "amdahl": 0.05}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    # One node of 2 cores: an elastic node of 1-core units holds it all once grown.
    with server_thread(tmp_path / "state", cfg=elastic_config(nodes=1)) as s:
        yield s


def shrink_for_another_campaign(server: ServerThread) -> tuple[Any, float]:
    """Another campaign's fixed request for one core: answered after the shrink."""
    with BrokerClient(server.address, server.tokens["fixed"]) as fx:
        t0 = time.time()
        return fx.acquire({"cpu": 1}, 30, timeout=30), t0


def test_an_elastic_node_lists_a_node_per_unit_and_stops_the_units_a_shrink_takes(
    server: ServerThread, tmp_path: Path
) -> None:
    p = make(server, "el", tmp_path)
    try:
        (lease_id,) = [n for n in create(p, elastic=ELASTIC) if "-u" not in n]
        # Granted at one unit, grown at once to the node's two cores: two Ray nodes.
        unit = f"{lease_id}-u1"
        until(lambda: sorted(p.non_terminated_nodes({})) == [lease_id, unit], 10, "2 nodes")
        assert p.node_tags(unit)[TAG_ELASTIC_OF] == lease_id
        assert p.node_tags(unit)["ray-user-node-type"] == "cpu_worker"
        assert TAG_RAY_LAUNCH_REQUEST in p.node_tags(lease_id)
        assert TAG_RAY_LAUNCH_REQUEST not in p.node_tags(unit)  # no launch of Ray's made it
        assert p.internal_ip(unit) == p.internal_ip(lease_id) == "127.0.0.1"  # the head's
        env = node_env(tmp_path, unit)
        assert env["BURSAR_LEASE_ID"] == lease_id and env["RAY_CLOUD_INSTANCE_ID"] == unit
        assert '"bursar.io/unit": "1"' in env["RAY_OVERRIDE_LABELS"]
        until(lambda: p.is_running(unit), 10, "the unit's raylet")
        proc = node_proc(p, unit)
        node = p._nodes[lease_id]

        got, t0 = shrink_for_another_campaign(server)
        assert got.campaign == "fixed"
        (shrink,) = node.resizes  # type: ignore[union-attr]
        assert shrink.units == 1 and shrink.stopped == [unit]
        assert shrink.deadline is not None and abs(shrink.deadline - (t0 + GRACE_S)) < 1.0
        assert shrink.done_at <= shrink.deadline
        assert not alive(proc) and p.is_terminated(unit)
        assert p.non_terminated_nodes({}) == [lease_id]
        assert p.ended_nodes()[unit] == "resized away"
        with BrokerClient(server.address, server.tokens["el"]) as c:
            assert c.get_lease(lease_id).size["cpu"] == 1.0

        p.terminate_node(lease_id)
        assert p.non_terminated_nodes({}) == []
        with BrokerClient(server.address, server.tokens["el"]) as c:
            assert c.get_lease(lease_id).state is LeaseState.RELEASED
    finally:
        p.close()


N = 60


@pytest.mark.slow
def test_ray_tasks_run_through_a_growth_and_a_shrink_with_none_lost(
    server: ServerThread, tmp_path: Path
) -> None:
    # The provider is driven as Ray's autoscaler would drive it (one create, one
    # terminate), so that the test decides when nodes come and go; the raylets, the
    # drain and the tasks are Ray's own.
    def square(x: int, sleep_s: float) -> tuple[int, str]:
        time.sleep(sleep_s)
        return x * x, os.environ.get("RAY_CLOUD_INSTANCE_ID", "")

    ray_state = tmp_path / "ray-state"
    with local_head(state_dir=ray_state, log_path=tmp_path / "ray-head.log") as head:
        p = make(
            server,
            "el",
            tmp_path,
            head_address=head.address,
            node_command=None,
            drain_on_preempt=True,
            stop_grace_s=0.5,
            ray_start_args=["--include-log-monitor=false"],
        )
        ray.init(address=head.address, log_to_driver=False)
        try:
            (lease_id,) = [n for n in create(p, RESOURCES, elastic=ELASTIC) if "-u" not in n]
            unit = f"{lease_id}-u1"

            def leased() -> dict[str, dict[str, Any]]:
                return {
                    str(n["Labels"].get("bursar.io/unit", "0")): n
                    for n in ray.nodes()
                    if "bursar_node" in n["Resources"] and n["Alive"]
                }

            # Granted at one unit, grown at once: two Ray nodes of one core each.
            until(lambda: set(leased()) == {"0", "1"}, 90, "two leased Ray nodes")
            task = ray.remote(resources={"bursar_node": 1}, num_cpus=1)(square)
            refs = [task.remote(i, 0.1) for i in range(N)]
            ray.wait(refs, num_returns=10, timeout=60)
            done, _ = ray.wait(refs, num_returns=N, timeout=0)
            assert len(done) < N, "the work ended before the shrink"

            got, t0 = shrink_for_another_campaign(server)
            node = p._nodes[lease_id]
            (shrink,) = node.resizes  # type: ignore[union-attr]
            assert shrink.stopped == [unit] and shrink.done_at <= shrink.deadline
            print(f"shrink done {shrink.deadline - shrink.done_at:.2f} s before its deadline")
            assert abs(shrink.deadline - (t0 + GRACE_S)) < 1.0
            until(lambda: set(leased()) == {"0"}, 30, "the unit's Ray node gone")
            (dead,) = [n for n in ray.nodes() if not n["Alive"]]  # the unit's node
            # Drained in Ray before it stopped: what it ran is retried as after a
            # preemption, without using the task's retries.
            assert dead["DeathReason"] == NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED
            assert f"Bursar lease {lease_id} shrinks to 1 units" in dead["DeathReasonMessage"]
            results = ray.get(refs, timeout=120)
            assert [r for r, _ in results] == [i * i for i in range(N)]
            assert {where for _, where in results} == {lease_id, unit}
            with BrokerClient(server.address, server.tokens["fixed"]) as fx:
                fx.release(got.id)
        finally:
            ray.shutdown()
            p.close()
    with BrokerClient(server.address, server.tokens["el"]) as c:
        assert c.get_lease(lease_id).state is LeaseState.RELEASED


def test_an_elastic_node_type_is_checked_with_its_node_config() -> None:
    ns = node_settings("w", {"elastic": {"max": 3, "work": 60, "deadline": "00:05:00"}})
    assert ns.elastic is not None and (ns.elastic.min, ns.elastic.max) == (1, 3)
    assert ns.elastic.intent({"cpu": 1.0}).max == {"cpu": 3.0}
    with pytest.raises(SettingsError, match=r"node_config\.elastic: missing \['deadline'\]"):
        node_settings("w", {"elastic": {"max": 3, "work": 60}})
