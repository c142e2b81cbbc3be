"""Audit a journal: re-derive every recorded decision and report where they differ.

The engine is deterministic, so applying the recorded events in order to
a fresh engine built from the journal's own specs must reproduce each entry's decisions
byte for byte in canonical JSON. A difference means the journal was altered, or the
engine's policy changed since it was written; the report says which entries differ, and
the operator decides which.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from bursar.broker import codec, snapshot
from bursar.broker.archive import chain
from bursar.broker.engine import RULES_VERSION
from bursar.broker.errors import JournalError, RequestError
from bursar.broker.journal import (
    Journal,
    apply_recorded,
    canonical_line,
    decode_entry_event,
    new_engine,
)

if TYPE_CHECKING:
    from bursar.broker.engine import Engine

__all__ = ["AuditReport", "Mismatch", "SnapshotCheck", "audit"]


class Mismatch(NamedTuple):
    """One entry whose re-derived decisions differ from the recorded ones.

    Both are canonical JSON lists of decisions. ``expected`` is what the engine decides
    now (or ``"refused: ..."`` if it rejects the event); ``got`` is what the journal holds.
    """

    seq: int
    expected: str
    got: str


class SnapshotCheck(NamedTuple):
    """One snapshot compared with the replay of the journal up to its entry."""

    seq: int
    path: str
    ok: bool
    detail: str
    """"matches the replay", or what is wrong (or why it was not compared)."""


@dataclass(frozen=True, slots=True)
class AuditReport:
    events_checked: int
    decisions_checked: int
    """Decisions recorded in the journal, all of which were compared."""
    mismatches: tuple[Mismatch, ...]
    state_digest: str
    """``Engine.state_digest()`` after every recorded event has been applied."""
    journal_sha256: str | None
    """SHA-256 of the journal's canonical form, as ``Journal.sha256()`` gives it; None if
    some entry is not JSON at all, so that the journal has no canonical form."""
    snapshots: tuple[SnapshotCheck, ...] = ()
    """The snapshots given, each checked against the replay at its entry."""
    started_from: int = 0
    """0: every entry was re-derived from the start; else the entry of the base snapshot
    the audit started from (the entries before it are in an archive not given)."""
    problems: tuple[str, ...] = ()
    """Why the archives given are not the journal's history (then only the live journal
    was audited), or that the journal was written under other rules (``RULES_VERSION``)."""

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.problems and all(s.ok for s in self.snapshots)


LATER_FIELDS: dict[str, tuple[str, ...]] = {"grant": ("pieces",), "activate": ("pieces",)}
"""Decision fields added after journals were first written: a journal from before holds
decisions without them, and is audited on the fields it has (every other byte must still
match). A decision that has the field is compared with it."""


def _as_recorded(derived: list[dict[str, Any]], recorded: Any) -> list[dict[str, Any]]:
    """``derived`` without the later fields its recorded counterparts lack."""
    if not isinstance(recorded, list) or len(recorded) != len(derived):
        return derived
    out = []
    for d, r in zip(derived, recorded, strict=True):
        later = LATER_FIELDS.get(d.get("kind", ""), ())
        if later and isinstance(r, dict) and r.get("kind") == d.get("kind"):
            d = {k: v for k, v in d.items() if k not in later or k in r}
        out.append(d)
    return out


def audit(
    journal: Journal,
    snapshots: Sequence[snapshot.Snapshot] = (),
    archives: Sequence[Journal] = (),
) -> AuditReport:
    """Re-derive every entry of ``journal`` and compare; never changes the journal.

    Each of ``snapshots`` (``snapshot.listing(state_dir)``) is checked too: it must be of
    this journal, and the state it holds must be the state the replay reaches at its entry
    (the same ``snapshot.fingerprint``), so that a restart from it is a restart from the
    journal.

    A journal whose first entries were archived (``broker/archive.py``) is audited from
    its base snapshot, unless ``archives`` are given: they are then checked to chain up to
    the cut and audited first, as if nothing had been moved.

    Raises :class:`JournalError` only if an entry's event cannot be decoded at all or the
    engine crashes on it (rather than refusing it), since nothing after that entry can
    then be re-derived, or if an archived journal's base snapshot cannot be loaded. A
    refused event is reported as a mismatch and the audit goes on.
    """
    base = journal.archived_through
    problems = chain(journal, archives) if archives else []

    started_from = 0
    if base and not archives:
        engine = _base_engine(journal, snapshots, base)
        started_from = base
    else:
        engine = new_engine(journal)
    due: dict[int, list[snapshot.Snapshot]] = {}
    checks: list[SnapshotCheck] = []
    for snap in snapshots:
        why = snapshot.problem(snap, journal)
        if why is None:
            if snap.header.seq > started_from:
                due.setdefault(snap.header.seq, []).append(snap)
        else:
            checks.append(SnapshotCheck(snap.header.seq, str(snap.path), False, why))
    digest = hashlib.sha256((journal.meta_line + "\n").encode())
    events = 0
    decisions = 0
    mismatches: list[Mismatch] = []
    canonical = True
    sources = (*archives, journal) if not problems else (journal,)
    for source in sources:
        for seq, event_json, decisions_json in source.raw_entries():
            events += 1
            event = decode_entry_event(source, seq, event_json)
            recorded: Any = None
            try:
                recorded = json.loads(decisions_json)
                got = codec.dumps(recorded)
                decisions += len(recorded) if isinstance(recorded, list) else 1
            except ValueError:
                # A row that is not even JSON is a mismatch to report, not a reason to stop.
                got = decisions_json
                decisions += 1
                canonical = False
            else:
                digest.update((canonical_line(seq, event_json, decisions_json) + "\n").encode())
            try:
                derived = apply_recorded(source, engine, seq, event)
                expected = codec.dumps(_as_recorded([codec.to_dict(d) for d in derived], recorded))
            except JournalError as exc:
                if not isinstance(exc.__cause__, RequestError):
                    raise
                # The engine leaves its state untouched on a refusal, so the audit goes on.
                expected = f"refused: {exc.__cause__}"
            if expected != got:
                mismatches.append(Mismatch(seq, expected, got))
            for snap in due.pop(seq, ()):
                checks.append(_check(snap, engine))
    if journal.rules_version != RULES_VERSION:
        problems = [
            *problems,
            f"the journal was written under the engine's rules version "
            f"{journal.rules_version} and this build decides by version {RULES_VERSION}: "
            "mismatches are expected; audit it with a build of the version that wrote it",
        ]
    return AuditReport(
        events_checked=events,
        decisions_checked=decisions,
        mismatches=tuple(mismatches),
        state_digest=engine.state_digest(),
        journal_sha256=digest.hexdigest() if canonical else None,
        snapshots=tuple(sorted(checks)),
        started_from=started_from,
        problems=tuple(problems),
    )


def _base_engine(journal: Journal, snapshots: Sequence[snapshot.Snapshot], base: int) -> Engine:
    """The state at the archive cut, from the base snapshot (which the archive's own audit
    vouches for)."""
    for snap in snapshots:
        if snap.header.seq == base and snapshot.problem(snap, journal) is None:
            return snapshot.load_state(snap)
    raise JournalError(
        f"{journal.path}: entries 1-{base} were moved to the archive "
        f"{journal.meta_value('archive_file')!r} and the snapshot at entry {base} cannot be "
        "loaded by this build: audit with --archive FILE, or rebuild the snapshot with "
        "`bursar journal rebase`"
    )


def _check(snap: snapshot.Snapshot, replayed: Engine) -> SnapshotCheck:
    try:
        held = snapshot.load_state(snap)
    except JournalError as exc:
        return SnapshotCheck(snap.header.seq, str(snap.path), False, str(exc))
    if snapshot.fingerprint(held) != snapshot.fingerprint(replayed):
        return SnapshotCheck(
            snap.header.seq,
            str(snap.path),
            False,
            "the state it holds differs from the replay of the journal up to its entry",
        )
    return SnapshotCheck(snap.header.seq, str(snap.path), True, "matches the replay")
