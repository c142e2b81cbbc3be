"""``bursar config ...``: check configuration files and print the default one."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from bursar.broker.config import (
    BACKENDS,
    Backend,
    Discover,
    default_config_text,
    file_backend,
    load_config,
)
from bursar.broker.config_view import summary_tables
from bursar.broker.errors import ConfigError

__all__ = ["EXIT_BAD_CONFIG", "backend_in_force", "config_group", "local_discover"]

# Exit status for a file that is not a usable config; click uses 2 for usage errors too,
# and to a script both mean "the input you gave me is wrong".
EXIT_BAD_CONFIG = 2


@click.group("config")
def config_group() -> None:
    """Check configuration files and print the default one."""


def backend_in_force(flag: str | None, declared: Backend | None) -> tuple[Backend, str]:
    """The backend a file is read for, and why: an explicit --backend wins over the file's
    top-level ``backend`` key, which wins over the default (simulated)."""
    if flag is not None:
        return next(b for b in BACKENDS if b == flag), "from --backend"
    if declared is not None:
        return declared, "from the file's backend key"
    return "simulated", "the default: no --backend and no backend key in the file"


def local_discover() -> Discover:
    """The local backend's discovery: this machine's nodes, as ``serve --backend local``
    finds them."""
    from bursar.broker.backends.local_discovery import layout_nodes, pool_spec, read_machine

    spec = pool_spec(layout_nodes(read_machine()))
    return lambda _slurm: spec


@config_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="The backend FILE is for (as `bursar serve --backend`); default: the file's "
    "top-level `backend` key, else simulated. 'simulated' needs [pool.groups]; 'local' and "
    "'slurm' refuse them (their nodes are discovered): 'local' checks against this "
    "machine's CPUs, memory and GPUs, 'slurm' checks everything but the guarantees of the "
    "placed dimensions, which need the partition's nodes (Slurm is not asked).",
)
def config_check(file: Path, backend: str | None) -> None:
    """Validate FILE (.toml, .yaml or .yml) for its backend and summarise its pool, policy
    and campaigns.

    Exits 2 with the offending key, the allowed values and the backend checked for when
    FILE is not usable.
    """
    in_force: Backend | None = None
    why = ""
    try:
        in_force, why = backend_in_force(backend, file_backend(file))
        discover = local_discover() if in_force == "local" else None
        cfg = load_config(file, discover=discover, backend=in_force)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        if in_force is not None:
            click.echo(f"  (checked for the {in_force} backend, {why})", err=True)
        sys.exit(EXIT_BAD_CONFIG)
    console = Console()
    tables = summary_tables(cfg)
    if in_force == "slurm":
        # The nodes and the placed capacity come from Slurm when served: only the
        # campaigns are this file's to show.
        partition = cfg.slurm.partition if cfg.slurm and cfg.slurm.partition else "(the only one)"
        console.print(
            f"Nodes: discovered from Slurm partition {partition} when served", soft_wrap=True
        )
        tables = tables[2:]
    for table in tables:
        console.print(table)
    console.print(
        f"[green]OK[/green]: {file} is a valid Bursar config for the {in_force} backend ({why}).",
        highlight=False,
        soft_wrap=True,  # one line, so that scripts can look for it
    )


@config_group.command("show-default")
def config_show_default() -> None:
    """Print the packaged demo config (the flagship 512-GPU pool), comments included.

    Start a config of your own from it: bursar config show-default > bursar.toml
    """
    click.echo(default_config_text(), nl=False)
