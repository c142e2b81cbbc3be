"""What one machine offers the local backend: its CPUs, memory, GPUs and NUMA domains.

Everything but :func:`read_machine` and :func:`probe_cgroup` is a pure function over the text
the kernel or ``nvidia-smi`` gives, so that recorded outputs test it. The CPUs are the
process's own affinity intersected with its cgroup v2 ``cpuset.cpus.effective`` (a container
or a Slurm step sees fewer CPUs than the machine has); ``cpu.max`` caps how many of them count
(a quota of 2.5 CPUs on 8 gives 2: leases are whole CPUs). Memory is ``MemTotal`` capped by
the cgroup's ``memory.max``. GPUs come from ``nvidia-smi``; none found (no tool, no driver) is
zero GPUs, never a placeholder. The pool is one node, or one node per NUMA domain when the
kernel reports several with CPUs left after the affinity.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bursar.broker.policy import NodeGroup, PoolSpec

__all__ = [
    "NVIDIA_SMI_QUERY",
    "CgroupProbe",
    "Gpu",
    "Machine",
    "NodeDevices",
    "format_cpulist",
    "layout_nodes",
    "machine_from_text",
    "parse_cgroup_path",
    "parse_cpu_max",
    "parse_cpulist",
    "parse_meminfo",
    "parse_memory_max",
    "parse_nvidia_smi",
    "pool_spec",
    "probe_cgroup",
    "read_machine",
]

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,memory.total",
    "--format=csv,noheader,nounits",
]
CGROUP_ROOT = Path("/sys/fs/cgroup")
NEEDED_CONTROLLERS = ("cpuset", "memory", "pids")


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str
    memory_mb: int
    numa: int | None = None


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """One engine node: its concrete CPU ids and GPUs, and its share of the memory."""

    name: str
    cpus: tuple[int, ...]
    gpus: tuple[Gpu, ...]
    mem_gb: float


@dataclass(frozen=True, slots=True)
class Machine:
    cpus: tuple[int, ...]
    """Usable CPU ids (affinity ∩ cpuset, cut to the cpu.max quota), ascending."""
    mem_bytes: int
    gpus: tuple[Gpu, ...] = ()
    numa: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """NUMA domain → its CPU ids (all of them, before the affinity)."""


# ------------------------------------------------------------------------------ parsers


def parse_cpulist(text: str) -> list[int]:
    """The kernel's list form ("0-3,8,10-11") as ascending CPU ids; empty text is none."""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a:
            raise ValueError(f"bad CPU range {part!r}")
        out.update(range(a, b + 1))
    return sorted(out)


def format_cpulist(cpus: Iterable[int]) -> str:
    """CPU ids in the kernel's list form: ``[0, 1, 2, 3, 8]`` → ``"0-3,8"``."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpu_max(text: str) -> float | None:
    """``cpu.max`` ("max 100000" or "250000 100000") as CPUs; None when unlimited."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = float(fields[1]) if len(fields) > 1 else 100000.0
    return float(fields[0]) / period


def parse_memory_max(text: str) -> int | None:
    """``memory.max`` in bytes; None when "max"."""
    t = text.strip()
    return None if not t or t == "max" else int(t)


def parse_meminfo(text: str) -> int:
    """MemTotal from /proc/meminfo, in bytes."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            fields = line.split()
            return int(fields[1]) * (1024 if fields[-1].lower() == "kb" else 1)
    raise ValueError("no MemTotal line in /proc/meminfo")


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits``."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3:
            raise ValueError(f"unexpected nvidia-smi line {line!r}")
        mem = fields[2]
        out.append(Gpu(int(fields[0]), fields[1], int(float(mem)) if mem[:1].isdigit() else 0))
    return sorted(out, key=lambda g: g.index)


def parse_cgroup_path(text: str) -> str | None:
    """Our cgroup v2 path from /proc/self/cgroup (the ``0::`` line); None on a v1-only host."""
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


# ------------------------------------------------------------------------------ the pool


def machine_from_text(
    affinity: Iterable[int],
    meminfo: str,
    *,
    cpuset: str | None = None,
    cpu_max: str | None = None,
    memory_max: str | None = None,
    nvidia_smi: str | None = None,
    numa: Mapping[int, str] | None = None,
) -> Machine:
    """The machine from its raw readings (None: that file is absent)."""
    cpus = sorted(set(affinity))
    if cpuset is not None and cpuset.strip():
        allowed = set(parse_cpulist(cpuset))
        cpus = [c for c in cpus if c in allowed]
    quota = parse_cpu_max(cpu_max) if cpu_max is not None else None
    if quota is not None:
        # Whole CPUs only: a lease pinned to a CPU the quota cannot pay for would be throttled.
        cpus = cpus[: max(1, math.floor(quota + 1e-9))]
    if not cpus:
        raise ValueError("no usable CPU: the affinity and the cgroup's cpuset share none")
    mem = parse_meminfo(meminfo)
    cap = parse_memory_max(memory_max) if memory_max is not None else None
    if cap is not None:
        mem = min(mem, cap)
    gpus = tuple(parse_nvidia_smi(nvidia_smi)) if nvidia_smi else ()
    domains = {int(k): tuple(parse_cpulist(v)) for k, v in (numa or {}).items()}
    return Machine(tuple(cpus), mem, gpus, domains)


def layout_nodes(m: Machine, *, split_numa: bool = True) -> list[NodeDevices]:
    """The engine's nodes: ``local000`` for the machine, or one per NUMA domain with usable
    CPUs (GPUs go to their domain when known, else spread in index order; memory in
    proportion to the CPUs). Domains of one shape are ``local000``, ``local001``...;
    unequal ones ``local0-000``, ``local1-000``... (one group each, as :func:`pool_spec`
    makes them)."""
    usable = set(m.cpus)
    domains = [
        (d, tuple(c for c in cpus if c in usable))
        for d, cpus in sorted(m.numa.items())
        if usable.intersection(cpus)
    ]
    if not split_numa or len(domains) <= 1:
        return [NodeDevices("local000", m.cpus, m.gpus, _gb(m.mem_bytes))]
    by_domain: dict[int, list[Gpu]] = {d: [] for d, _ in domains}
    for k, g in enumerate(m.gpus):
        d = g.numa if g.numa in by_domain else domains[k * len(domains) // len(m.gpus)][0]
        by_domain[d].append(g)
    total = len(m.cpus)
    parts = [
        (cpus, tuple(by_domain[d]), _gb(m.mem_bytes * len(cpus) // total)) for d, cpus in domains
    ]
    same = len({(len(c), len(g), mem) for c, g, mem in parts}) == 1
    return [
        NodeDevices(f"local{i:03d}" if same else f"local{i}-000", c, g, mem)
        for i, (c, g, mem) in enumerate(parts)
    ]


def pool_spec(nodes: Sequence[NodeDevices]) -> PoolSpec:
    """The PoolSpec the engine takes for ``layout_nodes``' nodes, under the same names; every
    node warm (the machine is on) and no boot latency."""
    groups: list[NodeGroup] = []
    for n in nodes:
        resources = {"cpu": float(len(n.cpus)), "gpu": float(len(n.gpus)), "mem_gb": n.mem_gb}
        prefix = n.name[:-3]
        if groups and groups[-1].prefix == prefix:
            last = groups[-1]
            groups[-1] = NodeGroup(last.count + 1, last.resources, last.warm + 1, prefix)
        else:
            groups.append(NodeGroup(count=1, resources=resources, warm=1, prefix=prefix))
    spec = PoolSpec(groups=tuple(groups), boot_latency_s=0.0)
    names = [name for name, _, _ in spec.node_names()]
    if names != [n.name for n in nodes]:
        raise ValueError(f"node names {names} do not follow the layout's")
    return spec


def _gb(n: int) -> float:
    return round(n / 2**30, 3)


# ------------------------------------------------------------------------------ readers


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def gpu_query(timeout_s: float = 10.0) -> str | None:
    """``nvidia-smi``'s answer, or None when there is no tool or it fails (no driver)."""
    if shutil.which(NVIDIA_SMI_QUERY[0]) is None:
        return None
    try:
        out = subprocess.run(
            NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def own_cgroup_dir(root: Path = CGROUP_ROOT) -> Path | None:
    rel = parse_cgroup_path(_read(Path("/proc/self/cgroup")) or "")
    if rel is None or not (root / "cgroup.controllers").exists():
        return None
    return root / rel.lstrip("/")


def read_machine(*, gpus: bool = True) -> Machine:
    """This machine as this process may use it (the one thin reader over the files)."""
    cg = own_cgroup_dir()

    def cg_file(name: str) -> str | None:
        return _read(cg / name) if cg is not None else None

    numa: dict[int, str] = {}
    for p in sorted(Path("/sys/devices/system/node").glob("node[0-9]*/cpulist")):
        text = _read(p)
        if text is not None:
            numa[int(p.parent.name[4:])] = text
    return machine_from_text(
        os.sched_getaffinity(0),
        _read(Path("/proc/meminfo")) or "",
        cpuset=cg_file("cpuset.cpus.effective"),
        cpu_max=cg_file("cpu.max"),
        memory_max=cg_file("memory.max"),
        nvidia_smi=gpu_query() if gpus else None,
        numa=numa,
    )


@dataclass(frozen=True, slots=True)
class CgroupProbe:
    """Whether leases get cgroups: ``base`` is the delegated directory their cgroups go
    under, or None with ``reason`` (then the cgroup actions are only logged: plan mode)."""

    base: Path | None
    reason: str

    @property
    def mode(self) -> str:
        return "cgroup" if self.base is not None else "plan"


def probe_cgroup(base: Path | None = None) -> CgroupProbe:
    """May this process create a cgroup v2 subtree with cpuset, memory and pids for leases?

    ``base`` defaults to our own cgroup. Its ``cgroup.subtree_control`` must hold (or accept)
    the three controllers, and the directory must be writable; a cgroup with processes in it
    cannot enable controllers for children (the kernel's no-internal-process rule), so the
    usual delegation is a dedicated directory whose own cgroup the broker is not in."""
    if base is None:
        base = own_cgroup_dir()
        if base is None:
            return CgroupProbe(None, "no cgroup v2 hierarchy at /sys/fs/cgroup (v1 or none)")
    available = (_read(base / "cgroup.controllers") or "").split()
    missing = [c for c in NEEDED_CONTROLLERS if c not in available]
    if missing:
        return CgroupProbe(None, f"{base} lacks the {'/'.join(missing)} controller(s)")
    if not os.access(base, os.W_OK):
        return CgroupProbe(None, f"{base} is not writable by this process (not delegated)")
    enabled = (_read(base / "cgroup.subtree_control") or "").split()
    want = [c for c in NEEDED_CONTROLLERS if c not in enabled]
    if want:
        try:
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in want))
        except OSError as exc:
            return CgroupProbe(None, f"cannot enable {'/'.join(want)} under {base}: {exc}")
    return CgroupProbe(base, f"lease cgroups under {base}")
