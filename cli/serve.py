"""``bursar serve``: the command. The server itself lives in ``bursar.broker.service.server``;
``python -m bursar.broker.service`` runs this same command."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from bursar.broker.snapshot import EVERY

__all__ = ["SITE_CONFIG", "discover_config", "serve_command"]

EXIT_BAD_INPUT = 2

SITE_CONFIG = Path("/etc/bursar/bursar.toml")
"""The site's config, served when neither --config nor $BURSAR_CONFIG names one."""


def discover_config(
    given: Path | None, env: Mapping[str, str], site: Path = SITE_CONFIG
) -> tuple[Path | None, str]:
    """The config file to serve and where it came from (``None``: no file, the packaged
    demo or the journal's own). An empty ``$BURSAR_CONFIG`` counts as unset."""
    if given is not None:
        return given, "--config"
    named = env.get("BURSAR_CONFIG", "")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ValueError(f"$BURSAR_CONFIG names {named}, which is not a file")
        return path, "$BURSAR_CONFIG"
    if site.is_file():
        return site, str(site)
    return None, "the packaged demo pool"


@click.command(
    "serve",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Loopback only unless --allow-remote.",
)
@click.option(
    "--port",
    default=50051,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="gRPC port; 0 picks a free one (printed on start).",
)
@click.option(
    "--state-dir",
    default=Path("state"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the journal (journal.sqlite), the token store (tokens.sqlite) and the "
    "issued tokens (tokens.json, admin.token) live. Created if missing; an existing one "
    "is resumed from its journal.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Pool, policy and campaigns (TOML or YAML). Looked for in this order: --config, "
    f"$BURSAR_CONFIG, {SITE_CONFIG}, else the packaged 512-GPU demo pool (with a notice "
    "on stderr). On a resumed state directory with none of the first three, the journal's "
    "own pool and policy are served; a config given must match them.",
)
@click.option(
    "--backend",
    type=click.Choice(["simulated", "slurm", "local"]),
    default=None,
    help="Pool backend (default: the config's top-level `backend` key, else simulated; this "
    "flag wins over the key). 'simulated': the config's node groups, in wall-clock time. "
    "'slurm': "
    "the nodes of a Slurm partition (SLURM_CONF names the cluster); each placed lease is a "
    "Slurm allocation (salloc), released, expired and revoked leases are cancelled, and "
    "allocations cancelled outside the broker end their leases. Needs --config with the "
    "campaigns and a [slurm] table (partition, job_prefix, poll_interval_s, "
    "allocate_timeout_s, time_limit_min, warn_signal, account, qos) and no [pool.groups]. "
    "'local': this machine, shared by several agents: discovers its CPUs (the process's "
    "affinity within its cgroup's cpuset and cpu.max), memory (MemTotal within memory.max), "
    "GPUs (nvidia-smi) and NUMA domains (one node each); each lease gets concrete CPUs and "
    "GPUs, and workers started through the providers (launch_argv) are pinned to them "
    "(affinity, CUDA_VISIBLE_DEVICES, OMP/BLAS thread counts) and, where a delegated cgroup "
    "v2 subtree is writable, put in a cgroup per lease (cpuset, memory.max, pids.max; else "
    "the cgroup actions are logged as a plan). A lease's end sends its processes SIGTERM, "
    "then SIGKILL after --local-kill-grace. Needs --config with the campaigns and no "
    "[pool.groups].",
)
@click.option(
    "--local-kill-grace",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="--backend local: seconds between SIGTERM and SIGKILL at a lease's end.",
)
@click.option(
    "--local-cgroup",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="--backend local: the delegated cgroup v2 directory lease cgroups go under "
    "(default: this process's own cgroup).",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="File holding the admin token. Default: STATE/admin.token, generated (mode 0600) "
    "on the first start.",
)
@click.option("--tls-cert", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option(
    "--tls-key",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="PEM certificate chain and private key: serve over TLS (both or neither).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Allow a non-loopback --host. Use TLS: tokens travel in the call metadata.",
)
@click.option(
    "--metrics-port",
    default=9464,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Prometheus metrics at http://HOST:PORT/metrics; 0 picks a free port.",
)
@click.option("--no-metrics", is_flag=True, help="Do not serve metrics.")
@click.option(
    "--dashboard-port",
    default=9465,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="The live dashboard (a web page) at http://HOST:PORT/ (https with --tls-cert), on "
    "--host like the gRPC port: loopback unless --allow-remote. Sign in with the one-time "
    "login link printed on start (`bursar dashboard` prints a fresh one), or paste a token: "
    "the admin token sees everything, a campaign token its own campaign and the public "
    "supply. 0 picks a free port.",
)
@click.option("--no-dashboard", is_flag=True, help="Do not serve the dashboard.")
@click.option(
    "--durability",
    type=click.Choice(["normal", "full"]),
    default="normal",
    show_default=True,
    help="Journal commits: 'normal' survives the process being killed; 'full' also "
    "survives power loss, at one fsync per decision.",
)
@click.option(
    "--snapshot-every",
    default=EVERY,
    show_default=True,
    type=click.IntRange(min=0),
    help="Journal entries between snapshots of the broker's state (STATE/snapshots/), "
    "written in the background: a restart loads the newest and replays only the entries "
    "after it. 0: no snapshots (a restart replays the whole journal).",
)
@click.option(
    "--rate-limit",
    default=200.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Requests per second per client (token, or peer address without one).",
)
@click.option(
    "--rate-burst",
    default=400.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Requests a client may send at once after being idle.",
)
@click.option(
    "--max-streams",
    default=32,
    show_default=True,
    type=click.IntRange(min=1),
    help="Open Watch/WatchSupply streams per client.",
)
@click.option(
    "--grace",
    "grace_s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds in-flight calls get to finish after SIGTERM.",
)
@click.option(
    "--journal",
    "journal_url",
    metavar="URL",
    envvar="BURSAR_JOURNAL",
    help="Keep the journal in PostgreSQL (postgresql://USER@HOST/DB, needs the postgres "
    "extra) instead of STATE/journal.sqlite [env BURSAR_JOURNAL]. Several brokers may share "
    "one: one leads, the others stand by (health NOT_SERVING) and take over when it fails. "
    "STATE keeps this broker's snapshots and tokens.",
)
@click.option(
    "--advertise",
    metavar="HOST:PORT",
    help="With --journal: the address clients reach this broker at, recorded while it "
    "leads and told by the standbys [default: --host:--port].",
)
@click.option(
    "--takeover",
    "takeover",
    default="0.5,2.0,0.4",
    show_default=True,
    metavar="POLL,GRACE,CHECK",
    help="With --journal, seconds: how often a standby tries the lead, how long it waits "
    "after taking it before serving, and the leader's check that it still holds it (run "
    "about every CHECK/2; the leader stops when none succeeded for 2 x CHECK; GRACE must "
    "exceed 4 x CHECK). A takeover takes about POLL+GRACE+1 s.",
)
def serve_command(
    host: str,
    port: int,
    state_dir: Path,
    config_path: Path | None,
    backend: str | None,
    local_kill_grace: float,
    local_cgroup: Path | None,
    admin_token_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    allow_remote: bool,
    metrics_port: int,
    no_metrics: bool,
    dashboard_port: int,
    no_dashboard: bool,
    durability: str,
    snapshot_every: int,
    rate_limit: float,
    rate_burst: float,
    max_streams: int,
    grace_s: float,
    journal_url: str | None,
    advertise: str | None,
    takeover: str,
) -> None:
    """Serve the broker over gRPC (package bursar.v1: services Broker and Admin).

    Campaigns acquire, watch, renew and release leases, read supply signals, meter rate
    dimensions and read the journal; the admin creates and updates campaigns. Every call
    carries `authorization: Bearer <token>` metadata:

    \b
    * campaign tokens: the config's campaigns get one on the first start, written to
      STATE/tokens.json (mode 0600) for you to hand out; campaigns created through
      Admin.CreateCampaign get theirs in the response. Only SHA-256 hashes are kept
      (STATE/tokens.sqlite). Admin.RotateToken replaces one.
    * the admin token: --admin-token-file, or STATE/admin.token (generated, mode 0600).

    The standard gRPC health service and server reflection are on; errors are gRPC
    status codes with google.rpc details (ErrorInfo, RetryInfo, BadRequest,
    QuotaFailure). The clock is the wall clock. Every decision is committed to
    STATE/journal.sqlite before it is answered; SIGTERM finishes in-flight calls and
    closes the journal, and a restart (even after SIGKILL) resumes with every lease
    intact. Audit with: bursar journal audit --state-dir STATE
    """
    from bursar.broker.config import file_backend, load_config
    from bursar.broker.errors import ConfigError, JournalError
    from bursar.broker.journal import JOURNAL_FILENAME, PolicyMismatch
    from bursar.broker.service.limits import LimitSettings
    from bursar.broker.service.server import Running, Settings, Takeover, serve
    from bursar.cli.config import backend_in_force

    # A start that fails leaves the directories as it found them: what it made is removed.
    made = [p for p in (state_dir, state_dir / "local") if not p.exists()]
    pool_backend = None
    in_force: str | None = None
    why = ""
    try:
        config_path, _source = discover_config(config_path, os.environ)
        in_force, why = backend_in_force(
            backend, file_backend(config_path) if config_path else None
        )
        backend = in_force
        if (
            backend == "simulated"
            and config_path is None
            and not (state_dir / JOURNAL_FILENAME).exists()
        ):
            # A newcomer's first start: say loudly that this is a demo, and how to leave it.
            click.echo(
                "bursar serve: NOTICE: serving the packaged 512-GPU demo pool (no --config, "
                f"$BURSAR_CONFIG or {SITE_CONFIG}); to serve your own, pass --config FILE "
                "(start from `bursar config show-default`) with a new --state-dir",
                err=True,
            )
        if backend == "slurm":
            config, pool_backend = _slurm_backend(config_path)
        elif backend == "local":
            config, pool_backend = _local_backend(
                config_path, state_dir, local_kill_grace, local_cgroup
            )
            # Which enforcement is in force, once, before anything is placed.
            click.echo(f"bursar serve: {pool_backend.describe_mode()}")
        else:
            config = load_config(config_path, backend="simulated") if config_path else None
        if journal_url is not None and not journal_url.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"--journal {journal_url!r}: give a postgresql:// URL")
        try:
            handover = Takeover(*(float(x) for x in takeover.split(",")))
        except TypeError as exc:
            raise ValueError(f"--takeover {takeover!r}: give POLL,GRACE,CHECK seconds") from exc
    except (ConfigError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        if isinstance(exc, ConfigError) and in_force is not None:
            click.echo(f"  (checked for the {in_force} backend, {why})", err=True)
        _remove(made)
        sys.exit(EXIT_BAD_INPUT)
    settings = Settings(
        state_dir=state_dir,
        config=config,
        host=host,
        port=port,
        metrics_port=None if no_metrics else metrics_port,
        dashboard_port=None if no_dashboard else dashboard_port,
        admin_token_file=admin_token_file,
        tls_cert=tls_cert,
        tls_key=tls_key,
        allow_remote=allow_remote,
        durability=durability,
        snapshot_every=snapshot_every,
        limits=LimitSettings(rate=rate_limit, burst=rate_burst, max_streams=max_streams),
        grace_s=grace_s,
        backend=pool_backend,
        journal=journal_url,
        advertise=advertise,
        takeover=handover,
    )

    started = False

    def announce(r: Running) -> None:
        nonlocal started
        started = True
        core = r.core
        tls = "TLS" if tls_cert else "plaintext"
        click.echo(f"bursar serve: listening on {r.address} (gRPC, {tls})")
        if r.metrics_port is not None:
            click.echo(f"bursar serve: metrics on http://{host}:{r.metrics_port}/metrics")
        if r.dashboard_url:
            from bursar.broker.dashboard.login import login_link

            # A one-time link, as Jupyter prints: it signs in as the admin, once.
            click.echo(f"bursar serve: dashboard: {login_link(core, r.dashboard_url)}")
        j = core.runtime.journal
        snap = core.runtime.snapshots.last if core.runtime.snapshots else 0
        resumed = f", resumed from the snapshot at entry {snap}" if snap else ""
        click.echo(f"bursar serve: journal {j.where} ({j.last_seq} entries{resumed})")
        click.echo(f"bursar serve: admin token in {core.admin_token_path}")
        if core.issued_at_start:
            names = ", ".join(core.issued_at_start)
            click.echo(
                f"bursar serve: issued tokens for {names}: see {state_dir / 'tokens.json'} (0600)"
            )
        sys.stdout.flush()

    try:
        asyncio.run(serve(settings, announce=announce))
    except PolicyMismatch as exc:
        # The journal does not know which file the policy came from: name it.
        click.echo(f"error: {exc.explain(str(config_path))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except (ValueError, JournalError, OSError, RuntimeError) as exc:
        click.echo(f"error: {exc}", err=True)
        if not started:
            _remove(made)
        sys.exit(EXIT_BAD_INPUT)
    click.echo("bursar serve: stopped; journal closed")


def _remove(made: list[Path]) -> None:
    """Remove the directories a failed start made (each was absent before it began)."""
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _slurm_backend(config_path: Path | None) -> tuple[Any, Any]:
    """The config (its nodes discovered from Slurm) and the Slurm pool backend."""
    from bursar.broker.backends.slurm import SlurmPool, discover_pool
    from bursar.broker.config import load_config

    if config_path is None:
        raise ValueError(
            "--backend slurm needs --config FILE: the campaigns and a [slurm] table "
            '(e.g. partition = "gpu"); the nodes are discovered from Slurm'
        )
    config = load_config(config_path, discover=discover_pool, backend="slurm")
    assert config.slurm is not None
    return config, SlurmPool(config.slurm)


def _local_backend(
    config_path: Path | None, state_dir: Path, kill_grace_s: float, cgroup: Path | None
) -> tuple[Any, Any]:
    """The config (its nodes discovered on this machine) and the local pool backend."""
    from bursar.broker.backends.local import LocalPool, LocalSettings
    from bursar.broker.backends.local_discovery import (
        layout_nodes,
        pool_spec,
        probe_cgroup,
        read_machine,
    )
    from bursar.broker.config import load_config

    if config_path is None:
        raise ValueError(
            "--backend local needs --config FILE: the campaigns (no [pool.groups]); the "
            "nodes are discovered on this machine (see examples/local.toml in Bursar's repository)"
        )
    nodes = layout_nodes(read_machine())
    spec = pool_spec(nodes)
    # The config is checked before the pool exists: the pool makes its run directory.
    config = load_config(config_path, discover=lambda _slurm: spec, backend="local")
    settings = LocalSettings(run_dir=state_dir / "local", kill_grace_s=kill_grace_s)
    return config, LocalPool(nodes, settings, cgroup=probe_cgroup(cgroup))
