"""Journal retention: move the old entries of a journal to an archive file, keep auditing
across it.

The rule (the operator's side is in the README):

* The broker never deletes an entry by itself. The journal grows by one row per event
  (about 650 bytes per decision in the benchmark's mix).
* An archive takes the entries up to a snapshot ``S`` that the audit has just verified
  (the state it holds is the replay of entries 1..S), writes them to a separate journal
  file with the same pool and policy, and only then deletes them from the live journal,
  recording in its meta the cut (``archived_through``), the hash of entry ``S``, the
  archive's name and the SHA-256 of its canonical form. The snapshot at ``S`` (the *base*)
  is kept for good: the live journal starts from it.
* A restart loads the newest snapshot as before; it must be the base or later. A new
  build of the engine cannot load an older build's snapshots: ``rebase`` rebuilds the
  base by replaying the archive(s) with the new build.
* The audit of the live journal alone starts from the base (and says so); given the
  archives, it replays them first, checks that they chain (each starts where the one
  before ends, the last one's hash is the one the live journal recorded) and that the
  replay reaches the base's state at ``S``, and goes on into the live journal: the same
  audit as if nothing had been moved, with the whole history's canonical hash.

Archives can be chained: a second archive starts after the first one's cut.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bursar.broker import snapshot
from bursar.broker.errors import JournalError
from bursar.broker.journal import (
    Journal,
    apply_recorded,
    decode_entry_event,
    new_engine,
)

__all__ = ["ArchiveReport", "archive", "canonical_sha256", "chain", "rebase"]


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    path: Path
    first: int
    through: int
    entries: int
    sha256: str


def canonical_sha256(journal: Journal, previous: str = "") -> str:
    """The archive's identity: SHA-256 over the previous archive's hash (the chain) and
    its canonical form."""
    h = hashlib.sha256(previous.encode())
    for line in journal.canonical_lines():
        h.update(line.encode())
    return h.hexdigest()


def archive(
    state_dir: Path,
    journal: Journal,
    out: Path,
    verified: Sequence[int],
    through: int | None = None,
) -> ArchiveReport:
    """Move the entries up to the newest snapshot in ``verified`` (at most ``through``) to
    a new journal file ``out``. ``verified``: the entries of snapshots the audit has just
    found to match the replay (never pass a snapshot the audit did not check)."""
    base = journal.archived_through
    cuts = [s for s in verified if s > base and (through is None or s <= through)]
    if not cuts:
        raise JournalError(
            f"no verified snapshot after entry {base}"
            + (f" and at most {through}" if through is not None else "")
            + f" in {state_dir / snapshot.DIRNAME} to cut at; the broker takes one every "
            "--snapshot-every entries (a running broker, or one stopped cleanly, has one)"
        )
    cut = max(cuts)
    if out.exists():
        raise JournalError(f"{out} exists; an archive is always a new file")
    entry_hash = snapshot.entry_sha256(journal, cut)
    assert entry_hash is not None
    previous = journal.meta_value("archive_sha256") or ""
    target = Journal.open(out, journal.pool, journal.policy, durability="full")
    try:
        n = journal.copy_entries_to(target, base + 1, cut)
        target.set_meta(
            {
                "archive_first": str(base + 1),
                "archive_through": str(cut),
                "archive_previous_sha256": previous,
            }
        )
        digest = canonical_sha256(target, previous)
    except BaseException:
        target.close()
        out.unlink(missing_ok=True)
        raise
    target.close()
    journal.cut(
        cut,
        {
            "archived_through": str(cut),
            "archived_entry_sha256": entry_hash,
            "archive_file": out.name,
            "archive_sha256": digest,
        },
    )
    for old in snapshot.listing(state_dir):
        if old.header.seq < cut:  # of entries no longer in the journal
            old.path.unlink(missing_ok=True)
    return ArchiveReport(out, base + 1, cut, n, digest)


def chain(journal: Journal, archives: Sequence[Journal]) -> list[str]:
    """What is wrong with ``archives`` as the history before ``journal`` (empty: nothing):
    in order, contiguous, each hashed as the next one recorded."""
    problems = []
    previous = ""
    expect_first = 1
    for a in archives:
        first = int(a.meta_value("archive_first") or 0)
        last = int(a.meta_value("archive_through") or 0)
        if a.meta_line != journal.meta_line:
            problems.append(f"{a.path}: written for another pool or policy")
        if first != expect_first:
            problems.append(f"{a.path}: starts at entry {first}, expected {expect_first}")
        if (a.meta_value("archive_previous_sha256") or "") != previous:
            problems.append(f"{a.path}: does not follow the archive before it")
        previous = canonical_sha256(a, previous)
        expect_first = last + 1
    if archives:
        if expect_first - 1 != journal.archived_through:
            problems.append(
                f"the archives end at entry {expect_first - 1}, the journal was cut at "
                f"{journal.archived_through}"
            )
        if previous != journal.meta_value("archive_sha256"):
            problems.append("the archives' hash is not the one the journal recorded")
    return problems


def rebase(
    state_dir: Path,
    journal: Journal,
    archives: Sequence[Journal],
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Rebuild the base snapshot (the state at the cut) with this build of the engine, by
    replaying the archives; returns the snapshot's path."""
    problems = chain(journal, archives)
    if not archives:
        problems.append("give the archive(s) the journal's entries were moved to")
    if problems:
        raise JournalError("; ".join(problems))
    engine = new_engine(journal)
    for a in archives:
        for seq, event_json, _ in a.raw_entries():
            apply_recorded(a, engine, seq, decode_entry_event(a, seq, event_json))
            if progress is not None:
                progress(seq)
    cut = journal.archived_through
    return snapshot.write(state_dir, journal, cut, engine.now, snapshot.capture(engine))
