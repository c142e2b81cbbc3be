"""``bursar journal ...``: audit and read the broker's decision journal from the shell."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from bursar.broker import codec
from bursar.broker.audit import Mismatch, audit
from bursar.broker.errors import JournalError
from bursar.broker.journal import JOURNAL_FILENAME, Journal

__all__ = ["journal"]

# Exit statuses the audit promises, so that scripts and CI can branch on them.
EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_NO_JOURNAL = 2

_STATE_DIR_HELP = (
    "The broker's state directory (the --state-dir given to `bursar serve`); the journal "
    f"is DIR/{JOURNAL_FILENAME}."
)


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


def _short(value: Any, limit: int = 160) -> str:
    text = codec.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _first_difference(m: Mismatch) -> str:
    """Point at the first differing decision and its differing fields, not two long lists."""
    try:
        expected, got = json.loads(m.expected), json.loads(m.got)
    except ValueError:
        return f"  expected: {_short(m.expected)}\n  recorded: {_short(m.got)}"
    if not (isinstance(expected, list) and isinstance(got, list)):
        return f"  expected: {_short(expected)}\n  recorded: {_short(got)}"
    lines = []
    if len(expected) != len(got):
        lines.append(f"  {len(expected)} decision(s) expected, {len(got)} recorded")
    for i, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e == g:
            continue
        if not (isinstance(e, dict) and isinstance(g, dict)):
            lines.append(f"  decision #{i}: expected {_short(e)}, recorded {_short(g)}")
            break
        label = " ".join(
            str(x) for x in (e.get("kind"), e.get("lease_id") or e.get("request_id")) if x
        )
        lines.append(f"  decision #{i} ({label}):")
        for key in sorted(set(e) | set(g)):
            if e.get(key, "<absent>") != g.get(key, "<absent>"):
                lines.append(
                    f"    {key}: expected {_short(e.get(key, '<absent>'))}, "
                    f"recorded {_short(g.get(key, '<absent>'))}"
                )
        break
    else:
        n = min(len(expected), len(got))
        extra, label = (expected, "expected") if len(expected) > n else (got, "recorded")
        for i in range(n, len(extra)):
            lines.append(f"  decision #{i}: {label} only: {_short(extra[i])}")
    return "\n".join(lines)


@journal.command("audit")
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=_STATE_DIR_HELP,
)
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

    Exit status: 0 if every decision matches, 1 if any differs (or an entry cannot be
    read), 2 if DIR holds no journal that can be opened.
    """
    with _open_journal(state_dir) as j:
        try:
            report = audit(j)
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
    for m in report.mismatches[:show]:
        click.echo(f"entry {m.seq}:")
        click.echo(_first_difference(m))
    if n > show:
        click.echo(f"... and {n - show} more mismatching entr{'ies' if n - show != 1 else 'y'}")
    sys.exit(EXIT_MISMATCH if n else EXIT_OK)


_ID_FIELDS = ("lease_id", "request_id")
_HIDDEN = {"at", "kind", "campaign", "inputs", *_ID_FIELDS}


def _brief(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ",".join(f"{k}={_brief(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(_brief(v) for v in value) if len(value) <= 4 else f"{len(value)} items"
    return str(value)


@journal.command("tail")
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=_STATE_DIR_HELP,
)
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
        for seq, d in rows:
            click.echo(codec.dumps({"seq": seq, **codec.to_dict(d)}))
        return
    table = Table(title=f"last {len(rows)} decisions in {state_dir / JOURNAL_FILENAME}")
    for name, justify in (
        ("seq", "right"),
        ("at", "right"),
        ("kind", "left"),
        ("campaign", "left"),
        ("lease / request", "left"),
        ("details", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for seq, d in rows:
        fields = codec.to_dict(d)
        ident = next((str(fields[k]) for k in _ID_FIELDS if k in fields), "")
        details = " ".join(
            f"{k}={_brief(v)}" for k, v in fields.items() if k not in _HIDDEN and v not in ({}, [])
        )
        table.add_row(
            str(seq),
            _brief(fields["at"]),
            d.kind,
            str(fields.get("campaign", "")),
            ident,
            details,
        )
    Console(soft_wrap=False).print(table)
