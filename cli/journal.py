"""``bursar journal ...``: audit and read the broker's decision journal from the shell."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import click

from bursar.broker import archive, snapshot
from bursar.broker.audit import audit
from bursar.broker.errors import JournalError
from bursar.broker.journal import JOURNAL_FILENAME, Journal, JournalStore, open_store
from bursar.broker.journal_view import first_difference, tail_json_lines, tail_table
from bursar.cli.console import human_duration, iso_time, report_console, tsv_lines

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


_journal_url = click.option(
    "--journal",
    "journal_url",
    metavar="URL",
    help="Read the PostgreSQL journal at URL (postgresql://..., as given to `bursar serve "
    "--journal`) instead of DIR's SQLite file; --state-dir then only names the snapshots.",
)
_state_dir_optional = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    metavar="DIR",
    help=_STATE_DIR_HELP + " Required unless --journal is given.",
)


def _open_either(state_dir: Path | None, url: str | None) -> JournalStore:
    """The journal --journal names, else the one in --state-dir (exit 2 if neither opens)."""
    if url is None:
        if state_dir is None:
            raise click.UsageError("pass --state-dir DIR (or --journal URL)")
        return _open_journal(state_dir)
    if not url.startswith(("postgresql://", "postgres://")):
        raise click.UsageError(f"--journal {url!r}: give a postgresql:// URL")
    try:
        return open_store(url)
    except JournalError as exc:
        _fail(str(exc), EXIT_NO_JOURNAL)


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


_archives = click.option(
    "--archive",
    "archives",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    metavar="FILE",
    help="An archive the journal's first entries were moved to (`bursar journal archive`); "
    "repeat for a chain of archives, oldest first.",
)


@journal.command("audit")
@_state_dir_optional
@_journal_url
@click.option(
    "--show",
    default=5,
    show_default=True,
    metavar="N",
    type=click.IntRange(min=0),
    help="How many mismatching entries to print in full.",
)
@_archives
def audit_cmd(
    state_dir: Path | None, journal_url: str | None, show: int, archives: tuple[Path, ...]
) -> None:
    """Re-derive every journaled decision and report any that differ.

    Replays the recorded events, in order, through a fresh policy engine built from the
    pool and policy stored in the journal, and compares each entry's decisions with the
    recorded ones in canonical JSON. Safe to run while the broker is writing; entries
    appended during the audit may or may not be included.

    Each snapshot in DIR/snapshots/ is checked as well: the state it holds must be the
    state the replay reaches at its entry (a restart resumes from it).

    A journal whose first entries were archived is audited from the snapshot at the cut;
    with --archive the archives are checked to be its history (in order, unaltered) and
    audited first, as if nothing had been moved.

    Exit status: 0 if every decision and snapshot matches, 1 if any differs (or an entry
    cannot be read), 2 if DIR holds no journal that can be opened.
    """
    with _open_either(state_dir, journal_url) as j, _open_archives(archives) as olds:
        snaps = snapshot.listing(state_dir) if state_dir is not None else []
        try:
            report = audit(j, snaps, olds)  # type: ignore[arg-type]
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
    n = len(report.mismatches)
    click.echo(
        f"audited {report.events_checked} events, {report.decisions_checked} decisions: "
        f"{n} mismatch{'es' if n != 1 else ''}"
    )
    if report.started_from:
        click.echo(
            f"entries 1-{report.started_from} are archived: audited from the snapshot at "
            f"entry {report.started_from} (give --archive FILE to audit them too)"
        )
    for problem in report.problems:
        click.echo(f"archive: {problem}")
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


@contextlib.contextmanager
def _open_archives(paths: tuple[Path, ...]) -> Iterator[list[Journal]]:
    opened: list[Journal] = []
    try:
        for p in paths:
            try:
                opened.append(Journal.open(p))
            except JournalError as exc:
                _fail(str(exc), EXIT_NO_JOURNAL)
        yield opened
    finally:
        for j in opened:
            j.close()


@contextlib.contextmanager
def _stopped(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's serve lock: no broker may write it meanwhile."""
    from bursar.broker.service.opening import lock_state_dir

    try:
        fd = lock_state_dir(state_dir)
    except ValueError as exc:
        _fail(f"{exc}; archiving needs the broker stopped", EXIT_NO_JOURNAL)
    try:
        yield
    finally:
        os.close(fd)


@journal.command("archive")
@_state_dir
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="The archive to write (a new file: a journal holding the moved entries).",
)
@click.option(
    "--through",
    type=click.IntRange(min=1),
    metavar="SEQ",
    help="Move at most the entries up to SEQ. Default: up to the newest snapshot.",
)
def archive_cmd(state_dir: Path, out: Path, through: int | None) -> None:
    """Move the journal's old entries to an archive file, with the broker stopped.

    Audits the journal first; the cut is at the newest snapshot the audit verified (at
    most --through): its entries and everything before move to FILE, the snapshot stays
    as the journal's new start, and the journal records the archive's name and hash.
    Keep FILE: `bursar journal audit --archive FILE` audits the whole history, and a new
    build of the broker needs it once (`bursar journal rebase`) to rebuild the snapshot.
    """
    with _stopped(state_dir), _open_journal(state_dir) as j:
        try:
            report = audit(j, snapshot.listing(state_dir))
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
        if not report.ok:
            _fail(
                "the journal does not audit clean (run `bursar journal audit`); nothing moved",
                EXIT_MISMATCH,
            )
        verified = [c.seq for c in report.snapshots if c.ok]
        try:
            done = archive.archive(state_dir, j, out, verified, through)
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
    click.echo(
        f"moved entries {done.first}-{done.through} ({done.entries} entries) to {done.path}; "
        f"its sha256 {done.sha256} is recorded in the journal"
    )


@journal.command("rebase")
@_state_dir
@_archives
def rebase_cmd(state_dir: Path, archives: tuple[Path, ...]) -> None:
    """Rebuild the snapshot an archived journal starts from, with this build.

    A new build of the broker cannot load an older build's snapshots; a journal whose
    first entries were archived then needs its start rebuilt by replaying the archives
    (all of them, oldest first), with the broker stopped.
    """
    with _stopped(state_dir), _open_journal(state_dir) as j, _open_archives(archives) as olds:
        try:
            path = archive.rebase(state_dir, j, olds)
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
    click.echo(f"rebuilt {path}")


@journal.command("tail")
@_state_dir_optional
@_journal_url
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
@click.option(
    "--tsv",
    "as_tsv",
    is_flag=True,
    help="Print the table as tab-separated values (a header line, then a line per decision).",
)
def tail_cmd(
    state_dir: Path | None, journal_url: str | None, count: int, as_json: bool, as_tsv: bool
) -> None:
    """Show the latest decisions, oldest first: times in ISO 8601 (UTC), durations as
    people read them (1m56s); --json keeps the numbers.

    Each decision is shown with the seq of the journal entry (the event) that produced
    it. With --json the output is JSON lines, for jq or a script.
    """
    if as_json and as_tsv:
        raise click.UsageError("--json and --tsv are two ways to print the same thing: pick one")
    with _open_either(state_dir, journal_url) as j:
        where = j.path if journal_url else state_dir / JOURNAL_FILENAME  # type: ignore[operator]
        try:
            rows = j.tail(count)
        except JournalError as exc:
            _fail(str(exc), EXIT_MISMATCH)
    if as_json:
        for line in tail_json_lines(rows):
            click.echo(line)
        return
    title = f"last {len(rows)} decisions in {where}"
    table = tail_table(rows, title, time_text=iso_time, duration_text=human_duration)
    if as_tsv:
        click.echo("\n".join(tsv_lines(table)))
        return
    # Off a terminal the times and details are not cut to 80 columns.
    report_console().print(table, soft_wrap=False)


@journal.command("migrate")
@_state_dir
@click.option(
    "--to",
    "url",
    required=True,
    metavar="URL",
    help="The PostgreSQL database to copy the journal into (postgresql://...): one that "
    "holds no journal yet.",
)
def migrate_cmd(state_dir: Path, url: str) -> None:
    """Copy an SQLite state directory's journal into PostgreSQL, with the broker stopped.

    Copies the entries as stored (the same seqs and texts), the pool, the policy and the
    policy in force, then checks that both journals have the same canonical hash. Start
    the brokers with `bursar serve --journal URL` afterwards. The snapshots stay where
    they are (a broker's --state-dir holds its own); the tokens are issued afresh.

    Exit status: 0 if the copy's hash matches, 1 if it does not, 2 if either journal
    cannot be opened or the database already holds one.
    """
    from bursar.broker.journal_pg import PgJournal, is_postgres

    if not is_postgres(url):
        raise click.UsageError(f"--to {url!r}: give a postgresql:// URL")
    with _stopped(state_dir), _open_journal(state_dir) as src:
        if src.archived_through:
            _fail(
                f"entries 1-{src.archived_through} of {src.path} are in an archive; migrate "
                "a journal whose history is whole",
                EXIT_NO_JOURNAL,
            )
        try:
            if PgJournal.holds_journal(url):
                _fail(
                    f"{PgJournal.describe(url)} already holds a journal; migrate into an "
                    "empty database",
                    EXIT_NO_JOURNAL,
                )
            dst = PgJournal.open(url, src.pool, src.policy)
        except JournalError as exc:
            _fail(str(exc), EXIT_NO_JOURNAL)
        with dst:
            try:
                extra = {
                    k: v for k, v in src.meta().items() if k not in ("format", "pool", "policy")
                }
                dst.set_meta(extra)
                page: list[tuple[int, str, str]] = []
                for row in src.raw_entries():
                    page.append(row)
                    if len(page) == 5000:
                        dst.insert_raw(page)
                        page = []
                dst.insert_raw(page)
                want, got = src.sha256(), dst.sha256()
            except JournalError as exc:
                _fail(str(exc), EXIT_MISMATCH)
            n = len(dst)
            where = dst.location
    if got != want:
        _fail(f"the copy in {where} hashes {got}, the journal {want}", EXIT_MISMATCH)
    click.echo(f"copied {n} entries to {where}: sha256 {got} on both")


@journal.command("brokers")
@click.option(
    "--journal",
    "journal_url",
    required=True,
    metavar="URL",
    help="The shared PostgreSQL journal (postgresql://..., as given to `bursar serve --journal`).",
)
def brokers_cmd(journal_url: str) -> None:
    """Show the brokers on a shared journal: the leader, the standbys and their lag.

    Each broker records its role and the last entry it applied as it runs (a standby at
    every poll, the leader at every check of its lock); LAG is how many committed entries
    it had not applied, LAG_S how long the oldest of those had been in the journal, SEEN
    how long ago it said so.
    """
    import time

    from bursar.broker.journal_pg import PgJournal, is_postgres

    if not is_postgres(journal_url):
        raise click.UsageError(f"--journal {journal_url!r}: give a postgresql:// URL")
    now = time.time()
    try:
        with PgJournal.open(journal_url) as j:
            top = j.topology(now)
    except JournalError as exc:
        _fail(str(exc), EXIT_NO_JOURNAL)
    leader = top.leader or "(none yet)"
    click.echo(f"leader: {leader} (epoch {top.epoch}); journal at entry {top.last_seq}")
    click.echo(f"{'ADDRESS':<24} {'ROLE':<8} {'APPLIED':>8} {'LAG':>6} {'LAG_S':>8} {'SEEN':>8}")
    for p in top.brokers:
        click.echo(
            f"{p.address:<24} {p.role:<8} {p.applied:>8} {p.lag_entries:>6} "
            f"{human_duration(p.lag_s):>8} {human_duration(max(0.0, now - p.reported_at)):>8}"
        )
