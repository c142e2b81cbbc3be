"""``bursar journal ...``: audit and read the broker's decision journal from the shell."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console

from bursar.broker import snapshot
from bursar.broker.audit import audit
from bursar.broker.errors import JournalError
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.broker.journal_view import first_difference, tail_json_lines, tail_table

__all__ = ["journal"]

# Exit statuses the audit promises, so that scripts and CI can branch on them.
EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_NO_JOURNAL = 2

_STATE_DIR_HELP = (
    "The broker's state directory (the --state-dir given to `bursar serve`); the journal "
    f"is DIR/{JOURNAL_FILENAME}."
)

_state_dir = click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=_STATE_DIR_HELP,
)
"""The option both journal commands take: the broker's state directory."""


def _fail(message: str, status: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def _open_journal(state_dir: Path) -> Journal:
    """Open an existing journal, or exit 2 saying what to do instead."""
    if not state_dir.is_dir():
        _fail(
            f"state directory {state_dir} does not exist. Pass the --state-dir that "
            "`bursar serve` was started with (it creates the directory on first start).",
            EXIT_NO_JOURNAL,
        )
    path = state_dir / JOURNAL_FILENAME
    if not path.is_file():
        _fail(
            f"no journal in {state_dir} (looked for {path}). Check --state-dir, or start "
            "`bursar serve --state-dir` there once to create it.",
            EXIT_NO_JOURNAL,
        )
    try:
        return Journal.open(path)
    except JournalError as exc:
        _fail(str(exc), EXIT_NO_JOURNAL)


@click.group()
def journal() -> None:
    """Read and audit the decision journal.

    Every event the broker applies is journaled with the decisions it produced; the
    broker's state is a function of this journal (restart replays it).
    """


@journal.command("audit")
@_state_dir
@click.option(
    "--show",
    default=5,
    show_default=True,
    metavar="N",
    type=click.IntRange(min=0),
    help="How many mismatching entries to print in full.",
)
def audit_cmd(state_dir: Path, show: int) -> None:
    """Re-derive every journaled decision and report any that differ.

    Replays the recorded events, in order, through a fresh policy engine built from the
    pool and policy stored in the journal, and compares each entry's decisions with the
    recorded ones in canonical JSON. Safe to run while the broker is writing; entries
    appended during the audit may or may not be included.

    Each snapshot in DIR/snapshots/ is checked as well: the state it holds must be the
    state the replay reaches at its entry (a restart resumes from it).

    Exit status: 0 if every decision and snapshot matches, 1 if any differs (or an entry
    cannot be read), 2 if DIR holds no journal that can be opened.
    """
    with _open_journal(state_dir) as j:
        try:
            report = audit(j, snapshot.listing(state_dir))
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
    n = len(report.mismatches)
    click.echo(
        f"audited {report.events_checked} events, {report.decisions_checked} decisions: "
        f"{n} mismatch{'es' if n != 1 else ''}"
    )
    click.echo(f"final state digest: {report.state_digest}")
    if report.journal_sha256 is not None:
        click.echo(f"journal sha256:     {report.journal_sha256}")
    for check in report.snapshots:
        mark = "ok" if check.ok else "FAILED"
        click.echo(f"snapshot at entry {check.seq}: {mark}, {check.detail}")
    for m in report.mismatches[:show]:
        click.echo(f"entry {m.seq}:")
        click.echo(first_difference(m))
    if n > show:
        click.echo(f"... and {n - show} more mismatching entr{'ies' if n - show != 1 else 'y'}")
    sys.exit(EXIT_OK if report.ok else EXIT_MISMATCH)


@journal.command("tail")
@_state_dir
@click.option(
    "-n",
    "count",
    default=20,
    show_default=True,
    metavar="N",
    type=click.IntRange(min=0),
    help="How many of the latest decisions to show.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one canonical JSON object per line (the decision plus its entry's seq).",
)
def tail_cmd(state_dir: Path, count: int, as_json: bool) -> None:
    """Show the latest decisions, oldest first.

    Each decision is shown with the seq of the journal entry (the event) that produced
    it. With --json the output is JSON lines, for jq or a script.
    """
    with _open_journal(state_dir) as j:
        try:
            rows = j.tail(count)
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
    if as_json:
        for line in tail_json_lines(rows):
            click.echo(line)
        return
    title = f"last {len(rows)} decisions in {state_dir / JOURNAL_FILENAME}"
    Console(soft_wrap=False).print(tail_table(rows, title))
