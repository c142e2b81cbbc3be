"""``bursar config ...``: check configuration files and print the default one."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from bursar.broker.config import default_config_text, load_config
from bursar.broker.config_view import summary_tables
from bursar.broker.errors import ConfigError

__all__ = ["EXIT_BAD_CONFIG", "config_group"]

# Exit status for a file that is not a usable config; click uses 2 for usage errors too,
# and to a script both mean "the input you gave me is wrong".
EXIT_BAD_CONFIG = 2


@click.group("config")
def config_group() -> None:
    """Check configuration files and print the default one."""


@config_group.command("check")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
def config_check(file: Path) -> None:
    """Validate FILE (.toml, .yaml or .yml) and summarise its pool, policy and campaigns.

    Exits 2 with the offending key and the allowed values when FILE is not usable.
    """
    try:
        cfg = load_config(file)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_BAD_CONFIG)
    console = Console()
    for table in summary_tables(cfg):
        console.print(table)
    console.print(f"[green]OK[/green]: {file} is a valid Bursar config.", highlight=False)


@config_group.command("show-default")
def config_show_default() -> None:
    """Print the packaged demo config (the flagship 512-GPU pool), comments included.

    Start a config of your own from it: bursar config show-default > bursar.toml
    """
    click.echo(default_config_text(), nl=False)
