"""BursarNodeProvider's contract against a real broker over gRPC, without Ray processes:
each node runs a small Python process in place of `ray start` (provider.node_command),
so the tests see what a raylet would be given and that the provider starts and stops
it with its lease."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from client_support import ServerThread, server_thread, until
from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    NODE_KIND_WORKER,
    STATUS_UNINITIALIZED,
    STATUS_UP_TO_DATE,
    TAG_RAY_LAUNCH_REQUEST,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)
from ray_support import EXAMPLE, FAKE_NODE, cluster_yaml, ray_config, worker_tags

from bursar.providers.client import AdminClient, BrokerClient, LeaseState
from bursar.providers.ray import TAG_LEASE_STATE, BursarNodeProvider, LeaseRefused
from bursar.providers.ray.check import check
from bursar.providers.ray.raylet import Proc, alive, proc_start
from bursar.providers.ray.settings import (
    SettingsError,
    lease_size,
    node_settings,
    parse_settings,
    raylet_labels,
)
from bursar.testing import ManualClock

GIB = 2**30
RESOURCES = {"CPU": 1, "memory": GIB, "bursar_node": 1}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state", cfg=ray_config()) as s:
        yield s


def provider_config(
    server: ServerThread, campaign: str, tmp_path: Path, *exit_code: str, **kw: Any
) -> dict[str, Any]:
    (tmp_path / "env").mkdir(exist_ok=True)
    cfg: dict[str, Any] = {
        "type": "external",
        "module": "bursar.providers.ray.BursarNodeProvider",
        "broker": server.address,
        "campaign": campaign,
        "token": server.tokens[campaign],
        "head_address": "127.0.0.1:6379",
        "state_dir": str(tmp_path / "ray-state"),
        "node_command": [sys.executable, "-c", FAKE_NODE, str(tmp_path / "env"), *exit_code],
        "stop_grace_s": 0.5,
        "max_retry_s": 0.5,
        "lease_duration_s": 30,
        "disable_node_updaters": True,
        "drain_on_preempt": False,  # no Ray here to drain in
    }
    cfg.update(kw)
    return cfg


def make(server: ServerThread, campaign: str, tmp_path: Path, *a: str, **kw: Any):
    return BursarNodeProvider(provider_config(server, campaign, tmp_path, *a, **kw), "t")


def create(
    p: BursarNodeProvider, resources: dict[str, float] = RESOURCES, **node_config: Any
) -> list[str]:
    before = set(p.non_terminated_nodes({}))
    p.create_node_with_resources_and_labels(
        node_config, worker_tags(), 1, dict(resources), {"zone": "a"}
    )
    return sorted(set(p.non_terminated_nodes({})) - before)


def node_env(tmp_path: Path, node_id: str) -> dict[str, str]:
    path = tmp_path / "env" / node_id
    until(path.exists, 10, f"node {node_id}'s process")
    return json.loads(path.read_text())


def node_proc(p: BursarNodeProvider, node_id: str) -> Proc:
    pid = until(lambda: p.raylet_pid(node_id), 10, "a process")
    return Proc(pid, proc_start(pid) or 0)


def test_nodes_are_leases_listed_with_their_tags_and_terminated_idempotently(
    server: ServerThread, tmp_path: Path
) -> None:
    p = make(server, "ray", tmp_path)
    try:
        # Two launcher threads at once, as Ray's autoscaler does.
        ids: list[str] = []
        threads = [threading.Thread(target=lambda: ids.extend(create(p))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        a, b = sorted(p.non_terminated_nodes({}))
        assert sorted(p.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: "cpu_worker"})) == [a, b]
        assert p.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: "gpu_worker"}) == []
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            for node_id in (a, b):
                lease = c.get_lease(node_id)  # the node id is the lease id
                assert lease.state is LeaseState.ACTIVE
                assert dict(lease.size) == {"cpu": 1.0, "mem_gb": 1.0}
                assert lease.labels["engine"] == "ray"
                assert lease.labels["ray_node_type"] == "cpu_worker"
        tags = p.node_tags(a)
        assert tags[TAG_RAY_LAUNCH_REQUEST] == "req-1"  # v2 matches launches by it
        assert tags[TAG_RAY_NODE_KIND] == NODE_KIND_WORKER
        # Every node on the head's address (its servers bound to it, not every interface).
        assert p.internal_ip(a) == p.internal_ip(b) == "127.0.0.1"
        assert p.external_ip(a) == p.internal_ip(a)

        # The node's process is what `ray start` would be: the node type's resources
        # and labels, and the ids the v2 autoscaler matches nodes by.
        env = node_env(tmp_path, a)
        assert env["RAY_CLOUD_INSTANCE_ID"] == a and env["RAY_NODE_TYPE_NAME"] == "cpu_worker"
        assert env["BURSAR_LEASE_ID"] == a and env["BURSAR_CAMPAIGN"] == "ray"
        assert json.loads(env["RAY_OVERRIDE_RESOURCES"]) == {
            "CPU": 1.0,
            "GPU": 0.0,
            "memory": float(GIB),
            "bursar_node": 1.0,
        }
        labels = json.loads(env["RAY_OVERRIDE_LABELS"])
        assert (
            labels["zone"] == "a" and labels["bursar.io/lease-id"] == raylet_labels({"x": a})["x"]
        )
        assert labels["bursar.io/lease-duration-s"] == "30"
        assert env["BURSAR_RAY_NODE_IP"] == p.internal_ip(a)
        assert env["BURSAR_RAY_HEAD_ADDRESS"] == "127.0.0.1:6379"
        until(lambda: p.is_running(a), 5, "is_running")
        assert p.node_tags(a)[TAG_RAY_NODE_STATUS] == STATUS_UP_TO_DATE
        assert p.node_tags(a)[TAG_LEASE_STATE] == "ACTIVE"
        p.set_node_tags(a, {"extra": "1"})
        assert p.node_tags(a)["extra"] == "1"

        proc = node_proc(p, a)
        p.terminate_node(a)
        assert p.non_terminated_nodes({}) == [b]
        assert p.is_terminated(a) and not p.is_running(a)
        assert not alive(proc)
        assert p.node_tags(a)[TAG_RAY_LAUNCH_REQUEST] == "req-1"  # still answers
        assert p.ended_nodes()[a] == "terminated"
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            assert c.get_lease(a).state is LeaseState.RELEASED
        # Again (v2 drains, then terminates), and nodes it never had: nothing happens.
        p.terminate_node(a)
        p.terminate_nodes([a, "no-such-node"])
        assert p.non_terminated_nodes({}) == [b]
    finally:
        p.close()
    with BrokerClient(server.address, server.tokens["ray"]) as c:
        assert c.list_leases() == []


def test_a_revoked_lease_takes_its_node_away_at_once(server: ServerThread, tmp_path: Path) -> None:
    p = make(server, "ray", tmp_path)
    try:
        (node,) = create(p)
        proc = node_proc(p, node)
        with BrokerClient(server.address, server.tokens["hi"]) as hi:
            hi.acquire({"cpu": 2}, 30, blocking=False)  # reclaims the backfill tier's core
            until(lambda: p.node_tags(node)[TAG_LEASE_STATE] == "PREEMPTING", 5, "PREEMPTING")
            assert p.non_terminated_nodes({}) == [node]  # runs on through the grace period
            until(lambda: p.non_terminated_nodes({}) == [], 5, "the node gone")
            with BrokerClient(server.address, server.tokens["ray"]) as c:
                assert c.get_lease(node).state is LeaseState.REVOKED
            assert p.is_terminated(node)
            until(lambda: not alive(proc), 5, "its process stopped")
            until(lambda: node in p.ended_nodes(), 5)
            assert p.ended_nodes()[node].startswith("revoked"), p.ended_nodes()
            p.terminate_node(node)  # the autoscaler catching up: harmless
    finally:
        p.close()


def test_a_refusal_raises_ray_launch_exception_with_reason_and_retry_after(
    server: ServerThread, tmp_path: Path
) -> None:
    p = make(server, "capped", tmp_path)
    p.clock = ManualClock(1_750_000_000.0)  # the cool-down's: the test moves it past max_retry_s
    cpu = {"CPU": 1}
    try:
        (first,) = create(p, cpu)
        with pytest.raises(LeaseRefused) as info:
            create(p, cpu)
        exc = info.value
        assert isinstance(exc, NodeLaunchException)
        assert exc.reason == exc.category == "ABOVE_BURST"
        assert "ABOVE_BURST" in exc.description and "retry after" in exc.description
        assert exc.retry_after > 0
        assert p.non_terminated_nodes({}) == [first]
        # Within max_retry_s the broker is not asked again.
        with pytest.raises(LeaseRefused, match="not asked again"):
            create(p, cpu)
        p.terminate_node(first)
        p.clock.advance(0.6)
        (second,) = create(p, cpu)
        assert second != first
    finally:
        p.close()


def test_an_expired_lease_ends_its_node(server: ServerThread, tmp_path: Path) -> None:
    # poor's bucket holds one 2-second lease and no refill: the renewal is refused.
    p = make(server, "poor", tmp_path, lease_duration_s=2)
    try:
        p.create_node_with_resources_and_labels({}, worker_tags(), 1, {"CPU": 1}, {})
        (node,) = p.non_terminated_nodes({})
        proc = node_proc(p, node)
        until(lambda: p.non_terminated_nodes({}) == [], 8, "the node gone")
        until(lambda: node in p.ended_nodes(), 5)
        assert p.ended_nodes()[node].startswith("expired"), p.ended_nodes()
        until(lambda: not alive(proc), 5, "its process stopped")
    finally:
        p.close()


def test_a_node_whose_process_exits_gives_its_lease_back(
    server: ServerThread, tmp_path: Path
) -> None:
    p = make(server, "ray", tmp_path, "3")
    try:
        (node,) = create(p)
        until(lambda: node in p.ended_nodes(), 10, "the node ended")
        assert p.ended_nodes()[node] == "raylet exited with 3"
        assert p.non_terminated_nodes({}) == []
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            assert c.get_lease(node).state is LeaseState.RELEASED
    finally:
        p.close()


# A monitor that leases ``sys.argv[2]`` nodes, prints ``NODE:PID`` for each once its
# process runs, and waits: the tests SIGKILL it (a crash: nothing is released).
CRASHING_MONITOR = """
import json, sys, time
from bursar.providers.ray import BursarNodeProvider
from ray.autoscaler.tags import TAG_RAY_LAUNCH_REQUEST, TAG_RAY_USER_NODE_TYPE
p = BursarNodeProvider(json.loads(sys.argv[1]), "t")
for i in range(int(sys.argv[2])):
    tags = {TAG_RAY_USER_NODE_TYPE: "w", TAG_RAY_LAUNCH_REQUEST: f"req-{i}"}
    p.create_node_with_resources_and_labels({}, tags, 1, {"CPU": 1}, {"zone": "a"})
nodes = p.non_terminated_nodes({})
while any(p.raylet_pid(n) is None for n in nodes):
    time.sleep(0.05)
print(" ".join(f"{n}:{p.raylet_pid(n)}" for n in nodes), flush=True)
time.sleep(600)
"""


def crashed_monitor(cfg: dict[str, Any], nodes: int) -> dict[str, Proc]:
    """Run a monitor that leases ``nodes`` nodes, then SIGKILL it; its nodes' processes."""
    monitor = subprocess.Popen(
        [sys.executable, "-c", CRASHING_MONITOR, json.dumps(cfg), str(nodes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert monitor.stdout is not None
        pairs = [pair.split(":") for pair in monitor.stdout.readline().split()]
    finally:
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait()
    assert len(pairs) == nodes, pairs
    return {n: Proc(int(pid), proc_start(int(pid)) or 0) for n, pid in pairs}


def journal_kinds(server: ServerThread, after: int = 0) -> list[tuple[int, str, str]]:
    """(seq, kind, lease or request id) of the broker's journal entries after ``after``."""
    path = server.state_dir / "journal.sqlite"
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT seq, event FROM entries WHERE seq > ?", (after,)).fetchall()
    finally:
        db.close()
    out = []
    for seq, raw in rows:
        ev = json.loads(raw)
        out.append((seq, ev["kind"], ev.get("lease_id") or ev.get("request_id") or ""))
    return out


def test_a_restarted_provider_adopts_the_nodes_its_predecessor_left_running(
    server: ServerThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An address of its own for each node: the adopted nodes keep theirs.
    cfg = provider_config(server, "ray", tmp_path, node_ip_range="127.0.0.2-127.0.0.254")
    procs = crashed_monitor(cfg, 2)
    assert all(alive(proc) for proc in procs.values())  # they outlive the monitor
    with BrokerClient(server.address, server.tokens["ray"]) as c:
        before = {n: c.get_lease(n) for n in procs}
        assert {lease.state for lease in before.values()} == {LeaseState.ACTIVE}
        seq = journal_kinds(server)[-1][0]
        caplog.set_level("INFO", logger="bursar.providers.ray")
        p = BursarNodeProvider(cfg, "t")
        try:
            # The same nodes, under the same lease ids, with their tags and addresses;
            # their processes were left running.
            assert sorted(p.non_terminated_nodes({})) == sorted(procs)
            assert sorted(p.non_terminated_nodes({TAG_RAY_USER_NODE_TYPE: "w"})) == sorted(procs)
            assert {p.node_tags(n)[TAG_RAY_LAUNCH_REQUEST] for n in procs} == {"req-0", "req-1"}
            assert len({p.internal_ip(n) for n in procs}) == 2
            for n, proc in procs.items():
                assert p.is_running(n) and alive(proc)
                assert p.raylet_pid(n) == proc.pid
                assert p.node_tags(n)[TAG_LEASE_STATE] == "ACTIVE"
                assert f"node {n} (w): adopted from a previous provider" in caplog.text
            # Renewed, not acquired again: the journal since the crash holds renewals only.
            after = {n: c.get_lease(n) for n in procs}
            assert {lease.state for lease in after.values()} == {LeaseState.ACTIVE}
            assert all(after[n].expires_at > before[n].expires_at for n in procs)
            kinds = journal_kinds(server, seq)
            assert sorted((k, i) for _, k, i in kinds) == sorted(("renew", n) for n in procs)
            assert len(c.list_leases()) == 2

            # A new node takes an address of its own, not one of the adopted nodes'.
            p.terminate_node(sorted(procs)[0])
            (new,) = create(p)
            assert p.internal_ip(new) != p.internal_ip(sorted(procs)[1])

            # Scaled down as any node: raylet stopped, lease released.
            p.terminate_nodes(sorted(procs))
            assert p.non_terminated_nodes({}) == [new]
            assert not any(alive(proc) for proc in procs.values())
            assert {c.get_lease(n).state for n in procs} == {LeaseState.RELEASED}
            assert {p.ended_nodes()[n] for n in procs} == {"terminated"}
        finally:
            p.close()
        assert c.list_leases() == []


def test_an_adopted_node_whose_raylet_exits_gives_its_lease_back(
    server: ServerThread, tmp_path: Path
) -> None:
    cfg = provider_config(server, "ray", tmp_path)
    ((node, proc),) = crashed_monitor(cfg, 1).items()
    p = BursarNodeProvider(cfg, "t")
    try:
        assert p.non_terminated_nodes({}) == [node]
        os.kill(proc.pid, signal.SIGKILL)  # not our child: seen through its pidfd
        until(lambda: node in p.ended_nodes(), 10, "the node ended")
        assert p.ended_nodes()[node] == "raylet exited"
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            assert c.get_lease(node).state is LeaseState.RELEASED
    finally:
        p.close()


def test_a_node_whose_lease_ended_meanwhile_is_cleaned_up_the_other_adopted(
    server: ServerThread, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = provider_config(server, "ray", tmp_path)
    procs = crashed_monitor(cfg, 2)
    gone, kept = sorted(procs)
    with (
        BrokerClient(server.address, server.tokens["ray"]) as c,
        AdminClient(server.address, server.admin_token) as admin,
    ):
        admin.revoke_lease(gone, "node drained by an operator")
        assert alive(procs[gone])  # nobody stopped its process: the monitor is dead
        seq = journal_kinds(server)[-1][0]
        p = BursarNodeProvider(cfg, "t")
        try:
            assert p.non_terminated_nodes({}) == [kept]
            assert alive(procs[kept]) and not alive(procs[gone])
            assert c.get_lease(kept).state is LeaseState.ACTIVE
            assert c.get_lease(gone).state is LeaseState.REVOKED
            assert [k for _, k, _ in journal_kinds(server, seq)] == ["renew"]
            assert f"node {gone} (w), left by a previous provider: not adopted: its lease is " in (
                caplog.text
            )
            assert "revoked" in caplog.text
        finally:
            p.close()


@pytest.mark.parametrize("case", ["adoption off", "another cluster", "raylet dead"])
def test_a_new_provider_cleans_up_what_it_cannot_adopt(
    server: ServerThread, tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = provider_config(server, "ray", tmp_path)
    ((node, orphan),) = crashed_monitor(cfg, 1).items()
    assert alive(orphan)  # its node process and its lease outlive the monitor
    cluster, why = "t", ""
    if case == "adoption off":
        cfg["adopt_nodes"], why = False, "adoption is off (provider.adopt_nodes: false)"
    elif case == "another cluster":
        cluster, why = "other", "recorded by cluster 't', not 'other'"
    else:
        os.kill(orphan.pid, signal.SIGKILL)
        # The kill is delivered when the process next runs: wait until it is dead.
        until(lambda: not alive(orphan), 10, "the killed raylet to die")
        why = "its raylet is not running"
    with BrokerClient(server.address, server.tokens["ray"]) as c:
        assert c.get_lease(node).state is LeaseState.ACTIVE
        p = BursarNodeProvider(cfg, cluster)
        try:
            assert not alive(orphan)
            assert c.get_lease(node).state is LeaseState.RELEASED
            assert p.non_terminated_nodes({}) == []
            assert f"not adopted: {why}; cleaning up" in caplog.text, caplog.text
        finally:
            p.close()
    # Nothing of the dead provider's is left to clean up again.
    assert [f.name for f in (tmp_path / "ray-state").glob("nodes-*.json")] == []


# ---------------------------------------------------------------------- settings (pure)


def test_resources_map_to_lease_dimensions() -> None:
    rmap = {"CPU": "cpu", "GPU": "gpu", "memory": "mem_gb"}
    assert lease_size("w", {"CPU": 4, "GPU": 1, "memory": 8 * GIB, "x": 3}, rmap) == {
        "cpu": 4.0,
        "gpu": 1.0,
        "mem_gb": 8.0,
    }
    with pytest.raises(SettingsError, match=r"available_node_types\.w\.resources"):
        lease_size("w", {"bursar_node": 1}, rmap)
    assert node_settings("w", {"lease_size": {"gpu": 8}}).lease_size == {"gpu": 8.0}
    with pytest.raises(SettingsError, match=r"node_config.lease_size.tpu: unknown dimension"):
        node_settings("w", {"lease_size": {"tpu": 8}})
    with pytest.raises(SettingsError, match=r"w.node_config.instance_type: unknown key"):
        node_settings("w", {"instance_type": "m5.large"})
    assert raylet_labels({"k": "lease/7 x"}) == {"k": "lease-7-x"}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"campain": "x"}, r"provider.campain: unknown key"),
        ({"broker": None}, r"provider.broker: required"),
        ({"lease_class": "urgent"}, r"provider.lease_class: unknown value 'urgent'; allowed"),
        ({"resource_map": {"CPU": "cores"}}, r"provider.resource_map.CPU: unknown dimension"),
        ({"lease_duration_s": -1}, r"provider.lease_duration_s: must be positive"),
        ({"node_ip_range": "10.0.0.1-10.0.0.9"}, r"provider.node_ip_range: .* loopback"),
        ({"token_file": "/nonexistent/t"}, r"provider.token_file: cannot read"),
        ({"object_store_memory": 1000}, r"provider.object_store_memory: .* at least"),
        ({"adopt_nodes": "yes"}, r"provider.adopt_nodes: must be true or false, got 'yes'"),
        ({"drain_on_preempt": "yes"}, r"provider.drain_on_preempt: must be true or false"),
    ],
)
def test_bad_provider_settings_name_the_key(change: dict[str, Any], match: str) -> None:
    section = {"type": "external", "broker": "127.0.0.1:1", "campaign": "c", "token": "t"}
    section.update(change)
    if "token_file" in change:
        del section["token"]
    with pytest.raises(SettingsError, match=match):
        parse_settings(section, "c", env={})


def test_a_token_file_may_be_the_servers_token_table(tmp_path: Path) -> None:
    table = tmp_path / "tokens.json"
    table.write_text('{"c": "tok-c", "d": "tok-d"}')
    section = {"type": "external", "broker": "127.0.0.1:1", "campaign": "d"}
    assert parse_settings({**section, "token_file": str(table)}, "c", env={}).token == "tok-d"
    with pytest.raises(SettingsError, match=r"provider.token_file: .*'x'"):
        parse_settings({**section, "campaign": "x", "token_file": str(table)}, "c", env={})
    with pytest.raises(SettingsError, match=r"BURSAR_TOKEN"):
        parse_settings(section, "c", env={"BURSAR_TOKEN": "bad token\n"})


def test_the_head_is_found_on_the_monitors_command_line(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("head_node_type: ray.head.default\n")
    section = {"type": "external", "broker": "127.0.0.1:1"}
    argv = [
        "monitor.py",
        "--logs-dir=/x",
        "--gcs-address=10.0.0.1:6379",
        "--monitor-ip",
        "10.0.0.1",
        f"--autoscaling-config={cluster}",
    ]
    s = parse_settings(section, "c", env={"BURSAR_TOKEN": "tok"}, argv=argv)
    assert s.head_address == "10.0.0.1:6379" and s.head_ip == "10.0.0.1"
    assert s.head_node_type == "ray.head.default" and s.head_node_id == "head"
    assert s.token == "tok" and "tok" not in repr(s)
    bare = parse_settings(section, "c", env={}, argv=["python"])
    assert bare.head_address is None and bare.head_ip is None and bare.token is None


def test_the_head_is_listed_but_never_terminated(server: ServerThread, tmp_path: Path) -> None:
    # In the monitor, head_ip comes from its --monitor-ip; Ray's v1 autoscaler drops the
    # load metrics of addresses its provider does not list.
    p = make(server, "ray", tmp_path, head_ip="10.0.0.1", head_node_type="ray.head")
    try:
        assert p.non_terminated_nodes({}) == ["head"]
        assert p.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_WORKER}) == []
        tags = p.node_tags("head")
        assert tags[TAG_RAY_NODE_KIND] == "head" and tags[TAG_RAY_USER_NODE_TYPE] == "ray.head"
        assert p.internal_ip("head") == "10.0.0.1" and p.is_running("head")
        p.terminate_nodes(["head"])
        assert p.non_terminated_nodes({}) == ["head"] and not p.is_terminated("head")
    finally:
        p.close()


def test_node_config_may_size_the_lease_itself(server: ServerThread, tmp_path: Path) -> None:
    p = make(server, "ray", tmp_path)
    try:
        # create_node (no resources): only node_config.lease_size can size the lease.
        p.create_node({"lease_size": {"cpu": 2}, "lease_labels": {"k": "v"}}, worker_tags(), 1)
        (node,) = p.non_terminated_nodes({})
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            lease = c.get_lease(node)
            assert dict(lease.size) == {"cpu": 2.0} and lease.labels["k"] == "v"
        with pytest.raises(NodeLaunchException, match="bad node type"):
            p.create_node({}, worker_tags(), 1)
    finally:
        p.close()


def test_check_reports_what_rays_monitor_would_trip_over(
    server: ServerThread,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The example as shipped, where it is run: beside `bursar serve`'s state/tokens.json.
    (tmp_path / "run" / "state").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "run")
    (tmp_path / "run" / "state" / "tokens.json").write_text(
        json.dumps({"adaptive-sci": server.tokens["ray"], "backfill": server.tokens["hi"]})
    )
    assert check(EXAMPLE, broker=False) == []
    # Nodes that share the head's address need Ray's v1 to key them by node id.
    shared = yaml.safe_load(EXAMPLE.read_text())
    del shared["provider"]["use_node_id_as_ip"]
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump(shared))
    (problem,) = check(tmp_path / "shared.yaml", broker=False)
    assert "provider.use_node_id_as_ip: must be true" in problem
    shared["provider"]["node_ip_range"] = "127.0.0.2-127.0.0.9"  # or an address each
    (tmp_path / "shared.yaml").write_text(yaml.safe_dump(shared))
    assert check(tmp_path / "shared.yaml", broker=False) == []
    token = tmp_path / "token"
    token.write_text(server.tokens["ray"])
    good = cluster_yaml(
        tmp_path / "good.yaml", broker=server.address, token_file=token, state_dir=tmp_path
    )
    assert check(good) == []
    out = capsys.readouterr().out
    assert "cpu_worker: each node is a lease of {'cpu': 1.0, 'mem_gb': 1.0}" in out
    assert "you are campaign:ray, holding 0 leases" in out

    cfg = yaml.safe_load(good.read_text())
    del cfg["file_mounts"]
    cfg["provider"]["campain"] = "ray"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    problems = check(bad)
    assert any("file_mounts: missing" in p for p in problems), problems
    assert any("provider.campain: unknown key" in p for p in problems), problems

    cfg = yaml.safe_load(good.read_text())
    cfg["provider"]["token_file"] = str(tmp_path / "wrong")
    (tmp_path / "wrong").write_text("not-a-token")
    bad.write_text(yaml.safe_dump(cfg))
    (problem,) = check(bad)
    assert f"provider.broker {server.address}" in problem and "INVALID_TOKEN" in problem


def test_a_node_that_cannot_be_created_leaves_no_lease_behind(
    server: ServerThread, tmp_path: Path
) -> None:
    # One address for the nodes' raylets: the second node cannot have one. Its lease must
    # not be left active and renewed where Ray can never terminate it.
    p = make(server, "ray", tmp_path, node_ip_range="127.0.0.2-127.0.0.2")
    try:
        (first,) = create(p)
        with pytest.raises(NodeLaunchException, match="node_ip_range"):
            create(p)
        assert p.non_terminated_nodes({}) == [first]
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            assert [lease.id for lease in c.list_leases()] == [first]
    finally:
        p.close()
    with BrokerClient(server.address, server.tokens["ray"]) as c:
        assert c.list_leases() == []


# ---------------------------------------------------------------------- the head, and stopping


def test_ray_up_is_refused_at_once_with_the_documented_command(tmp_path: Path) -> None:
    # Ray's own CLI on the shipped example: refused before it asks anything, in one line.
    ray = Path(sys.executable).parent / "ray"
    out = subprocess.run(
        [str(ray), "up", "examples/ray-cluster.yaml", "-y", "--no-config-cache"],
        cwd=EXAMPLE.parents[1],
        env={**os.environ, "BURSAR_TOKEN": "tok"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    command = (
        "python -m bursar.providers.ray start --head --num-cpus=0 "
        "--autoscaling-config=examples/ray-cluster.yaml"
    )
    assert out.returncode != 0
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("Error:")]
    assert f"`{command}`" in line, out.stderr
    assert "Traceback" not in out.stderr and "bad node type" not in out.stderr
    # What users are told: the example's header (the docs quote the example).
    header = EXAMPLE.read_text().split("\ncluster_name:")[0]
    assert f"#   {command}\n" in header


def test_the_head_is_never_launched_as_a_lease(server: ServerThread, tmp_path: Path) -> None:
    cfg = yaml.safe_load(EXAMPLE.read_text())
    # The example's provider section, made local (this broker, fake raylets).
    local = provider_config(server, "ray", tmp_path)
    keys = ("broker", "campaign", "token", "state_dir", "node_command", "head_address")
    section = {**cfg["provider"], **{k: local[k] for k in keys}}
    del section["token_file"]  # the test's token instead
    p = BursarNodeProvider(section, cfg["cluster_name"])
    head = cfg["available_node_types"][cfg["head_node_type"]]
    try:
        # What `ray up` asks for (the head's tags, create_node without resources)...
        head_tags = {
            TAG_RAY_NODE_KIND: NODE_KIND_HEAD,
            TAG_RAY_USER_NODE_TYPE: cfg["head_node_type"],
            TAG_RAY_NODE_STATUS: STATUS_UNINITIALIZED,
        }
        with pytest.raises(NodeLaunchException) as info:
            p.create_node(head["node_config"], head_tags, 1)
        # ...and a launch of the head's type, which holds no leasable resource.
        with pytest.raises(NodeLaunchException) as info2:
            p.create_node_with_resources_and_labels(
                head["node_config"],
                {**worker_tags(), TAG_RAY_USER_NODE_TYPE: cfg["head_node_type"]},
                1,
                head["resources"],
                {},
            )
        for exc in (info.value, info2.value):
            assert exc.category == "head node"
            assert "--autoscaling-config=" in exc.description and "\n" not in exc.description
            assert "holds none of" not in exc.description
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            assert c.list_leases() == []
        (node,) = create(p)  # the workers are leased as ever
        assert p.node_tags(node)[TAG_RAY_USER_NODE_TYPE] == "cpu_worker"
    finally:
        p.close()


# Ray's monitor with two nodes, waiting to be stopped. v1's monitor handles SIGTERM itself
# (Monitor._signal_handler, installed here as Ray's Monitor.run does); v2's does not.
STOPPED_MONITOR = """
import json, logging, signal, sys, time
logging.basicConfig(level=logging.INFO)
if sys.argv[2] == "v1":
    from ray.autoscaler._private.monitor import Monitor
    m = Monitor.__new__(Monitor)
    m.autoscaler, m.gcs_client = None, None
    signal.signal(signal.SIGTERM, m._signal_handler)
from bursar.providers.ray import BursarNodeProvider
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE
p = BursarNodeProvider(json.loads(sys.argv[1]), "t")
for _ in range(2):
    p.create_node_with_resources_and_labels({}, {TAG_RAY_USER_NODE_TYPE: "w"}, 1, {"CPU": 1}, {})
nodes = p.non_terminated_nodes({})
while any(p.raylet_pid(n) is None for n in nodes):
    time.sleep(0.05)
print(" ".join(f"{n}:{p.raylet_pid(n)}" for n in nodes), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("autoscaler", ["v1", "v2"])
def test_stopping_the_monitor_releases_its_leases(
    server: ServerThread, tmp_path: Path, autoscaler: str
) -> None:
    cfg = provider_config(server, "ray", tmp_path)
    # Ray starts its monitor as .../ray/autoscaler/[v2/]monitor.py.
    script = tmp_path / "ray" / "autoscaler" / autoscaler / "monitor.py"
    script.parent.mkdir(parents=True)
    script.write_text(STOPPED_MONITOR)
    monitor = subprocess.Popen(
        [sys.executable, str(script), json.dumps(cfg), autoscaler],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert monitor.stdout is not None
        nodes = dict(pair.split(":") for pair in monitor.stdout.readline().split())
        assert len(nodes) == 2, nodes
        procs = [Proc(int(pid), proc_start(int(pid)) or 0) for pid in nodes.values()]
        with BrokerClient(server.address, server.tokens["ray"]) as c:
            assert {c.get_lease(n).state for n in nodes} == {LeaseState.ACTIVE}
        monitor.send_signal(signal.SIGTERM)  # what `ray stop` does
        _, err = monitor.communicate(timeout=30)
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait()
    assert monitor.returncode == 128 + signal.SIGTERM, err
    assert "stopping: releasing 2 leases" in err, err
    with BrokerClient(server.address, server.tokens["ray"]) as c:
        assert {c.get_lease(n).state for n in nodes} == {LeaseState.RELEASED}
    assert not any(alive(proc) for proc in procs)
    assert list((tmp_path / "ray-state").glob("nodes-*.json")) == []  # nothing left to clean
