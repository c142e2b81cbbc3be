"""A Ray worker node's processes on this host: started with ``ray start --block`` in a
session of their own, stopped by process tree (never ``ray stop``, which kills every
Ray process on the host, other clusters' included).

Ray's worker processes leave the raylet's process group and its ``DashboardAgent`` and
``RuntimeEnvAgent`` ignore SIGTERM, so stopping a node collects the whole tree (the
``ray start`` process, its session, their descendants, and any process whose
environment names the node: a :class:`~bursar.providers.block.ProcessTree`) before
signalling, and SIGKILLs what is left after a grace period. Processes are identified by
PID *and* start time, so a reused PID is never hit. (``node_processes`` and
``stop_processes`` find and stop a set of processes by hand, for the local head.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bursar.providers.block import ProcessTree
from bursar.providers.launch import launch_argv

__all__ = [
    "NODE_ENV",
    "Proc",
    "alive",
    "node_processes",
    "proc_start",
    "ray_start_args",
    "ray_start_command",
    "start_node",
    "stop_node",
    "stop_processes",
]

NODE_ENV = "BURSAR_RAY_NODE_ID"
"""Set in every process of a node (inherited from ``ray start``): the provider's node id."""


@dataclass(frozen=True)
class Proc:
    """A process, named so that a reused PID is not mistaken for it."""

    pid: int
    start: int
    """Start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, start ticks) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def proc_start(pid: int) -> int | None:
    st = _stat(pid)
    return None if st is None else st[3]


def alive(p: Proc) -> bool:
    st = _stat(p.pid)
    return st is not None and st[3] == p.start and st[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _has_env(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def node_processes(root: Proc | None, node_id: str | None = None) -> set[Proc]:
    """The live processes of a node: ``root``, its process group and session,
    their descendants, and every process whose environment has ``NODE_ENV=node_id``."""
    table: dict[int, tuple[str, int, int, int]] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            table[pid] = st
    found: set[int] = set()
    if root is not None and root.pid in table and table[root.pid][3] == root.start:
        found.add(root.pid)
        found.update(pid for pid, st in table.items() if st[2] == root.pid)  # its group
    if node_id:
        needle = f"{NODE_ENV}={node_id}".encode()
        found.update(pid for pid in table if pid != os.getpid() and _has_env(pid, needle))
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st[1], []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    found.discard(os.getpid())
    return {Proc(pid, table[pid][3]) for pid in found}


def stop_processes(
    procs: Iterable[Proc], grace_s: float, *, rescan: Proc | None = None, node_id: str | None = None
) -> set[Proc]:
    """SIGTERM ``procs``; SIGKILL whatever is still alive after ``grace_s`` (rescanning
    the node's tree first, for workers it spawned meanwhile). Returns the processes
    that were signalled."""
    targets = set(procs)
    _signal(targets, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    if rescan is not None or node_id:
        targets |= node_processes(rescan, node_id)
    _signal({p for p in targets if alive(p)}, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while any(alive(p) for p in targets) and time.monotonic() < deadline:
        time.sleep(0.02)
    return targets


def stop_node(tree: ProcessTree, grace_s: float) -> set[psutil.Process]:
    """Stop a node's processes, raylet first: SIGTERM the raylet and wait, up to
    ``grace_s``, for it to leave the cluster; then stop the rest (its agents and workers,
    which live in groups of their own), SIGKILLing what is left after ``grace_s / 2``.
    The order matters to Ray: a task whose worker dies while its node is still alive is
    a plain failure, one whose node went first (drained as preempted) is a preemption,
    retried without counting against ``max_retries``. ``tree`` holds the ``ray start``
    process and whatever carries the node's ``NODE_ENV`` (under srun the raylet is not
    our descendant)."""
    return tree.stop(grace_s, first=lambda p: p.name() == "raylet")


def _signal(procs: Iterable[Proc], sig: signal.Signals) -> None:
    for p in procs:
        if alive(p):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, sig)


def ray_start_command() -> list[str]:
    """``ray start`` that keeps a loopback node address (see
    :mod:`bursar.providers.ray.start`), in the running interpreter's environment."""
    return [sys.executable, "-m", "bursar.providers.ray", "start"]


NODE_PORTS = (
    "--node-manager-port",
    "--object-manager-port",
    "--metrics-export-port",
    "--dashboard-agent-grpc-port",
    "--dashboard-agent-listen-port",
    "--runtime-env-agent-port",
    "--min-worker-port",
    "--max-worker-port",
)
"""Every port a worker node's ``ray start`` binds: all 0, each picked by the kernel as
its server binds (no free-port guess that two nodes starting at once could both make)."""


def ray_start_args(head_address: str, ip: str) -> list[str]:
    """A worker node's ``ray start`` arguments: the head, the node's address (its
    servers bind to it), and free ports throughout."""
    return [
        f"--address={head_address}",
        f"--node-ip-address={ip}",
        *(f"{opt}=0" for opt in NODE_PORTS),
        "--disable-usage-stats",
    ]


def start_node(
    *,
    node_id: str,
    node_type: str,
    head_address: str,
    ip: str,
    resources: Mapping[str, float],
    labels: Mapping[str, str],
    env: Mapping[str, str],
    object_store_memory: int,
    extra_args: Sequence[str],
    log_path: Path,
    command: Sequence[str] | None = None,
    allocation: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start a worker node's raylet (``ray start --address=HEAD --block``, through
    :func:`ray_start_command`) in a new session, advertising exactly ``resources`` and ``labels``. For the v2 autoscaler
    the raylet carries ``RAY_CLOUD_INSTANCE_ID`` (the provider's node id) and
    ``RAY_NODE_TYPE_NAME``. ``command`` replaces the ``ray start`` command line (a
    site's wrapper); it finds the head and its address in ``BURSAR_RAY_HEAD_ADDRESS``
    and ``BURSAR_RAY_NODE_IP``."""
    full_env = dict(os.environ)
    full_env.update(env)
    full_env.update(
        {
            NODE_ENV: node_id,
            "RAY_CLOUD_INSTANCE_ID": node_id,
            "RAY_NODE_TYPE_NAME": node_type,
            # How Ray's autoscaler hands a node its type's resources and labels.
            "RAY_OVERRIDE_RESOURCES": json.dumps(dict(resources)),
            "RAY_OVERRIDE_LABELS": json.dumps(dict(labels)),
            "BURSAR_RAY_HEAD_ADDRESS": head_address,
            "BURSAR_RAY_NODE_IP": ip,
        }
    )
    cmd = (
        list(command)
        if command
        else [
            *ray_start_command(),
            *ray_start_args(head_address, ip),
            f"--object-store-memory={object_store_memory}",
            *extra_args,
            "--block",
        ]
    )
    cmd = launch_argv(allocation or {}, cmd)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
