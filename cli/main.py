"""The ``bursar`` command: the top-level group and its logging, with every command group
registered from its module in this package, so that ``bursar --help`` lists everything in
one place."""

from __future__ import annotations

import importlib
import logging
import sys
from importlib import metadata
from typing import Any

import click

from bursar.broker.errors import DISTRIBUTION, MissingExtra

__all__ = ["main"]

COMMANDS: dict[str, str] = {
    "acquire": "bursar.cli.acquire:acquire_command",
    "campaigns": "bursar.cli.campaigns:campaigns",
    "config": "bursar.cli.config:config_group",
    "dashboard": "bursar.cli.dashboard:dashboard_command",
    "demo": "bursar.cli.demo:demo",
    "explain": "bursar.cli.explain:explain_command",
    "fidelity": "bursar.cli.replay:fidelity_command",
    "journal": "bursar.cli.journal:journal",
    "leases": "bursar.cli.leases:leases",
    "matrix": "bursar.cli.replay:matrix_command",
    "policy": "bursar.cli.policy:policy",
    "release": "bursar.cli.verbs:release_command",
    "renew": "bursar.cli.verbs:renew_command",
    "replay": "bursar.cli.replay:replay_command",
    "serve": "bursar.cli.serve:serve_command",
    "sim": "bursar.cli.sim:sim",
    "status": "bursar.cli.verbs:status_command",
    "supply": "bursar.cli.supply:supply",
    "traces": "bursar.cli.traces:traces",
    "whatif": "bursar.cli.whatif:whatif_command",
}
"""Every command of ``bursar``: its name and where it is defined (module:attribute). A
command's module, and what it needs, is imported only when the command runs or its help
is shown (click's lazy-loading group), so that ``bursar status`` does not import the
simulator, the replay and the dashboard first."""

_LOG_LEVELS = (logging.WARNING, logging.INFO, logging.DEBUG)


def _installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a bare checkout on PYTHONPATH, not installed
        return "0+unknown"


class _Bursar(click.Group):
    """The top-level group: its commands are loaded from ``COMMANDS`` when asked for, and a
    feature whose extra is not installed ends any command with the one-line install hint
    (exit status 1), never a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name].split(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MissingExtra as exc:
            raise click.ClickException(str(exc)) from None


@click.group(
    cls=_Bursar,
    help=(
        "Bursar is an agent resource broker for shared HPC/GPU pools: campaigns negotiate "
        "short-lived leases under multi-dimensional envelopes instead of submitting jobs. "
        "It keeps each campaign's guarantee isolated from everyone else's bursts, publishes "
        "supply signals adaptive agents can read, and journals every decision for audit and "
        "replay."
    ),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(version=_installed_version(), prog_name="bursar")
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
        self.addFilter(_not_grpc_poller_on_a_closed_loop)

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, _value: object) -> None:
        pass


def _not_grpc_poller_on_a_closed_loop(record: logging.LogRecord) -> bool:
    """Drop asyncio's report that grpc.aio's poller thread woke a loop that has finished.

    grpc.aio keeps one process-wide poller; when a command's event loop (`bursar acquire`)
    has closed, a late wake-up of that poller is logged by asyncio as an error with a
    traceback, on whatever command runs next in the process or at exit. Nothing is lost
    (the loop's work is done), so it is noise a person cannot act on.
    """
    exc = record.exc_info[1] if record.exc_info else None
    return not (
        record.name == "asyncio"
        and isinstance(exc, RuntimeError)
        and str(exc) == "Event loop is closed"
        and "PollerCompletionQueue" in record.getMessage()
    )


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


if __name__ == "__main__":  # python -m bursar.cli.main, as the console script does
    main()
