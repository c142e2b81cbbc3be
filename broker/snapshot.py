"""Snapshots: the engine's state as of journal entry N, so that a restart replays only the
entries after N instead of the whole history.

A snapshot is a file ``STATE/snapshots/snapshot-<seq>.bin``: one line of JSON (the
header) and then the engine, pickled and zlib-compressed. The header ties it to one
journal and one build of the engine:

* ``seq`` and ``entry_sha256``, the hash of entry ``seq`` as the journal stores it: a
  snapshot of another journal (or of entries since rewritten) is never loaded;
* ``meta_sha256``, the hash of the journal's pool and policy;
* ``code``, a hash of the engine's source (``bursar.broker``'s modules): after an
  upgrade the old state objects may not mean what the new code expects, so an old
  snapshot is ignored and the restart replays the journal from the start;
* ``payload_sha256``: a damaged file is skipped, never half-loaded.

The journal stays the one source of truth. A snapshot only saves work: deleting every
snapshot is always safe (the next start replays everything), and ``bursar journal audit``
checks each snapshot against a replay of the journal up to its entry
(:func:`fingerprint` of both must agree).

Why pickle: the state is a graph of the engine's own objects (queues, heaps, ledgers,
indexes) whose exact order matters for determinism; pickle keeps it whole, with its
sharing, at C speed. A hand-written encoding of every structure would have to be kept in
step with each of them. The file is as trusted as the journal next to it (the state
directory is the broker's own); loading refuses any class outside ``bursar`` and the
standard containers (``broker/safe_pickle.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import hashlib
import json
import logging
import os
import pickle
import time
import types
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bursar.broker import safe_pickle
from bursar.broker.errors import JournalError

if TYPE_CHECKING:
    from bursar.broker.engine import Engine
    from bursar.broker.journal import JournalStore as Journal

log = logging.getLogger(__name__)

FORMAT = "bursar-snapshot/1"
DIRNAME = "snapshots"
KEEP = 2
"""Snapshots kept: the newest, and one before it in case the newest is found damaged."""
EVERY = 2_000
"""Default journal entries between snapshots: a restart replays at most this many."""

_PREFIX, _SUFFIX = "snapshot-", ".bin"


@dataclass(frozen=True, slots=True)
class Header:
    format: str
    seq: int
    entry_sha256: str
    meta_sha256: str
    code: str
    payload_sha256: str
    payload_bytes: int
    engine_now: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    path: Path
    header: Header


# ---------------------------------------------------------------------- identity


SHELL_MODULES = frozenset(
    {
        "acquisition",
        "actuator",
        "archive",
        "audit",
        "clock",
        "config",
        "config_view",
        "invariants",
        "journal",
        "journal_view",
        "policy_apply",
        "runtime",
        "safe_pickle",
        "snapshot",
    }
)
"""``bursar.broker`` modules around the engine that define none of its state or rules: a
change to them leaves snapshots valid. Every other module of the package counts."""


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 over the source of the modules that make the engine: its rules and the
    classes of its state (``bursar.broker`` less ``SHELL_MODULES``; the service and the
    backends are packages apart and keep no engine state)."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    for f in sorted(here.glob("*.py")):
        if f.stem not in SHELL_MODULES:
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def entry_sha256(journal: Journal, seq: int) -> str | None:
    """The hash of entry ``seq`` as stored (None if there is no such entry); for the last
    entry moved to an archive, the hash recorded when it was moved."""
    if seq and seq == journal.archived_through:
        return journal.meta_value("archived_entry_sha256")
    row = journal.raw_entry(seq)
    if row is None:
        return None
    event_json, decisions_json = row
    return hashlib.sha256(f"{event_json}\n{decisions_json}".encode()).hexdigest()


def meta_sha256(journal: Journal) -> str:
    return hashlib.sha256(journal.meta_line.encode()).hexdigest()


# ---------------------------------------------------------------------- writing


def capture(engine: Engine) -> bytes:
    """The engine's state as bytes: a consistent copy, taken on the thread that owns the
    engine; everything after (hashing, compressing, writing) may run on another."""
    return pickle.dumps(engine, protocol=pickle.HIGHEST_PROTOCOL)


def write(state_dir: Path, journal: Journal, seq: int, now: float, state: bytes) -> Path:
    """Write the captured ``state`` (the engine after entry ``seq``) as a snapshot, then
    drop all but the newest ``KEEP``. Atomic: a crash leaves the old snapshots as they were.
    Safe to call from a worker thread (the journal's reads are)."""
    entry = entry_sha256(journal, seq)
    if entry is None:
        raise JournalError(f"cannot snapshot entry {seq}: the journal has no such entry")
    payload = zlib.compress(state, 1)
    header = Header(
        format=FORMAT,
        seq=seq,
        entry_sha256=entry,
        meta_sha256=meta_sha256(journal),
        code=code_fingerprint(),
        payload_sha256=hashlib.sha256(payload).hexdigest(),
        payload_bytes=len(payload),
        engine_now=now,
    )
    folder = state_dir / DIRNAME
    folder.mkdir(exist_ok=True)
    path = folder / f"{_PREFIX}{seq:020d}{_SUFFIX}"
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(json.dumps(dataclasses.asdict(header), sort_keys=True).encode() + b"\n")
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for stale in folder.glob("*.tmp"):  # left by a process killed while writing
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    with contextlib.suppress(OSError):  # the rename's own durability
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    base = journal.archived_through
    for old in listing(state_dir)[KEEP:]:
        if old.header.seq == base:
            continue  # the state at the archive cut: the entries before it are gone
        with contextlib.suppress(FileNotFoundError):
            old.path.unlink()
    return path


# ---------------------------------------------------------------------- reading


def listing(state_dir: Path) -> list[Snapshot]:
    """The snapshots in ``state_dir``, newest first (unreadable headers left out)."""
    folder = state_dir / DIRNAME
    if not folder.is_dir():
        return []
    out = []
    for p in folder.glob(f"{_PREFIX}*{_SUFFIX}"):
        try:
            out.append(Snapshot(p, _read_header(p)))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("ignoring snapshot %s: unreadable header (%s)", p, exc)
    return sorted(out, key=lambda s: s.header.seq, reverse=True)


def _read_header(path: Path) -> Header:
    with open(path, "rb") as f:
        line = f.readline(4096)
    d = json.loads(line)
    return Header(**{f.name: d[f.name] for f in dataclasses.fields(Header)})


def problem(snap: Snapshot, journal: Journal) -> str | None:
    """Why ``snap`` cannot stand for the journal's first ``seq`` entries; None if it can."""
    h = snap.header
    if h.format != FORMAT:
        return f"format {h.format!r} is not {FORMAT!r}"
    if h.code != code_fingerprint():
        return "written by another build of the engine"
    if h.meta_sha256 != meta_sha256(journal):
        return "written for another pool or policy"
    if h.seq > journal.last_seq:
        return f"it is of entry {h.seq}, past the journal's last ({journal.last_seq})"
    if h.seq < journal.archived_through:
        return f"it is of entry {h.seq}, before the archive cut ({journal.archived_through})"
    if entry_sha256(journal, h.seq) != h.entry_sha256:
        return f"the journal's entry {h.seq} is not the one it was taken after"
    return None


def load_state(snap: Snapshot) -> Engine:
    """The engine the snapshot holds. Raises ``JournalError`` if the file is damaged."""
    with open(snap.path, "rb") as f:
        f.readline(4096)
        payload = f.read()
    if hashlib.sha256(payload).hexdigest() != snap.header.payload_sha256:
        raise JournalError(f"{snap.path}: damaged (its payload does not match its hash)")
    try:
        engine = safe_pickle.loads(zlib.decompress(payload))
    except Exception as exc:
        raise JournalError(f"{snap.path}: cannot be loaded: {exc}") from exc
    from bursar.broker.engine import Engine

    if not isinstance(engine, Engine):
        raise JournalError(f"{snap.path}: holds a {type(engine).__name__}, not an engine")
    return engine


def latest(state_dir: Path, journal: Journal) -> tuple[Engine, int] | None:
    """The newest usable snapshot's engine and entry; None if there is none (replay all)."""
    for snap in listing(state_dir):
        why = problem(snap, journal)
        if why is None:
            try:
                return load_state(snap), snap.header.seq
            except JournalError as exc:
                why = str(exc)
        log.warning("not resuming from %s: %s", snap.path, why)
    return None


# ---------------------------------------------------------------------- comparing


def fingerprint(engine: Engine) -> str:
    """SHA-256 of the engine's whole state, walked generically: two engines with the same
    fingerprint hold the same objects with the same values in the same order (dicts and
    lists in their order, which the engine's determinism relies on; sets sorted, since
    their order is the process's hash seed's). Caches the engine rebuilds before reading
    are left out by its ``__getstate__``."""
    h = hashlib.sha256()
    for chunk in _walk(engine, {}):
        h.update(chunk)
    return h.hexdigest()


_SCALARS = (str, int, float, bool, type(None), bytes)


def _walk(obj: Any, seen: dict[int, tuple[int, Any]]) -> Iterator[bytes]:
    if isinstance(obj, enum.Enum):
        yield f"E{type(obj).__qualname__}.{obj.name};".encode()
        return
    if isinstance(obj, _SCALARS):
        yield f"{type(obj).__name__}:{obj!r};".encode()
        return
    if isinstance(obj, tuple):
        yield b"("
        for x in obj:
            yield from _walk(x, seen)
        yield b")"
        return
    if isinstance(obj, frozenset | set):
        # Walked in the process's own set order, so each element on its own (by value).
        yield b"{"
        yield from sorted(b"".join(_walk(x, {})) for x in obj)
        yield b"}"
        return
    if isinstance(obj, type | types.FunctionType | types.BuiltinFunctionType):
        yield f"F{getattr(obj, '__module__', '')}.{obj.__qualname__};".encode()
        return
    # Mutable containers and objects may be shared: the second visit is a reference. The
    # object is kept alive in ``seen`` so that its id cannot be reused meanwhile.
    key = id(obj)
    if key in seen:
        yield f"@{seen[key][0]};".encode()
        return
    seen[key] = (len(seen), obj)
    if isinstance(obj, list):
        yield b"["
        for x in obj:
            yield from _walk(x, seen)
        yield b"]"
    elif isinstance(obj, dict):
        yield b"<"
        yield from _items(obj, seen)
        yield b">"
    elif isinstance(obj, types.MethodType):
        yield f"M{obj.__func__.__qualname__}".encode()
        yield from _walk(obj.__self__, seen)
    elif hasattr(obj, "__fingerprint_state__"):
        yield f"O{type(obj).__qualname__}".encode()
        yield from _walk(obj.__fingerprint_state__(), seen)
    else:
        yield from _reduced(obj, seen)


def _reduced(obj: Any, seen: dict[int, tuple[int, Any]]) -> Iterator[bytes]:
    """An object as pickle sees it (``__reduce_ex__``): how it is rebuilt and its state,
    so that what an object's own reduction leaves out (a cache) is left out here too."""
    rv = obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    if isinstance(rv, str):  # a global, pickled by name
        yield f"G{rv};".encode()
        return
    func, args, state, items, pairs = (*rv, None, None, None)[:5]
    name = getattr(func, "__qualname__", type(func).__qualname__)
    yield f"R{getattr(func, '__module__', '')}.{name}".encode()
    yield from _walk(tuple(args), seen)
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        yield b"<"
        yield from _items(dict(sorted(state.items())), seen)
        yield b">"
    elif state is not None:
        yield from _walk(state, seen)
    if items is not None:
        yield from _walk(list(items), seen)
    if pairs is not None:
        yield from _walk(dict(pairs), seen)


def _items(d: dict[Any, Any], seen: dict[int, tuple[int, Any]]) -> Iterator[bytes]:
    for k, v in d.items():
        yield from _walk(k, seen)
        yield from _walk(v, seen)


# ---------------------------------------------------------------------- resuming


def base(journal: Journal, state_dir: Path) -> tuple[Engine, int]:
    """Where resuming starts: the newest usable snapshot's engine and entry, or (none
    usable) a new engine and 0. The entries after it are still to be applied."""
    from bursar.broker.journal import new_engine

    found = latest(state_dir, journal)
    archived = journal.archived_through
    if archived and found is None:
        raise JournalError(
            f"{journal.path}: entries 1-{archived} were moved to the archive "
            f"{journal.meta_value('archive_file')!r}, and no snapshot in {state_dir / DIRNAME} "
            f"that this build can load holds the state at entry {archived} or later; rebuild "
            f"it from the archive with: bursar journal rebase --state-dir {state_dir} "
            "--archive FILE"
        )
    return found if found is not None else (new_engine(journal), 0)


def apply_from(journal: Journal, engine: Engine, start: int) -> int:
    """Apply the journal's entries from ``start`` on to ``engine``; returns the last seq
    applied (``start - 1`` if none)."""
    from bursar.broker.journal import apply_recorded, decode_entry_event

    last = start - 1
    for seq, event_json, _ in journal.raw_entries(start):
        apply_recorded(journal, engine, seq, decode_entry_event(journal, seq, event_json))
        last = seq
    return last


def restore(journal: Journal, state_dir: Path) -> tuple[Engine, int]:
    """The engine as of the journal's last entry: the newest usable snapshot with the
    entries after it replayed, or (none usable) the whole journal replayed. Returns the
    engine and the snapshot's entry (0: none was used)."""
    engine, start = base(journal, state_dir)
    apply_from(journal, engine, start + 1)
    return engine, start


class Snapshotter:
    """Takes a snapshot every ``every`` journal entries (0: never): the engine is captured
    on the caller's thread right after a commit (a consistent copy, a pickle in memory),
    then compressed, hashed and written on a worker thread while requests go on. At most
    one write is in flight; if it is still going when the next is due, the next waits for
    a later commit."""

    def __init__(self, state_dir: Path, journal: Journal, every: int, last: int) -> None:
        if every < 0:
            raise ValueError(
                f"snapshot interval must be 0 (off) or a number of entries, not {every}"
            )
        self.state_dir = state_dir
        self.journal = journal
        self.every = every
        self.last = last
        """The entry of the newest snapshot (written or being written; 0: none)."""
        self.written = 0
        self.capture_s = 0.0
        """How long the last capture held the caller (the only part on its thread)."""
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: Future[Path] | None = None

    def after_commit(self, seq: int, engine: Engine) -> None:
        if self.every == 0 or seq - self.last < self.every:
            return
        if self._inflight is not None:
            if not self._inflight.done():
                return
            self._reap()
        t0 = time.perf_counter()
        state = capture(engine)
        self.capture_s = time.perf_counter() - t0
        self.last = seq
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="bursar-snapshot")
        self._inflight = self._pool.submit(
            write, self.state_dir, self.journal, seq, engine.now, state
        )

    def _reap(self) -> None:
        fut, self._inflight = self._inflight, None
        if fut is None:
            return
        try:
            path = fut.result()
        except Exception as exc:  # a snapshot only saves work: never fail a request for it
            log.warning("snapshot not written (%s); the journal is unaffected", exc)
        else:
            self.written += 1
            log.debug("snapshot %s written", path)

    def close(self, seq: int, engine: Engine) -> None:
        """Finish the write in flight, and take a last snapshot when enough entries came
        since the newest one that a restart would otherwise replay them."""
        self._reap()
        if self.every and seq - self.last >= min(self.every, CLOSE_MIN):
            try:
                write(self.state_dir, self.journal, seq, engine.now, capture(engine))
                self.last = seq
                self.written += 1
            except Exception as exc:
                log.warning("snapshot at close not written (%s)", exc)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


CLOSE_MIN = 1_000
"""Entries since the newest snapshot that make closing the broker write one more."""
