"""A real Slurm cluster for the tests (scripts/slurm-cluster.sh), and helpers around it.

``slurm_cluster`` (session scope) starts 4 nodes x 8 fake GPUs once, on free ports, in a
temporary directory, sets ``SLURM_CONF`` for the session and stops the cluster at the end
through the script, which kills only the PIDs it recorded. Without Slurm's packages (or
without root) the tests skip, unless ``BURSAR_REQUIRE_SYSTEM_TESTS=1`` (CI), where they fail.
Each test uses its own job prefix, so that one broker's orphan sweep never touches another
test's jobs.

``accounting_cluster`` (session scope) is a second cluster of the same shape started with
``--accounting`` (slurmdbd over a private MariaDB), for the tests that read jobs back with
``sacct``. It leaves ``SLURM_CONF`` alone, since the plain cluster's tests rely on it: run
Slurm's commands against it with ``env=cluster.env()``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from common import free_port_block
from conftest import missing_system_part

from bursar.broker.backends.slurm import SlurmCli, SlurmPool, discover_pool
from bursar.broker.config import Config, parse_config
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.local import on_thread
from bursar.broker.service.server import Settings, running

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
NODES, GPUS, CPUS = 4, 8, 32
_BINARIES = ("slurmctld", "slurmd", "salloc", "srun", "squeue", "sinfo", "scancel", "munged")
_ACCOUNTING_BINARIES = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db")


@dataclass(frozen=True)
class Cluster:
    base: Path
    slurm_conf: str

    def env(self) -> dict[str, str]:
        """The environment for Slurm's commands (and ``bursar``) against this cluster."""
        return {**os.environ, "SLURM_CONF": self.slurm_conf}


_CLUSTER: Cluster | None = None
_ACCOUNTING: Cluster | None = None


def _missing(binaries: Sequence[str] = _BINARIES) -> str | None:
    gone = [b for b in binaries if shutil.which(b) is None]
    if gone:
        return f"Slurm packages missing ({', '.join(gone)}): run scripts/system-deps.sh"
    if os.geteuid() != 0:
        return "the test Slurm cluster needs root (slurmd runs job steps as any user)"
    return None


def _require(binaries: Sequence[str]) -> None:
    why = _missing(binaries)
    if why:
        missing_system_part(why)


def _start(request: pytest.FixtureRequest, *flags: str, ports: int) -> Cluster:
    """Start a cluster through the script in a new temporary directory, on ``ports`` free
    ports, stopped (through the script) when the session ends."""
    base = Path(tempfile.mkdtemp(prefix="bursar-slurm-test-"))
    env = {
        **os.environ,
        "SLURM_CLUSTER_NODES": str(NODES),
        "SLURM_CLUSTER_GPUS": str(GPUS),
        "SLURM_CLUSTER_CPUS": str(CPUS),
        "SLURM_CLUSTER_PORT": str(free_port_block(ports)),
    }

    def stop() -> None:
        subprocess.run([str(SCRIPT), "stop", str(base)], env=env, capture_output=True, timeout=90)

    out = subprocess.run(
        [str(SCRIPT), "start", *flags, str(base)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if out.returncode != 0:
        stop()
        pytest.fail(
            f"scripts/slurm-cluster.sh start {' '.join(flags)} failed:\n{out.stderr[-3000:]}"
        )
    request.session.config.add_cleanup(stop)
    return Cluster(base, out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session", name="slurm_cluster")
def slurm_cluster_fixture(request: pytest.FixtureRequest) -> Cluster:
    global _CLUSTER
    if _CLUSTER is not None:
        return _CLUSTER
    _require(_BINARIES)
    cluster = _start(request, ports=NODES + 1)
    conf = cluster.slurm_conf
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    if old is None:
        request.session.config.add_cleanup(lambda: os.environ.pop("SLURM_CONF", None))
    else:
        request.session.config.add_cleanup(lambda: os.environ.__setitem__("SLURM_CONF", old))
    _CLUSTER = cluster
    return _CLUSTER


@pytest.fixture(scope="session", name="accounting_cluster")
def accounting_cluster_fixture(request: pytest.FixtureRequest) -> Cluster:
    """4 nodes x 8 fake GPUs with accounting: what ran is read back with ``sacct``."""
    global _ACCOUNTING
    if _ACCOUNTING is not None:
        return _ACCOUNTING
    _require(_BINARIES + _ACCOUNTING_BINARIES)
    # slurmctld, one slurmd per node, slurmdbd (MariaDB listens on a socket only).
    _ACCOUNTING = _start(request, "--accounting", ports=NODES + 2)
    return _ACCOUNTING


# ------------------------------------------------------------------------------ helpers


def prefix() -> str:
    return f"bt{uuid.uuid4().hex[:8]}"


def cancel_prefixed(pre: str) -> None:
    ids = [str(j["job_id"]) for j in squeue() if str(j["name"]).startswith(pre)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


@pytest.fixture(name="job_prefix")
def job_prefix_fixture(slurm_cluster: Cluster) -> Iterator[str]:
    """A job prefix of this test's own; its jobs are cancelled when the test ends."""
    pre = prefix()
    try:
        yield pre
    finally:
        cancel_prefixed(pre)


def squeue() -> list[dict[str, Any]]:
    out = subprocess.run(["squeue", "--json"], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout)["jobs"])


def jobs_named(name: str, live: bool = True) -> list[dict[str, Any]]:
    return [
        j
        for j in squeue()
        if j["name"] == name and (not live or j["job_state"] in ("RUNNING", "CONFIGURING"))
    ]


def job_state(job_id: int) -> str:
    for j in squeue():
        if j["job_id"] == job_id:
            return str(j["job_state"])
    return "PURGED"


def salloc(name: str, *args: str) -> int:
    """A plain allocation made outside the broker; its job id."""
    subprocess.run(
        ["salloc", "--no-shell", "--quiet", "--immediate=10", f"--job-name={name}", *args],
        check=True,
        capture_output=True,
        timeout=60,
    )
    (job,) = jobs_named(name)
    return int(job["job_id"])


CAMPAIGNS = """
[campaigns.sci]
class = "batch"
gpu = { guarantee = 8, sustained = 32, burst = 32, bucket = "unlimited" }
cpu = { guarantee = 8, sustained = 128, burst = 128, bucket = "unlimited" }
[campaigns.wf]
class = "batch"
cpu = { guarantee = 0, sustained = 128, burst = 128, bucket = "unlimited" }
[campaigns.fill]
class = "opportunistic"
preemptible = true
gpu = { guarantee = 0, sustained = 32, burst = 32, bucket = "unlimited" }
cpu = { guarantee = 0, sustained = 128, burst = 128, bucket = "unlimited" }
mem_gb = { guarantee = 0, sustained = 500, burst = 500, bucket = "unlimited" }
"""


def slurm_config_text(
    job_prefix: str, *, grace_s: float = 1.0, allocate_timeout_s: int = 5, extra: str = ""
) -> str:
    return f"""
[slurm]
partition = "debug"
job_prefix = "{job_prefix}"
poll_interval_s = 0.3
allocate_timeout_s = {allocate_timeout_s}
{extra}
[policy]
grace_s = {grace_s}
min_retry_s = 0.3
max_lease_s = 3600
{CAMPAIGNS}
"""


def slurm_config(job_prefix: str, **kw: Any) -> Config:
    return parse_config(slurm_config_text(job_prefix, **kw), "toml", discover=discover_pool)


def slurm_backend(cfg: Config, cli: SlurmCli | None = None) -> SlurmPool:
    assert cfg.slurm is not None
    return SlurmPool(cfg.slurm, cli=cli)


def delayed_salloc(job_names: set[str], delay_s: float) -> SlurmCli:
    """Slurm's commands, with ``salloc`` for the named jobs started ``delay_s`` late: an
    allocation that takes that long, as one would behind a busy scheduler, without a pending
    job that changes how Slurm schedules the others (it starts those from backfill then)."""

    def run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        if argv[0] == "salloc" and any(f"--job-name={n}" in argv for n in job_names):
            time.sleep(delay_s)
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    return SlurmCli(runner=run)


@dataclass(frozen=True)
class Served:
    address: str
    tokens: dict[str, str]
    admin_token: str
    backend: SlurmPool


@contextmanager
def slurm_broker(
    state_dir: Path, job_prefix: str, *, cli: SlurmCli | None = None, **kw: Any
) -> Iterator[Served]:
    """``bursar serve --backend slurm`` in this process, on a thread, on a free port (its
    Slurm commands run through ``cli`` if given)."""
    cfg = slurm_config(job_prefix, **kw)
    backend = slurm_backend(cfg, cli)
    settings = Settings(
        state_dir=state_dir,
        config=cfg,
        port=0,
        metrics_port=None,
        limits=LimitSettings(rate=10_000, burst=10_000, max_streams=64),
        grace_s=1.0,
        backend=backend,
    )
    with on_thread(lambda: running(settings), name="bursar-slurm-broker") as r:
        tokens = json.loads((state_dir / "tokens.json").read_text())
        admin = r.core.admin_token_path.read_text().strip()
        yield Served(r.address, tokens, admin, backend)
