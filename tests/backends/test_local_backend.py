"""The local backend on this machine's real CPUs: leases on concrete devices, workers pinned
through ``launch_argv``, their end within the kill grace, and what the poll notices."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from local_support import (
    BUSY,
    STUBBORN,
    cpus_allowed,
    environ,
    exec_done,
    ignores_term,
    local_pool,
    nproc,
    start,
    until,
)

from bursar.broker.backends.base import apply_decision
from bursar.broker.backends.local import LocalPool, LocalSettings, lease_processes
from bursar.broker.backends.local_discovery import (
    CgroupProbe,
    Gpu,
    NodeDevices,
    layout_nodes,
    probe_cgroup,
    read_machine,
)
from bursar.broker.decisions import Revoked
from bursar.providers.launch import launch_argv, local_env

TWO = pytest.mark.skipif(nproc() < 2, reason="needs 2 CPUs in this process's affinity")

GPUS = tuple(Gpu(i, f"GPU-{i:04d}", 81559) for i in range(4))


def gpu_pool(tmp_path: Path) -> LocalPool:
    node = NodeDevices("local000", (0, 1, 2, 3), GPUS, 64.0)
    return LocalPool(
        [node], LocalSettings(run_dir=tmp_path / "run"), cgroup=CgroupProbe(None, "plan")
    )


def test_placement_is_deterministic_on_free_devices_and_given_back(tmp_path: Path) -> None:
    pool = gpu_pool(tmp_path)
    pool.place("L1", ["local000"], 0.0, {"local000": {"cpu": 2, "gpu": 1, "mem_gb": 4}})
    pool.place("L2", ["local000"], 0.0, {"local000": {"cpu": 1, "gpu": 2}})
    a1, a2 = pool.allocation("L1"), pool.allocation("L2")
    assert (a1["backend"], a1["cpus"], a1["gpus"]) == ("local", "0-1", "GPU-0000")
    assert (a2["cpus"], a2["gpus"], a2["gpu_indices"]) == ("2", "GPU-0001,GPU-0002", "1,2")
    assert a1["mem_bytes"] == str(4 * 2**30) and a1["cgroup_mode"] == "plan"
    assert "cgroup" not in a1  # plan mode: no cgroup made, only logged
    assert any("cpuset.cpus" in p and p.startswith("echo 0-1") for p in pool.plan)
    pool.unplace("L1", 1.0)
    assert pool.allocation("L1") == {}
    # What L1 gave back is what the next lease gets, lowest ids first.
    pool.place("L3", ["local000"], 2.0, {"local000": {"cpu": 3, "gpu": 2}})
    assert pool.devices("L3")[0] == [0, 1, 3]
    assert [g.index for g in pool.devices("L3")[1]] == [0, 3]
    # The worker's environment: the GPUs' UUIDs, thread counts = its CPUs.
    env = local_env(pool.allocation("L3"))
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0000,GPU-0003"
    assert env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    pool.place("L4", ["local000"], 3.0, {"local000": {"cpu": 0.5}})
    assert local_env(pool.allocation("L4"))["CUDA_VISIBLE_DEVICES"] == ""


def test_fractional_pieces_share_the_least_held_cpu_and_resize_keeps_what_it_has(
    tmp_path: Path,
) -> None:
    pool = gpu_pool(tmp_path)
    pool.place("A", ["local000"], 0.0, {"local000": {"cpu": 3.5}})
    pool.place("B", ["local000"], 0.0, {"local000": {"cpu": 0.5}})
    assert pool.devices("A")[0] == [0, 1, 2, 3] and pool.devices("B")[0] == [0]
    pool.unplace("B", 0.0)
    pool.resize("A", ["local000"], 1.0, {"local000": {"cpu": 2}})
    assert pool.devices("A")[0] == [0, 1]
    pool.place("C", ["local000"], 1.0, {"local000": {"cpu": 2}})
    assert pool.devices("C")[0] == [2, 3]


def test_a_worker_for_a_lease_that_is_not_placed_does_not_start(tmp_path: Path) -> None:
    pool = local_pool(tmp_path / "run")
    pool.place("L1", ["local000"], 0.0, {"local000": {"cpu": 1}})
    alloc = dict(pool.allocation("L1"))
    pool.unplace("L1", 1.0)
    p = start(alloc, ["true"])
    assert p.wait(10) == 75


@TWO
def test_two_one_core_leases_each_run_on_their_own_core_and_revocation_ends_them(
    tmp_path: Path,
) -> None:
    pool = local_pool(tmp_path / "run", grace_s=1.0)
    procs = []
    try:
        for lid in ("L1", "L2"):
            pool.place(lid, ["local000"], 0.0, {"local000": {"cpu": 1}})
        cores = [pool.devices(lid)[0] for lid in ("L1", "L2")]
        assert cores[0] != cores[1] and all(len(c) == 1 for c in cores)
        for lid in ("L1", "L2"):
            procs.append(start(pool.allocation(lid), BUSY))
        procs.append(start(pool.allocation("L1"), STUBBORN))
        for p in procs:
            until(lambda p=p: exec_done(p), 10, "the wrapper to exec the worker")
        # Exec'd is not yet trapped: a TERM before bash runs `trap '' TERM` would end it.
        until(lambda: ignores_term(procs[2].pid), 10, "the stubborn worker to ignore TERM")
        for p, core in zip(procs, [cores[0], cores[1], cores[0]], strict=True):
            assert cpus_allowed(p.pid) == core
            assert environ(p.pid)["OMP_NUM_THREADS"] == "1"
        assert sorted(lease_processes(pool.run_dir, "L1")) == sorted([procs[0].pid, procs[2].pid])
        # Revocation: SIGTERM, then SIGKILL after the grace for the one that ignores it.
        t0 = time.monotonic()
        apply_decision(
            pool,
            Revoked(
                at=2.0,
                lease_id="L1",
                campaign="fill",
                cause="preempted",
                refund_tokens=0.0,
                refund_credits=0.0,
            ),
        )
        assert procs[0].wait(5) == -signal.SIGTERM
        assert procs[2].wait(5) == -signal.SIGKILL
        took = time.monotonic() - t0
        assert 1.0 <= took < 3.0, took
        assert procs[1].poll() is None  # the other lease's worker runs on
        assert pool.wait_reaped(5)
        assert not (pool.run_dir / "leases" / "L1").exists()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_poll_notices_workers_that_exited_and_a_process_that_escaped(
    tmp_path: Path,
) -> None:
    pool = local_pool(tmp_path / "run")
    pool.place("L1", ["local000"], 0.0, {"local000": {"cpu": 1}})
    alloc = pool.allocation("L1")
    assert start(alloc, ["true"]).wait(10) == 0
    assert pool.due_events(1.0) == []
    assert pool.exited == ["L1"]  # logged once; the lease stays placed
    assert pool.allocation("L1")["cpus"]
    pool.due_events(2.0)
    assert pool.exited == ["L1"]
    if nproc() < 2:
        pytest.skip("an escape needs a CPU outside the lease")
    everything = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    escape = (
        f"import os,time; os.sched_setaffinity(0, {{{everything}}}); "
        "open(os.environ['MARK'], 'w').close(); time.sleep(30)"
    )
    mark = tmp_path / "escaped"
    os.environ["MARK"] = str(mark)
    try:
        p = start(alloc, [sys.executable, "-c", escape])
    finally:
        del os.environ["MARK"]
    try:
        until(mark.exists, 10, "the worker to widen its affinity")
        pool.due_events(3.0)
        assert [(lid, pid) for lid, pid, _ in pool.escapes] == [("L1", p.pid)]
        assert "outside the lease" in pool.escapes[0][2]
        pool.unplace("L1", 4.0)
        assert p.wait(5) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()


def test_a_restart_adopts_the_leases_it_holds_and_ends_the_workers_of_others(
    tmp_path: Path,
) -> None:
    pool = local_pool(tmp_path / "run")
    pool.place("L1", ["local000"], 0.0, {"local000": {"cpu": 1}})
    pool.place("L2", ["local000"], 0.0, {"local000": {"cpu": 1}})
    cpus = pool.devices("L1")[0]
    procs = [start(pool.allocation(lid), BUSY) for lid in ("L1", "L2")]
    try:
        for p in procs:
            until(lambda p=p: exec_done(p), 10, "exec")
        # A new broker on the same run directory; the journal holds only L1 (and L3, whose
        # record is gone).
        again = local_pool(tmp_path / "run")
        from bursar.broker.backends.base import NodeState

        again.adopt(
            {"local000": (NodeState.ON, None)}, {"L1": ("local000",), "L3": ("local000",)}, 5.0
        )
        assert again.devices("L1")[0] == cpus
        assert procs[1].wait(5) == -signal.SIGTERM
        assert procs[0].poll() is None
        (lost,) = again.due_events(5.0)
        assert lost.lease_id == "L3" and "record is gone" in lost.cause
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.skipif(
    probe_cgroup().mode != "cgroup", reason=f"no cgroup delegation: {probe_cgroup().reason}"
)
def test_cgroup_limits_where_delegation_is_possible(tmp_path: Path) -> None:
    nodes = layout_nodes(read_machine(gpus=False), split_numa=False)
    pool = LocalPool(nodes, LocalSettings(run_dir=tmp_path / "run"), cgroup=probe_cgroup())
    pool.place("L1", ["local000"], 0.0, {"local000": {"cpu": 1, "mem_gb": 0.25}})
    alloc = pool.allocation("L1")
    cg = Path(alloc["cgroup"])
    assert (cg / "cpuset.cpus").read_text().strip() == alloc["cpus"]
    assert int((cg / "memory.max").read_text()) == 2**28
    p = start(alloc, BUSY)
    try:
        until(lambda: exec_done(p), 10, "exec")
        assert str(p.pid) in (cg / "cgroup.procs").read_text().split()
        pool.unplace("L1", 1.0)
        p.wait(10)
        assert pool.wait_reaped(10) and not cg.exists()
    finally:
        if p.poll() is None:
            p.kill()


def test_launch_argv_wraps_a_local_lease() -> None:
    alloc = {"backend": "local", "lease_id": "L7", "run_dir": "/run/x", "cpus": "0"}
    argv = launch_argv(alloc, ["worker", "--x"])
    assert argv[1:] == [
        "-m",
        "bursar.providers.local_exec",
        "--run-dir",
        "/run/x",
        "--lease",
        "L7",
        "--",
        "worker",
        "--x",
    ]
    assert launch_argv({}, ["worker"]) == ["worker"]
    assert local_env({}) == {}


@TWO
def test_bench_local_prints_the_interference_ratios() -> None:
    import subprocess

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "benchmarks/bench_local.py", "--repeat", "1", "--seconds", "0.4"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "interference ratio" in out and "unenforced median" in out and "enforced median" in out


def test_a_worker_that_clears_its_environment_is_still_found_through_its_ancestry(
    tmp_path: Path,
) -> None:
    pool = local_pool(tmp_path / "run")
    pool.place("L1", ["local000"], 0.0, {"local000": {"cpu": 1}})
    child = tmp_path / "child.pid"
    p = start(pool.allocation("L1"), ["bash", "-c", f"env -i sleep 30 & echo $! > {child}; wait"])
    try:
        until(child.exists, 10, "the child to start")
        until(lambda: child.read_text().strip(), 10, "its pid")
        pid = int(child.read_text())
        # $! names the forked shell before it has run `env -i` and `sleep`: look at its
        # environment once it is sleep (on a busy machine the exec can come late).
        until(lambda: Path(f"/proc/{pid}/comm").read_text().strip() == "sleep", 10, "the exec")
        assert "BURSAR_LEASE_ID" not in environ(pid)
        pool.unplace("L1", 1.0)
        until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 5, "the child to end")
        p.wait(5)
    finally:
        if p.poll() is None:
            p.kill()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4), st.integers(0, 2)), max_size=30))
def test_whole_pieces_within_capacity_never_share_a_device(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[bool, int, int]]
) -> None:
    pool = LocalPool(
        [NodeDevices("local000", tuple(range(8)), GPUS, 64.0)],
        LocalSettings(run_dir=tmp_path_factory.mktemp("run")),
        cgroup=CgroupProbe(None, "plan"),
    )
    held: dict[str, tuple[int, int]] = {}
    for k, (add, cpus, gpus) in enumerate(ops):
        if add:
            used_c = sum(c for c, _ in held.values())
            used_g = sum(g for _, g in held.values())
            if used_c + cpus > 8 or used_g + gpus > 4:
                continue  # the engine places only what fits
            lid = f"L{k}"
            pool.place(lid, ["local000"], float(k), {"local000": {"cpu": cpus, "gpu": gpus}})
            held[lid] = (cpus, gpus)
        elif held:
            lid = sorted(held)[0]
            pool.unplace(lid, float(k))
            del held[lid]
        seen_c: list[int] = []
        seen_g: list[int] = []
        for lid, (cpus_n, gpus_n) in held.items():
            c, g = pool.devices(lid)
            assert len(c) == cpus_n and len(g) == gpus_n
            seen_c += c
            seen_g += [x.index for x in g]
        assert len(seen_c) == len(set(seen_c)) and len(seen_g) == len(set(seen_g))


def test_a_lease_over_two_numa_nodes_runs_on_the_cpus_of_both(tmp_path: Path) -> None:
    nodes = [
        NodeDevices("local000", (0, 1, 2, 3), GPUS[:2], 32.0),
        NodeDevices("local001", (4, 5, 6, 7), GPUS[2:], 32.0),
    ]
    pool = LocalPool(nodes, LocalSettings(run_dir=tmp_path / "run"), cgroup=CgroupProbe(None, "p"))
    pieces = {"local000": {"cpu": 2, "gpu": 1}, "local001": {"cpu": 4, "gpu": 2}}
    pool.place("L1", ["local000", "local001"], 0.0, pieces)
    a = pool.allocation("L1")
    assert (a["nodes"], a["cpus"], a["cpu_count"]) == ("local000,local001", "0-1,4-7", "6")
    assert a["gpu_indices"] == "0,2,3"
    assert dict(pool.placements()) == {"L1": ("local000", "local001")}
