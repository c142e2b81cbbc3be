"""``bursar demo``: the flagship demo (``bursar.sim.demo``) from the shell."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bursar.broker.config import load_config
from bursar.broker.errors import ConfigError
from bursar.cli.config import EXIT_BAD_CONFIG
from bursar.cli.console import report_console
from bursar.sim.demo import play

__all__ = ["demo"]


@click.command("demo")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/demo"),
    show_default=True,
    help="State directory to write: the journal, report.html and summary.json.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="Pool, policy and campaigns (TOML or YAML). Default: the packaged 512-GPU demo.",
)
@click.option("--show", type=int, default=25, show_default=True, help="Decisions to print.")
@click.option(
    "--no-service",
    is_flag=True,
    help="Skip part 2, the agent session against the gRPC broker service.",
)
def demo(out: Path, config_path: Path | None, show: int, no_service: bool) -> None:
    """Run the flagship demo: 30 virtual minutes of five campaigns on the 512-GPU pool,
    then a short agent session against the real broker service over gRPC.

    Part 1, in virtual time: backfill fills idle nodes, a naive science campaign reclaims
    them, the victim's small interactive requests stay inside its guarantee, a storm hits
    its burst ceiling and empty bucket, an adaptive campaign follows the price, and a node
    fails. Prints what the broker decided and why, audits the journal, and writes
    OUT/report.html.

    Part 2, a few seconds of wall time: starts the broker service on loopback (the
    packaged pool, with a 2 s grace period and a 2.5 s boot; state in OUT/service), and
    agents use the client library: backfill holds a preemptible lease, a science agent
    reads the supply signals and takes capacity that backfill must drain (preemption
    warning, release, activation), renews, and is refused beyond its burst and bucket.
    Prints each step and why, and audits the service's journal.
    """
    console = report_console()
    try:
        config = load_config(config_path) if config_path else None
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        sys.exit(EXIT_BAD_CONFIG)
    if not play(out, config, console, show=show, service=not no_service):
        sys.exit(1)
