"""The ``bursar`` command line: the top-level group and ``bursar config ...``.

Other command groups live next to what they drive (``journal_cli`` for the journal) and
are registered here, so that ``bursar --help`` lists everything in one place.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
from rich import box
from rich.console import Console
from rich.table import Table

from bursar.broker import dims
from bursar.broker.config import Config, default_config_text, load_config, pool_capacity
from bursar.broker.errors import ConfigError
from bursar.broker.journal_cli import journal
from bursar.broker.service.cli import serve_command
from bursar.providers.client_cli import campaigns, leases, supply
from bursar.sim.cli import sim
from bursar.sim.replay.cli import matrix_command, replay_command

__all__ = ["main"]

# Exit status for a file that is not a usable config; click uses 2 for usage errors too,
# and to a script both mean "the input you gave me is wrong".
EXIT_BAD_CONFIG = 2

_LOG_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)


@click.group(
    help=(
        "Bursar is an agent resource broker for shared HPC/GPU pools: campaigns negotiate "
        "short-lived leases under multi-dimensional envelopes instead of submitting jobs. "
        "It keeps each campaign's guarantee isolated from everyone else's bursts, publishes "
        "supply signals adaptive agents can read, and journals every decision for audit and "
        "replay."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="bursar", prog_name="bursar")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="Log to stderr: -v for progress, -vv for debug detail. Quiet (warnings only) by default.",
)
def main(verbose: int) -> None:
    _configure_logging(_LOG_LEVELS[min(verbose, len(_LOG_LEVELS) - 1)])


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at emit time (as logging.lastResort does), so a
    handler installed under a redirected stderr (click's test runner) never writes to a
    closed stream later."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _configure_logging(level: int) -> None:
    # Replace only our own handler: the group may run many times in one process (tests,
    # notebooks), and handlers that others installed on the root logger are theirs.
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(h)
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


main.add_command(journal)
main.add_command(serve_command)
main.add_command(campaigns)
main.add_command(leases)
main.add_command(supply)
main.add_command(sim)
main.add_command(replay_command)
main.add_command(matrix_command)


@main.group("config")
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
    for table in _summary(cfg):
        console.print(table)
    console.print(f"[green]OK[/green]: {file} is a valid Bursar config.", highlight=False)


@config_group.command("show-default")
def config_show_default() -> None:
    """Print the packaged demo config (DESIGN.md §3's 512-GPU pool), comments included.

    Start a config of your own from it: bursar config show-default > bursar.toml
    """
    click.echo(default_config_text(), nl=False)


# ---------------------------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "unlimited"
    # Exact below a million (budgets people compare digit by digit); bucket sizes in the
    # millions of unit-seconds read better, and fit, as 3.84M.
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def _summary(cfg: Config) -> list[Table]:
    pool, policy = cfg.pool, cfg.policy

    nodes = Table(title="Nodes", title_justify="left")
    nodes.add_column("group (names)")
    nodes.add_column("count", justify="right")
    nodes.add_column("warm", justify="right")
    for d in dims.PLACED:
        nodes.add_column(f"{d} / node", justify="right")
    for g in pool.groups:
        names = f"{g.prefix}{0:03d}..{g.prefix}{g.count - 1:03d}"
        nodes.add_row(
            names,
            str(g.count),
            str(g.warm),
            *(_num(g.resources.get(d, 0.0)) for d in dims.PLACED),
        )
    nodes.caption = (
        f"boot latency {_num(pool.boot_latency_s)} s, grace {_num(policy.grace_s)} s, "
        f"enforcement {policy.enforcement.value}"
    )

    cap = pool_capacity(pool)
    capacity = Table(title="Capacity", title_justify="left")
    capacity.add_column("dimension")
    capacity.add_column("kind")
    capacity.add_column("capacity", justify="right")
    capacity.add_column("guarantees", justify="right")
    capacity.add_column("warm headroom", justify="right")
    capacity.add_column("unit")
    for d in dims.ALL:
        guaranteed = sum(c.envelopes[d].guarantee for c in cfg.campaigns if d in c.envelopes)
        capacity.add_row(
            d,
            "placed" if d in dims.PLACED else "rate",
            _num(cap[d]),
            _num(guaranteed),
            _num(policy.warm_headroom[d]) if d in policy.warm_headroom else "-",
            dims.UNITS[d],
        )

    # Compact layout so that the widest demo row fits an 80-column terminal or pipe.
    campaigns = Table(
        title="Campaigns",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )
    campaigns.add_column("campaign")
    campaigns.add_column("class")
    campaigns.add_column("dim")
    for col in ("guarantee", "sustained", "burst", "bucket"):
        campaigns.add_column(col, justify="right")
    for c in cfg.campaigns:
        # One block per campaign: name and class on its first row, the flag on the second.
        labels = [c.name, c.lease_class.value]
        flags = ["", "preemptible" if c.preemptible else ""]
        present = [d for d in dims.ALL if d in c.envelopes]
        for k, d in enumerate(present):
            e = c.envelopes[d]
            head = labels if k == 0 else flags if k == 1 else ["", ""]
            campaigns.add_row(
                *head,
                d,
                _num(e.guarantee),
                _num(e.sustained),
                _num(e.burst),
                _num(e.bucket),
                end_section=k == len(present) - 1,
            )
        if len(present) < 2 and c.preemptible:
            campaigns.add_row("", "preemptible", "", "", "", "", "", end_section=True)
    if not cfg.campaigns:
        campaigns.caption = "no campaigns: they can be created at run time"
    return [nodes, capacity, campaigns]


@main.command()
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
    from bursar.broker.audit import audit
    from bursar.broker.demo import run_demo

    console = Console()
    try:
        config = load_config(config_path) if config_path else None
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        sys.exit(EXIT_BAD_CONFIG)
    with console.status("running the demo session..."):
        d, sha = run_demo(out, config)
    table = Table(title="What the broker decided, by campaign", box=box.SIMPLE_HEAD)
    rows = d.summary_rows()
    for k in rows[0]:
        table.add_column(k, justify="left" if k == "campaign" else "right")
    for r in rows:
        table.add_row(*["-" if v is None else str(v) for v in r.values()])
    console.print(table)
    notable = Table(title=f"First {show} decisions and why", box=box.SIMPLE_HEAD)
    for k in ("t (s)", "campaign", "decision", "why"):
        notable.add_column(k, overflow="fold")
    for t, c, k, w in d.trace.notable[:show]:
        notable.add_row(f"{t:.0f}", c, k, w)
    console.print(notable)
    with console.status("auditing the journal..."):
        report = audit(d.broker.journal)
    audit_line = (
        f"audit: {report.events_checked} events, {report.decisions_checked} decisions "
        f"re-derived, {len(report.mismatches)} mismatches"
    )
    path = d.write_report(sha, audit_line)
    d.broker.close()
    console.print(audit_line)
    console.print(f"journal SHA-256: {sha}")
    console.print(
        f"report: [bold]{path}[/bold]  (audit again: bursar journal audit --state-dir {out})"
    )
    service_ok = True
    if not no_service:
        service_ok = _demo_service(out / "service", console)
    if not (report.ok and service_ok):
        sys.exit(1)


def _demo_service(state_dir: Path, console: Console) -> bool:
    """Part 2 of ``bursar demo``; False if it failed or its audit found a mismatch."""
    from rich.markup import escape

    from bursar.broker.demo_service import run_service_session

    try:
        result = run_service_session(state_dir, console)
    except Exception as exc:  # the broker has stopped: say what went wrong, exit 1
        logging.getLogger(__name__).debug("the service session failed", exc_info=True)
        console.print(f"[red]service session failed: {escape(str(exc))}[/red]", highlight=False)
        return False
    console.print(f"service session: {result.wall_s:.1f} s of wall time")
    return result.ok
