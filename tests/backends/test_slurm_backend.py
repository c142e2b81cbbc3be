"""The Slurm pool backend against a real Slurm cluster (scripts/slurm-cluster.sh): leases
become allocations on exactly the engine's nodes, and everything Slurm does behind the
broker's back comes back to the engine as an event. Plus the pure parts (config, parsing,
launch lines, the engine's LeaseLost) that need no cluster."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from client_support import until
from slurm_support import (
    CAMPAIGNS,
    job_prefix_fixture,  # noqa: F401  (fixtures: job_prefix, slurm_cluster)
    job_state,
    jobs_named,
    prefix,
    salloc,
    slurm_backend,
    slurm_cluster_fixture,  # noqa: F401
    slurm_config,
    squeue,
)

from bursar.broker.backends.slurm import SlurmPool, discover_pool, gres_count, gres_indices
from bursar.broker.codec import decode_event
from bursar.broker.config import parse_config
from bursar.broker.decisions import Decision, Granted, PreemptWarned, Revoked
from bursar.broker.errors import ConfigError, RequestError
from bursar.broker.events import Event, LeaseLost, NodeLost, Release, RequestLease
from bursar.broker.pool import NodeState
from bursar.broker.runtime import Runtime
from bursar.providers.launch import launch_argv

# ------------------------------------------------------------------------------ no cluster


def test_gres_strings_are_read_without_guessing() -> None:
    assert gres_count("gpu:8", "gpu") == 8
    assert gres_count("gpu:a100:4(S:0-1),gpu:v100:2,nic:1", "gpu") == 6
    assert gres_count("(null)", "gpu") == 0
    assert gres_indices("gpu:3(IDX:0-1,5)", "gpu") == "0,1,5"
    assert gres_indices("", "gpu") == ""


def test_launch_line_is_srun_inside_the_allocation_only_on_slurm() -> None:
    assert launch_argv({}, ["w", "-x"]) == ["w", "-x"]
    one = {"backend": "slurm", "job_id": "12", "het_groups": "1", "node_count": "1"}
    assert launch_argv(one, ["w"]) == [
        "srun", "--jobid=12", "--overlap", "--quiet",
        "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "w",
    ]  # fmt: skip
    two = {**one, "node_count": "2"}
    assert launch_argv(two, ["w"])[4:7] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    het = {"backend": "slurm", "job_id": "7", "het_groups": "3"}
    assert launch_argv(het, ["w"])[:5] == [
        "srun", "--jobid=7", "--overlap", "--quiet", "--het-group=0-2",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="argv is empty"):
        launch_argv(one, [])


def test_engine_revokes_a_lost_lease_with_the_backends_reason() -> None:
    from conftest import build_engine, gpu_campaign

    eng = build_engine(campaigns=[gpu_campaign("a", sustained=8, burst=16)])
    (grant,) = [
        d for d in eng.apply(RequestLease(1, "a", {"gpu": 4}, 60)) if isinstance(d, Granted)
    ]
    (rev,) = eng.apply(LeaseLost(2, grant.lease_id, "slurm job 9 CANCELLED outside the broker"))
    assert isinstance(rev, Revoked) and rev.cause == "slurm job 9 CANCELLED outside the broker"
    assert eng.apply(LeaseLost(3, grant.lease_id, "again")) == []  # already over: no-op
    with pytest.raises(RequestError, match="cause"):
        eng.apply(LeaseLost(4, grant.lease_id, ""))


def test_slurm_config_errors_name_file_key_and_allowed_values() -> None:
    def discover(_s: object) -> object:
        raise AssertionError("not reached")

    bad = [
        ("[slurm]\npoll_interval_s = 0\n", "slurm.poll_interval_s", "numbers > 0"),
        ('[slurm]\nwarn_signal = "KILL"\n', "slurm.warn_signal", "allowed: none, TERM"),
        ('[slurm]\nqueue = "x"\n', "slurm.queue", "allowed: partition, job_prefix"),
        ("[pool.groups.n]\ncount = 1\n[slurm]\n", "pool.groups", "discovers the nodes"),
        ("[policy]\npower_down_idle_s = 60\n", "policy.power_down_idle_s", "allowed: leave"),
    ]
    for text, key, hint in bad:
        with pytest.raises(ConfigError) as e:
            parse_config(text, "toml", source="site.toml", discover=discover)  # type: ignore[arg-type]
        assert e.value.key == key and hint in str(e.value) and "site.toml" in str(e.value)


# ------------------------------------------------------------------------------ real cluster


def on_slurm(f: Callable[..., None]) -> Callable[..., None]:
    """A slow test on the session's Slurm cluster."""
    return pytest.mark.slow(pytest.mark.usefixtures("slurm_cluster")(f))


def open_broker(tmp_path: Path, pre: str, **kw: object) -> tuple[Runtime, SlurmPool]:
    cfg = slurm_config(pre, **kw)  # type: ignore[arg-type]
    pool = slurm_backend(cfg)
    return Runtime.open(tmp_path / "state", cfg, pool, at=time.time()), pool


def grant_of(decisions: list[Decision]) -> Granted:
    (g,) = [d for d in decisions if isinstance(d, Granted)]
    return g


def request(b: Runtime, campaign: str, size: dict[str, float], duration_s: float = 600) -> Granted:
    return grant_of(b.submit(RequestLease(time.time(), campaign, size, duration_s)))


def poll(b: Runtime) -> list[Decision]:
    return b.catch_up(time.time())


@on_slurm
def test_pool_is_discovered_from_slurm() -> None:
    cfg = slurm_config(prefix())
    (group,) = cfg.pool.groups
    assert (group.count, dict(group.resources)) == (4, {"gpu": 8.0, "cpu": 32.0, "mem_gb": 125.0})
    assert cfg.policy.power_down_idle_s is None  # Slurm powers its own nodes
    with pytest.raises(ConfigError) as e:
        text = '[slurm]\npartition = "gpu"\n' + CAMPAIGNS
        parse_config(text, "toml", source="site.toml", discover=discover_pool)
    assert e.value.key == "slurm.partition" and "allowed: debug" in str(e.value)


@on_slurm
def test_lease_life_cycle_maps_to_allocations(tmp_path: Path, job_prefix: str) -> None:
    pre = job_prefix
    b, pool = open_broker(tmp_path, pre)
    # 12 GPUs and 12 CPUs: every piece keeps one CPU per GPU on its node, 8 + 8 on one
    # node and 4 + 4 on the next; Slurm gets a heterogeneous job with exactly those pieces.
    g = request(b, "sci", {"gpu": 12, "cpu": 12})
    assert g.nodes == ("slurm000", "slurm001")
    assert g.pieces == {"slurm000": {"gpu": 8, "cpu": 8}, "slurm001": {"gpu": 4, "cpu": 4}}
    alloc = pool.allocation(g.lease_id)
    assert alloc is not None and alloc["nodes"] == "node1,node2" and alloc["het_groups"] == "2"
    assert alloc["gpus.node1"] == "0,1,2,3,4,5,6,7" and alloc["gpus.node2"] == "0,1,2,3"
    comps = sorted(jobs_named(f"{pre}-{g.lease_id}"), key=lambda j: j["het_job_offset"])
    assert [(j["nodes"], j["cpus"], j["gres_detail"]) for j in comps] == [
        ("node1", 8, ["gpu:8(IDX:0-7)"]),
        ("node2", 4, ["gpu:4(IDX:0-3)"]),
    ]
    # A worker started with launch_argv runs inside the allocation, on both nodes.
    out = subprocess.run(
        launch_argv(alloc, ["bash", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"']),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert sorted(out.stdout.split("\n")[:2]) == ["node1 0,1,2,3,4,5,6,7", "node2 0,1,2,3"]
    # Release cancels it.
    job = int(alloc["job_id"])
    b.submit(Release(time.time(), g.lease_id))
    assert pool.allocation(g.lease_id) == {}
    until(lambda: job_state(job) != "RUNNING", 10, "the released allocation to end")
    # Expiry cancels it too.
    e = request(b, "sci", {"gpu": 2}, duration_s=0.5)
    ejob = int(pool.allocation(e.lease_id)["job_id"])  # type: ignore[index]
    b.catch_up(time.time() + 0.6)  # past its end: the runtime takes time from the test
    assert e.lease_id in b.engine.ended
    until(lambda: job_state(ejob) != "RUNNING", 10, "the expired allocation to end")
    b.close()


@on_slurm
def test_revocation_signals_then_cancels_and_the_claimant_gets_the_nodes(
    tmp_path: Path, job_prefix: str
) -> None:
    pre = job_prefix
    b, pool = open_broker(tmp_path, pre, grace_s=1.5, extra='warn_signal = "USR1"')
    # Preemptible: every GPU but the 8 kept for sci's unmet guarantee.
    fill = request(b, "fill", {"gpu": 24})
    alloc = pool.allocation(fill.lease_id)
    # Equal pieces (8 GPUs on each of three nodes): one plain job, scheduled inline.
    assert alloc is not None and (alloc["het_groups"], alloc["node_count"]) == ("1", "3")
    assert alloc["nodes"] == "node1,node2,node3" and alloc["gpus.node3"] == "0,1,2,3,4,5,6,7"
    started, flag = tmp_path / "started", tmp_path / "warned"
    # A worker on each node that records SIGUSR1 (the warning), then waits to be cancelled.
    script = f"trap 'touch {flag}' USR1; touch {started}; while true; do sleep 0.1; done"
    step = subprocess.Popen(launch_argv(alloc, ["bash", "-c", script]))
    until(started.exists, 10, "the workers to start")
    t0 = time.time()
    ds = b.submit(RequestLease(t0, "sci", {"gpu": 16}, 600))
    (warn,) = [d for d in ds if isinstance(d, PreemptWarned)]
    assert warn.lease_id == fill.lease_id
    until(flag.exists, 10, "the step to get SIGUSR1 at the warning")
    assert job_state(int(alloc["job_id"])) == "RUNNING"  # still held during the grace period
    until(lambda: (poll(b), fill.lease_id in b.engine.ended)[1], 10, "the revocation")
    assert time.time() - t0 >= 1.5
    until(lambda: job_state(int(alloc["job_id"])) != "RUNNING", 10, "the revoked job to end")
    step.kill()  # srun itself would wait out Slurm's KillWait
    step.wait(15)
    # The claimant is active on the reclaimed GPUs, with an allocation of its own.
    (sci,) = [ls for ls in b.engine.leases.values() if ls.campaign == "sci"]
    sci_alloc = pool.allocation(sci.id)
    assert sci_alloc is not None and job_state(int(sci_alloc["job_id"])) == "RUNNING"
    b.close()


@on_slurm
def test_what_slurm_does_behind_the_brokers_back_ends_leases(
    tmp_path: Path, job_prefix: str
) -> None:
    pre = job_prefix
    b, pool = open_broker(tmp_path, pre, allocate_timeout_s=1)
    a = request(b, "sci", {"gpu": 4})
    c = request(b, "sci", {"gpu": 4, "cpu": 2})
    ja = int(pool.allocation(a.lease_id)["job_id"])  # type: ignore[index]
    c_job = pool.allocation(c.lease_id)["job_id"]  # type: ignore[index]
    # An admin cancels one allocation: its lease ends as revoked, with Slurm's reason.
    subprocess.run(["scancel", str(ja)], check=True)
    revoked = until(
        lambda: [d for d in poll(b) if isinstance(d, Revoked) and d.lease_id == a.lease_id],
        10,
        "the lease of the cancelled allocation to end",
    )
    assert revoked[0].cause == f"slurm job {ja} ended outside the broker (CANCELLED)"
    assert c.lease_id in b.engine.leases  # the other one is untouched
    # An admin drains a node: the engine hears NodeLost and revokes what is on it; the node
    # comes back (NodeReady) when it is resumed.
    node, i = pool.slurm_node(c.nodes[0]), b.engine.pool.index[c.nodes[0]]
    scontrol = ["scontrol", "update", f"nodename={node}"]
    subprocess.run([*scontrol, "state=drain", "reason=bursar-test"], check=True)
    try:
        until(lambda: (poll(b), c.lease_id in b.engine.ended)[1], 10, "the node loss")
        lost = [e for e in _journal_events(b) if isinstance(e, NodeLost)]
        assert [e.node for e in lost] == [c.nodes[0]]
        assert b.engine.pool.nodes[i].power is NodeState.DOWN
        until(lambda: job_state(int(c_job)) != "RUNNING", 10, "the drained node's job to end")
    finally:
        subprocess.run([*scontrol, "state=resume"], check=True)
    until(lambda: (poll(b), b.engine.pool.nodes[i].power is NodeState.ON)[1], 10, "node back")
    # An allocation the broker cannot make ends the lease at once, with Slurm's answer.
    hog = salloc(f"other-{pre}", "-w", "node3,node4", "-N2", "--gres=gpu:8")
    try:
        big = request(b, "sci", {"gpu": 24})
        (rev,) = [d for d in poll(b) if isinstance(d, Revoked)]
        assert rev.lease_id == big.lease_id and rev.cause.startswith("slurm: salloc")
    finally:
        subprocess.run(["scancel", str(hog)], check=True)
    b.close()


def _journal_events(b: Runtime) -> list[Event]:
    return [decode_event(ev) for _, ev, _ in b.journal.raw_entries()]


@on_slurm
def test_orphans_are_cancelled_and_a_fresh_broker_leaves_other_prefixes_alone(
    tmp_path: Path, job_prefix: str
) -> None:
    pre, other = job_prefix, prefix()
    orphan = salloc(f"{pre}-L41", "-w", "node4", "-c", "1")
    foreign = salloc(f"{other}-L1", "-w", "node4", "-c", "1")
    b, pool = open_broker(tmp_path, pre)
    assert pool.orphans_cancelled == [orphan]
    until(lambda: job_state(orphan) != "RUNNING", 10, "the orphan to be cancelled")
    assert job_state(foreign) == "RUNNING"
    subprocess.run(["scancel", str(foreign)], check=True)
    assert not [j for j in squeue() if j["name"].startswith(pre) and j["job_state"] == "RUNNING"]
    b.close()
