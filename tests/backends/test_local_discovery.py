"""Discovery for the local backend: pure parsers over recorded kernel and nvidia-smi text,
the pool it makes (one node, or one per NUMA domain), and the real tools where present."""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bursar.broker.backends.local_discovery import (
    format_cpulist,
    gpu_query,
    layout_nodes,
    machine_from_text,
    parse_cgroup_path,
    parse_cpu_max,
    parse_cpulist,
    parse_meminfo,
    parse_memory_max,
    parse_nvidia_smi,
    pool_spec,
    probe_cgroup,
    read_machine,
)

MEMINFO = "MemTotal:       65536000 kB\nMemFree:        1000 kB\n"

# A DGX-style answer, recorded from nvidia-smi (UUIDs shortened by hand).
NVIDIA_SMI = """0, GPU-5f3c1e2a-aaaa-bbbb-cccc-000000000000, 81559
1, GPU-77e0d9b1-aaaa-bbbb-cccc-111111111111, 81559
3, GPU-a0b1c2d3-aaaa-bbbb-cccc-333333333333, 81559
2, GPU-0c9f8e7d-aaaa-bbbb-cccc-222222222222, 81559
"""


@given(st.sets(st.integers(0, 300)))
def test_cpulist_round_trips(cpus: set[int]) -> None:
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == sorted(cpus)
    # The list form is as short as the kernel writes it: no two ranges touch.
    assert ",," not in text and text.count("-") <= len(cpus) // 2


def test_kernel_formats() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([8, 0, 1, 2, 3]) == "0-3,8"
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("250000 100000") == 2.5
    assert parse_memory_max("max\n") is None
    assert parse_memory_max("4294967296\n") == 2**32
    assert parse_meminfo(MEMINFO) == 65536000 * 1024
    assert parse_cgroup_path("0::/user.slice/agent.scope\n") == "/user.slice/agent.scope"
    assert parse_cgroup_path("4:memory:/x\n1:cpu:/\n") is None  # cgroup v1 only


def test_gpus_from_a_recorded_nvidia_smi_answer() -> None:
    gpus = parse_nvidia_smi(NVIDIA_SMI)
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[2].uuid == "GPU-0c9f8e7d-aaaa-bbbb-cccc-222222222222"
    assert {g.memory_mb for g in gpus} == {81559}
    m = machine_from_text(range(8), MEMINFO, nvidia_smi=NVIDIA_SMI)
    (node,) = layout_nodes(m)
    spec = pool_spec([node])
    assert spec.groups[0].resources["gpu"] == 4.0
    # No tool or no answer: zero GPUs, no placeholder.
    assert machine_from_text(range(8), MEMINFO, nvidia_smi=None).gpus == ()
    assert machine_from_text(range(8), MEMINFO, nvidia_smi="").gpus == ()


def test_cpus_are_the_affinity_within_the_cgroup_limits() -> None:
    m = machine_from_text(
        [0, 1, 2, 3, 4, 5, 6, 7],
        MEMINFO,
        cpuset="2-7",
        cpu_max="350000 100000",  # 3.5 CPUs of quota: 3 whole CPUs are leased
        memory_max="1073741824",
    )
    assert m.cpus == (2, 3, 4)
    assert m.mem_bytes == 2**30
    with pytest.raises(ValueError, match="no usable CPU"):
        machine_from_text([0, 1], MEMINFO, cpuset="4-5")


def test_one_node_per_numa_domain_within_the_affinity() -> None:
    numa = {0: "0-3", 1: "4-7"}
    m = machine_from_text(range(8), MEMINFO, nvidia_smi=NVIDIA_SMI, numa=numa)
    nodes = layout_nodes(m)
    assert [(n.name, n.cpus) for n in nodes] == [
        ("local000", (0, 1, 2, 3)),
        ("local001", (4, 5, 6, 7)),
    ]
    assert [len(n.gpus) for n in nodes] == [2, 2]
    spec = pool_spec(nodes)
    assert [name for name, _, _ in spec.node_names()] == ["local000", "local001"]
    assert spec.boot_latency_s == 0.0 and all(g.warm == g.count for g in spec.groups)
    # Affinity leaves one domain: one node. Unequal domains keep their own groups.
    only = machine_from_text([4, 5], MEMINFO, numa=numa)
    assert [n.cpus for n in layout_nodes(only)] == [(4, 5)]
    odd = layout_nodes(machine_from_text([0, 1, 2, 4], MEMINFO, numa=numa))
    assert [n.name for n in odd] == ["local0-000", "local1-000"]
    assert [name for name, _, _ in pool_spec(odd).node_names()] == ["local0-000", "local1-000"]


def test_this_machine() -> None:
    m = read_machine()
    assert set(m.cpus) <= os.sched_getaffinity(0) and m.mem_bytes > 0
    probe = probe_cgroup()
    assert probe.mode in ("cgroup", "plan") and probe.reason


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no nvidia-smi on PATH")
def test_real_nvidia_smi() -> None:
    text = gpu_query()
    if text is None:
        pytest.skip("nvidia-smi is present but answered nothing (no driver)")
    gpus = parse_nvidia_smi(text)
    assert all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
    assert len({g.index for g in gpus}) == len(gpus)
