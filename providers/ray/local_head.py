"""A Ray head on this host, started for a test, an example or a benchmark and stopped
by PID: never ``ray stop``, which kills every Ray process on the host.

Every process the head starts (its daemons, the autoscaler's monitor, the raylets the
provider starts, their workers) inherits a marker in its environment; stopping collects
them by that marker and by the provider's records (``state_dir``), with their process
trees, and signals those PIDs only. Only one such head should run on a host at a time
(Ray's defaults assume one cluster per host; ports here are free ones).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bursar.providers.ray.raylet import (
    Proc,
    node_processes,
    proc_start,
    ray_start_command,
    stop_processes,
)
from bursar.providers.ray.start import keep_loopback
from bursar.providers.ray.store import all_records

__all__ = ["MARK_ENV", "LocalHead", "free_port", "local_head", "marked", "stop_marked"]

MARK_ENV = "BURSAR_RAY_HEAD_MARK"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def marked(mark: str) -> set[Proc]:
    """Live processes whose environment holds ``MARK_ENV=mark``."""
    needle = f"{MARK_ENV}={mark}".encode()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        start = proc_start(int(entry))
        if start is not None:
            out.add(Proc(int(entry), start))
    return out


def stop_marked(mark: str, state_dir: Path | None = None, grace_s: float = 0.3) -> set[Proc]:
    """Stop the processes carrying ``mark`` and those a provider recorded in
    ``state_dir`` (with their trees), and remove the nodes' Ray temp dirs (the monitor
    stopped with the rest may not have); returns what was signalled."""
    procs = marked(mark)
    records = all_records(state_dir) if state_dir is not None else []
    for r in records:
        procs |= node_processes(r.proc, r.node_id)
    for p in list(procs):
        procs |= node_processes(p)
    stopped = stop_processes(procs, grace_s) if procs else set()
    for r in records:
        if r.temp_dir is not None:
            shutil.rmtree(r.temp_dir, ignore_errors=True)
    return stopped


@dataclass(frozen=True)
class LocalHead:
    address: str
    """The GCS address, ``127.0.0.1:PORT``."""
    temp_dir: Path
    mark: str


@contextmanager
def local_head(
    autoscaling_config: Path | None = None,
    *,
    v2: bool = False,
    state_dir: Path | None = None,
    log_path: Path | None = None,
    keep_logs: Path | None = None,
    env: Mapping[str, str] | None = None,
    update_interval_s: float = 1.0,
    cwd: Path | None = None,
) -> Iterator[LocalHead]:
    """``ray start --head`` on 127.0.0.1 (its servers bound to it, see
    :mod:`bursar.providers.ray.start`) on free ports with no CPUs of its own (tasks go to
    the workers), with ``autoscaling_config`` if given (autoscaler v1, or v2 with
    ``RAY_enable_autoscaler_v2=1``; an update every ``update_interval_s``). The head
    carries ``RAY_CLOUD_INSTANCE_ID=head`` and ``RAY_NODE_TYPE_NAME=head``, as
    :class:`~bursar.providers.ray.BursarNodeProvider` lists it. On exit every process
    is stopped by PID (``state_dir``: the provider's, for its raylets), the monitor's
    logs copied to ``keep_logs`` if given, and the temp dir removed. ``cwd``: where the head
    (and its monitor: relative paths in the cluster YAML) runs. A driver in this process
    may ``ray.init(address=head.address)``: Ray is told to keep the loopback address."""
    # A driver in this process (a test's, a benchmark's) reaches the head on 127.0.0.1.
    keep_loopback()
    mark = uuid.uuid4().hex
    # Ray's unix sockets live under its temp dir: keep the path short (107 bytes).
    temp_dir = Path(tempfile.mkdtemp(prefix="bray-", dir="/tmp"))
    port = free_port()
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.update(
        {
            MARK_ENV: mark,
            "AUTOSCALER_UPDATE_INTERVAL_S": f"{update_interval_s:g}",
            "RAY_enable_autoscaler_v2": "1" if v2 else "0",
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_CLOUD_INSTANCE_ID": "head",
            "RAY_NODE_TYPE_NAME": "head",
        }
    )
    cmd = [
        *ray_start_command(),
        "--head",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=0",
        f"--temp-dir={temp_dir}",
        "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}",
        "--dashboard-agent-listen-port=0",
        "--min-worker-port=0",
        "--max-worker-port=0",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
    ]
    if autoscaling_config is not None:
        cmd.append(f"--autoscaling-config={autoscaling_config}")
    try:
        with open(log_path or os.devnull, "wb") as out:
            subprocess.run(
                cmd,
                env=full_env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=120,
                check=True,
            )
        yield LocalHead(f"127.0.0.1:{port}", temp_dir, mark)
    finally:
        stop_marked(mark, state_dir)
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for path in (temp_dir / "session_latest" / "logs").glob("monitor*"):
                shutil.copy(path, keep_logs / path.name)
        shutil.rmtree(temp_dir, ignore_errors=True)
