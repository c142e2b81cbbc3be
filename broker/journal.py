"""The durable journal: every applied event and the decisions it produced, in SQLite.

The journal is the source of truth: the engine's state is
``fold(apply, events)``, so a restart is :func:`replay` and an audit re-derives every
row. The file holds everything a replay needs: the pool and policy specs live in the
``meta`` table, one row per applied event lives in ``entries``::

    meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)      -- format, pool, policy
    entries(seq INTEGER PRIMARY KEY,                     -- 1, 2, 3, ...
            event TEXT NOT NULL,                         -- canonical JSON of the event
            decisions TEXT NOT NULL)                     -- JSON list of canonical decisions
    decision_index(seq, idx, kind, campaign, ref, at)    -- one row per decision, derived

``decision_index`` is brought up to date in bulk (before a query reads it, and every second
by the service), so queries (ListDecisions by campaign, lease, kind or time) read indexed
columns instead of scanning the entries' text; it is derived data, outside the canonical
form and the hashes.

Durability. The database runs in WAL mode and :meth:`Journal.append` commits before it
returns (the service appends with ``commit=False`` and commits a batch of entries at once
with :meth:`Journal.commit`, answering nothing before), so a decision acknowledged after
``append`` survives the process being killed
(SIGKILL, OOM): with ``synchronous=NORMAL`` the commit has been written to the WAL file,
and the kernel keeps it even if the process dies. It does not survive a power loss or a
kernel crash, because NORMAL does not fsync on commit; ``durability="full"`` does
(``synchronous=FULL``) at the price of one fsync per append (see
``benchmarks/bench_journal.py`` for what that costs on a given disk).

Canonical form. The SQLite file's bytes depend on page layout and history, so the
journal's identity is :meth:`Journal.canonical_bytes`: a meta line, then one line per
entry, each line canonical JSON (sorted keys, no spaces) ending in ``\\n``. The same
specs and the same event sequence give the same bytes and the same :meth:`Journal.sha256`.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from bursar.broker import codec
from bursar.broker.decisions import Decision
from bursar.broker.errors import JournalError, RequestError
from bursar.broker.events import ApplyPolicy, Event
from bursar.broker.policy import PolicySpec, PoolSpec
from bursar.broker.specs import shown, spec_diff, spec_from_dict, spec_to_dict

if TYPE_CHECKING:
    from bursar.broker.engine import Engine

__all__ = [
    "FORMAT",
    "JOURNAL_FILENAME",
    "Durability",
    "Entry",
    "Journal",
    "JournalStore",
    "PolicyMismatch",
    "apply_recorded",
    "canonical_line",
    "decisions_json",
    "decode_entry_event",
    "new_engine",
    "open_store",
    "replay",
    "spec_diff",
    "spec_from_dict",
    "spec_to_dict",
]

FORMAT = "bursar-journal/1"
"""Written to ``meta``; a journal with another format is refused rather than misread."""

JOURNAL_FILENAME = "journal.sqlite"
"""The journal's file name inside a broker state directory (``--state-dir``)."""

Durability = Literal["normal", "full"]

Entry = tuple[int, Event, list[Decision]]

_SYNCHRONOUS: dict[str, str] = {"normal": "NORMAL", "full": "FULL"}

_CHECKPOINT_ROUNDS = 4
"""PASSIVE checkpoints :meth:`Journal.checkpoint` runs at most, one after another."""

_WAL_RESTART_FRAMES = 10_000
"""WAL frames (about 40 MB at 4 KiB pages) past which :meth:`Journal.checkpoint` restarts
the WAL even if that makes an append wait for it (see there)."""

# Rows are read in pages so that no read transaction stays open while a caller works
# through a long iteration: an open reader would stop WAL checkpoints and let the -wal
# file grow for as long as the caller takes.
_PAGE = 1000

_INSERT = "INSERT INTO entries (seq, event, decisions) VALUES (?, ?, ?)"

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE entries (seq INTEGER PRIMARY KEY, event TEXT NOT NULL, decisions TEXT NOT NULL)",
)

# The decision index: one row per decision, with the columns queries filter on. It is
# derived data (the canonical form and the hashes read only ``entries``) and is brought up
# to date in bulk, by one INSERT ... SELECT over the entries not indexed yet, before a query
# reads it and from the service's background task: keeping it in the append itself (a
# trigger) cost 25 us on top of the append's 14 us (measured), on every request.
_INDEX_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS decision_index (seq INTEGER NOT NULL, idx INTEGER NOT NULL, "
    "kind TEXT NOT NULL, campaign TEXT, ref TEXT, at REAL, PRIMARY KEY (seq, idx)) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS decision_index_campaign ON decision_index (campaign, seq)",
    "CREATE INDEX IF NOT EXISTS decision_index_ref ON decision_index (ref, seq)",
    # No index on kind alone: each index costs about 5 us per append (measured), and a
    # kind filter walks the table in seq order, stopping once a page is full.
)
_INDEX_ROWS = (
    "SELECT {seq}, d.key, json_extract(d.value, '$.kind'), json_extract(d.value, '$.campaign'), "
    "coalesce(json_extract(d.value, '$.lease_id'), json_extract(d.value, '$.request_id')), "
    "json_extract(d.value, '$.at') FROM json_each({decisions}) AS d"
)
_INDEX_BACKFILL = (
    "INSERT OR IGNORE INTO decision_index (seq, idx, kind, campaign, ref, at) "
    + _INDEX_ROWS.format(seq="e.seq", decisions="e.decisions").replace(
        "FROM json_each(e.decisions) AS d",
        "FROM entries AS e, json_each(e.decisions) AS d WHERE e.seq > ? AND e.seq <= ?",
    )
)

DecisionRow = tuple[int, int, dict[str, Any]]
"""(seq, index within the entry, the decision as canonical data)."""


# --- canonical form ---------------------------------------------------------------------


def canonical_line(seq: int, event_json: str, decisions_json: str) -> str:
    """One entry in the journal's canonical form (without the trailing newline).

    The stored texts are parsed and re-dumped, so the line depends on the values only,
    never on how a row happens to be spelled in the file.
    """
    return codec.dumps(
        {"seq": seq, "event": json.loads(event_json), "decisions": json.loads(decisions_json)}
    )


def decisions_json(decisions: Sequence[Decision]) -> str:
    return codec.dumps_plain([codec.to_dict(d) for d in decisions])


# --- the journal ---------------------------------------------------------------------


def _read_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str] | None:
    """The stored meta, or None for an empty database."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    if "meta" in tables:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if tables:
        # Never add tables to someone else's database.
        raise JournalError(f"{path} is an SQLite file but not a Bursar journal")
    return None


def new_meta(pool: PoolSpec, policy: PolicySpec | None) -> dict[str, str]:
    """The meta rows of a new journal."""
    from bursar.broker.engine import RULES_VERSION

    return {
        "format": FORMAT,
        "pool": codec.dumps(spec_to_dict(pool)),
        "policy": codec.dumps(spec_to_dict(policy or PolicySpec())),
        # Not part of the canonical form (``meta_line``): hashes stay what they were.
        "rules_version": str(RULES_VERSION),
    }


def _create(
    conn: sqlite3.Connection, path: Path, pool: PoolSpec | None, policy: PolicySpec | None
) -> dict[str, str]:
    if pool is None:
        raise JournalError(f"{path} is empty; to create a journal there, pass the pool spec")
    for statement in (*_SCHEMA, *_INDEX_SCHEMA):
        conn.execute(statement)
    meta = new_meta(pool, policy)
    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
    return meta


POLICY_CURRENT = "policy_current"
"""The meta row holding the policy in force (the ``policy`` row with every ``apply_policy``
entry folded in, kept in the same transaction as the entry that changed it); absent until
the first change. Outside the canonical form: the entries themselves record each change."""

POLICY_CHANGED_AT = "policy_changed_at"
"""The meta row holding the entry of the last policy change."""


def _current_policy(meta: Mapping[str, str], stored: PolicySpec, path: Path) -> PolicySpec:
    text = meta.get(POLICY_CURRENT)
    if text is None:
        return stored
    try:
        return spec_from_dict(PolicySpec, json.loads(text))
    except json.JSONDecodeError as exc:
        raise JournalError(f"{path}: damaged meta table ({POLICY_CURRENT}: {exc})") from exc


def checked_specs(
    meta: Mapping[str, str], path: Path, pool: PoolSpec | None, policy: PolicySpec | None
) -> tuple[PoolSpec, PolicySpec, str]:
    """The stored pool and policy and the canonical meta line, from a journal's meta; any
    ``pool``/``policy`` given is checked against them (see :meth:`Journal.open`)."""
    if meta.get("format") != FORMAT:
        raise JournalError(f"{path}: journal format {meta.get('format')!r} is not {FORMAT!r}")
    try:
        stored_pool = spec_from_dict(PoolSpec, json.loads(meta["pool"]))
        stored_policy = spec_from_dict(PolicySpec, json.loads(meta["policy"]))
    except (KeyError, json.JSONDecodeError) as exc:
        raise JournalError(f"{path}: damaged meta table ({exc})") from exc
    if pool is not None and spec_to_dict(pool) != spec_to_dict(stored_pool):
        changes = "; ".join(
            f"{key}: stored {shown(a)}, given {shown(b)}"
            for key, a, b in spec_diff(spec_to_dict(stored_pool), spec_to_dict(pool))
        )
        raise JournalError(
            f"{path}: the pool spec given differs from the one the journal was written "
            f"with ({changes}); replaying under another pool would not reproduce its "
            "decisions. To go on with the journal's pool, restore those values in the "
            "config or leave --config out; to serve the new one, drain and stop this "
            "broker and start one on a new --state-dir (it starts with no leases, full "
            "buckets and new tokens; the old directory stays as the record of its "
            "decisions)"
        )
    current = _current_policy(meta, stored_policy, path)
    if policy is not None and spec_to_dict(policy) != spec_to_dict(current):
        raise PolicyMismatch(path, spec_diff(spec_to_dict(current), spec_to_dict(policy)))
    meta_line = codec.dumps(
        {
            "format": FORMAT,
            "pool": spec_to_dict(stored_pool),
            "policy": spec_to_dict(stored_policy),
        }
    )
    return stored_pool, stored_policy, meta_line


class PolicyMismatch(JournalError):
    """The policy given to open a journal is not the one in force there. ``changes``:
    (dotted key, in force, given) per differing setting."""

    def __init__(self, path: Path, changes: Sequence[tuple[str, Any, Any]]) -> None:
        self.path = path
        self.changes = tuple(changes)
        super().__init__(self.explain())

    def explain(self, config: str = "CONFIG") -> str:
        """The refusal, with the commands that apply the new policy from ``config``."""
        state = self.path.parent
        keys = "; ".join(f"{k}: in force {shown(a)}, given {shown(b)}" for k, a, b in self.changes)
        return (
            f"{self.path}: the policy given differs from the one in force in the journal "
            f"({keys}). To serve the new policy with this state (its leases, buckets and "
            f"tokens), apply it first: with the broker stopped, `bursar policy apply "
            f"--state-dir {state} --config {config}`, then start it with that config; or, "
            f"while it runs on the old policy, `bursar policy apply --config {config} "
            f"--admin-token-file {state / 'admin.token'}` (with --target if not the default). "
            "To keep the policy in force, restore those values in the config or leave "
            "--config out. A broker on a new --state-dir starts with the new policy but no "
            "leases, full buckets and new tokens"
        )


MAX_SEQ = 2**63 - 1
"""The largest sequence number SQLite stores (a signed 64-bit INTEGER)."""


def _seq_bound(start_seq: int) -> int:
    """A client's start position (a uint64 on the wire) as SQLite can compare it: past the
    last possible entry it simply finds nothing."""
    return max(1, min(start_seq, MAX_SEQ))


class JournalStore(abc.ABC):
    """What every journal store offers: the SQLite file (:class:`Journal`, the embedded
    default) and PostgreSQL (``broker/journal_pg.py``). Both hold the same rows, so the
    canonical form, its hash, replay and the audit are the same on either; only the
    statements that read and write them differ.

    A store opens with its pool and policy checked (:func:`checked_specs`) and keeps
    ``path`` (where it is, for messages), ``pool``, ``policy``, ``durability`` and the
    canonical ``meta_line``.
    """

    path: Path
    pool: PoolSpec
    policy: PolicySpec
    durability: Durability
    _meta_line: str
    _lock: threading.RLock
    _conn: Any
    _last_seq: int
    _open: tuple[int, int] | None
    """While entries wait for :meth:`commit`: the last seq and the last indexed entry as
    they were before the first of them, where :meth:`rollback` puts them back."""

    _P = "?"
    """The store's parameter placeholder."""
    _ENTRIES = "entries"
    _INDEX = "decision_index"

    @abc.abstractmethod
    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows a read-only statement returns."""

    _CLASH: type[Exception] = sqlite3.IntegrityError
    """What the store raises for an entry whose seq exists already."""
    _ERROR: type[Exception] = sqlite3.Error

    @property
    def where(self) -> str:
        """The journal's place, for messages."""
        return str(self.path)

    @contextlib.contextmanager
    def _write_errors(self, seq: int) -> Iterator[None]:
        """The store's errors inside a write of entry ``seq``, as JournalError."""
        try:
            yield
        except self._CLASH as exc:
            # Seqs come from this object's counter, so a clash means a second writer.
            raise JournalError(
                f"{self.where}: entry {seq} already exists; is another broker writing this journal?"
            ) from exc
        except self._ERROR as exc:
            raise JournalError(f"{self.where}: append failed: {exc}") from exc

    # ----- what each store implements

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def append(
        self, event: Event, decisions: Sequence[Decision], *, commit: bool = True
    ) -> int: ...

    @abc.abstractmethod
    def append_many(self, items: Iterable[tuple[Event, Sequence[Decision]]]) -> list[int]: ...

    @property
    def uncommitted(self) -> bool:
        """True while entries appended with ``commit=False`` wait for :meth:`commit`."""
        return self._open is not None

    def commit(self) -> None:
        """Commit the entries appended with ``commit=False`` (nothing if there are none).

        A failed commit rolls them back and raises :class:`JournalError`."""
        with self._lock:
            if self._open is None:
                return
            try:
                with self._write_errors(self._last_seq):
                    self._conn.execute("COMMIT")
            except BaseException:
                self.rollback()
                raise
            self._open = None

    @abc.abstractmethod
    def rollback(self) -> None: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @property
    @abc.abstractmethod
    def last_seq(self) -> int: ...

    @abc.abstractmethod
    def raw_entries(self, start: int = 0) -> Iterator[tuple[int, str, str]]: ...

    @abc.abstractmethod
    def raw_entry(self, seq: int) -> tuple[str, str] | None: ...

    @abc.abstractmethod
    def _decisions_before(self, before: int, n: int) -> list[tuple[int, str]]:
        """Up to ``n`` entries' ``(seq, decisions_json)`` with ``seq < before``, newest first."""

    @abc.abstractmethod
    def ensure_index(self) -> None: ...

    @abc.abstractmethod
    def update_index(self, limit: int | None = None) -> int: ...

    def find_decisions(
        self,
        *,
        start_seq: int = 1,
        campaign: str = "",
        kinds: Iterable[str] = (),
        ref: str = "",
        since: float = 0.0,
        limit: int = 100,
    ) -> tuple[list[DecisionRow], int]:
        """Decisions matching every filter given, oldest first, from the decision index.

        ``ref`` matches a lease or request id. A page holds at most ``limit`` decisions and
        never splits an entry (unless one entry alone has more); the second value is the seq
        to start the next page from, 0 when there is no more.
        """
        self.update_index()
        p = self._P
        where: list[str] = []
        args: list[Any] = []
        if campaign:
            where.append(f"campaign = {p}")
            args.append(campaign)
        kinds = sorted(set(kinds))
        if kinds:
            where.append(f"kind IN ({','.join([p] * len(kinds))})")
            args.extend(kinds)
        if ref:
            where.append(f"ref = {p}")
            args.append(ref)
        if since:
            where.append(f"at >= {p}")
            args.append(since)

        def hits_from(first: str, seq: int, n: int | None) -> list[tuple[int, int]]:
            sql = " AND ".join([f"seq {first} {p}", *where])
            rows = self._rows(
                f"SELECT seq, idx FROM {self._INDEX} WHERE {sql} ORDER BY seq, idx"
                + (f" LIMIT {p}" if n is not None else ""),
                [seq, *args, *([n] if n is not None else [])],
            )
            return [(int(s), int(i)) for s, i in rows]

        hits = hits_from(">=", _seq_bound(start_seq), limit + 1)
        next_seq = 0
        if len(hits) > limit:
            last = hits[limit][0]
            page = [h for h in hits[:limit] if h[0] != last]
            if page:
                hits, next_seq = page, last
            else:
                # One entry holds more than a page: return it whole.
                hits = hits_from("=", last, None)
                more = hits_from(">=", last + 1, 1)
                next_seq = more[0][0] if more else 0
        seqs = sorted({h[0] for h in hits})
        texts: dict[int, list[dict[str, Any]]] = {}
        for i in range(0, len(seqs), 500):
            chunk = seqs[i : i + 500]
            rows = self._rows(
                f"SELECT seq, decisions FROM {self._ENTRIES} "
                f"WHERE seq IN ({','.join([p] * len(chunk))})",
                chunk,
            )
            texts.update((int(seq), json.loads(text)) for seq, text in rows)
        return [(seq, idx, texts[seq][idx]) for seq, idx in hits], next_seq

    def decisions_from(self, start_seq: int, limit: int) -> list[tuple[int, list[dict[str, Any]]]]:
        """The entries from ``start_seq`` on (at most ``limit``), each as its decisions."""
        p = self._P
        rows = self._rows(
            f"SELECT seq, decisions FROM {self._ENTRIES} WHERE seq >= {p} ORDER BY seq LIMIT {p}",
            (_seq_bound(start_seq), limit),
        )
        return [(int(seq), json.loads(text)) for seq, text in rows]

    @abc.abstractmethod
    def meta_value(self, key: str) -> str | None: ...

    @abc.abstractmethod
    def set_meta(self, meta: Mapping[str, str]) -> None: ...

    def manual_checkpoints(self) -> None:
        """Take over the store's checkpoints (see :meth:`checkpoint`); nothing by default."""
        return

    def checkpoint(self) -> tuple[int, int]:
        """Checkpoint the store's log from a worker thread; (0, 0) where the store's server
        does its own."""
        return 0, 0

    # ----- the policy in force

    @property
    def current_policy(self) -> PolicySpec:
        """The policy in force after the last entry: the one the journal was written with
        (``policy``) as every ``apply_policy`` entry since changed it."""
        text = self.meta_value(POLICY_CURRENT)
        return (
            self.policy
            if text is None
            else _current_policy({POLICY_CURRENT: text}, self.policy, self.path)
        )

    @property
    def policy_changed_at(self) -> int:
        """The entry of the last policy change (0: the policy is the one it was written
        with)."""
        return int(self.meta_value(POLICY_CHANGED_AT) or 0)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- reading

    def entries(self, start: int = 0) -> Iterator[Entry]:
        """``(seq, event, decisions)`` for every entry with ``seq >= start``, in order."""
        for seq, event_json, decisions_json in self.raw_entries(start):
            try:
                event = codec.decode_event(event_json)
            except (ValueError, KeyError, TypeError) as exc:
                raise JournalError(f"{self.path}: entry {seq} cannot be decoded: {exc}") from exc
            yield seq, event, self._decode_decisions(seq, decisions_json)

    def _decode_decisions(self, seq: int, decisions_json: str) -> list[Decision]:
        try:
            return [codec.decision_from_dict(d) for d in json.loads(decisions_json)]
        except (ValueError, KeyError, TypeError) as exc:
            raise JournalError(f"{self.path}: entry {seq} cannot be decoded: {exc}") from exc

    def tail(self, n: int) -> list[tuple[int, Decision]]:
        """The last ``n`` decisions, oldest first, each with the seq of its entry."""
        out: list[tuple[int, Decision]] = []
        if n <= 0:
            return out
        before = self.last_seq + 1
        while len(out) < n:
            page = self._decisions_before(before, _PAGE)
            if not page:
                break
            for seq, decisions_json in page:
                ds = self._decode_decisions(seq, decisions_json)
                out.extend((seq, d) for d in reversed(ds))
                if len(out) >= n:
                    break
            before = page[-1][0]
        out = out[:n]
        out.reverse()
        return out

    # ----- canonical form

    @property
    def meta_line(self) -> str:
        """The first line of the canonical form: format, pool spec and policy spec."""
        return self._meta_line

    def canonical_lines(self) -> Iterator[str]:
        """The canonical form line by line, each ending in a newline."""
        yield self._meta_line + "\n"
        for seq, event_json, decisions_json in self.raw_entries():
            try:
                line = canonical_line(seq, event_json, decisions_json)
            except ValueError as exc:
                raise JournalError(f"{self.path}: entry {seq} is not valid JSON: {exc}") from exc
            yield line + "\n"

    def canonical_bytes(self) -> bytes:
        """The journal's canonical form: byte-identical for the same specs and events."""
        return "".join(self.canonical_lines()).encode()

    def sha256(self) -> str:
        """SHA-256 (hex) of :meth:`canonical_bytes`, computed without holding it in memory."""
        h = hashlib.sha256()
        for line in self.canonical_lines():
            h.update(line.encode())
        return h.hexdigest()

    # ----- archiving (see broker/archive.py)

    @property
    def rules_version(self) -> int:
        """The engine's rules version the journal was written under (1: from before the
        version was recorded)."""
        return int(self.meta_value("rules_version") or 1)

    @property
    def archived_through(self) -> int:
        """The last entry moved to an archive (0: none); the file holds the entries after."""
        return int(self.meta_value("archived_through") or 0)


class Journal(JournalStore):
    """An append-only, SQLite-backed record of events and decisions.

    Open with :meth:`Journal.open`. One process writes a journal; any number may read it
    at the same time (WAL). Methods are safe to call from several threads of one process.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        pool: PoolSpec,
        policy: PolicySpec,
        meta_line: str,
        durability: Durability,
    ) -> None:
        # Use Journal.open(); the constructor only assembles an already-validated file.
        self._conn = conn
        self._lock = threading.RLock()
        self.path = path
        self.pool = pool
        self.policy = policy
        self.durability = durability
        self._meta_line = meta_line
        self._last_seq: int = self._max_seq()
        self._indexed = 0
        """The last entry whose decisions are in the decision index (the writer's view)."""
        self._open: tuple[int, int] | None = None
        """While entries wait for :meth:`commit`: ``_last_seq`` and ``_indexed`` as they were
        before the first of them, where :meth:`rollback` puts them back."""

    # ----- opening

    @classmethod
    def open(
        cls,
        path: str | Path,
        pool: PoolSpec | None = None,
        policy: PolicySpec | None = None,
        *,
        durability: Durability = "normal",
    ) -> Journal:
        """Open the journal at ``path``, creating it if it does not exist.

        Creating needs ``pool`` (``policy`` defaults to ``PolicySpec()``); both are stored
        so that the file alone can rebuild the engine. Opening an existing journal checks
        any ``pool``/``policy`` given against the stored ones and raises
        :class:`JournalError` if they differ: replaying events under another policy would
        not reproduce the recorded decisions. Pass neither to just read a journal.
        """
        if durability not in _SYNCHRONOUS:
            raise ValueError(f"durability must be 'normal' or 'full', not {durability!r}")
        path = Path(path)
        exists = path.exists()
        if not exists and pool is None:
            raise JournalError(
                f"no journal at {path}; to create one, pass the pool spec (the broker does "
                "this on its first start)"
            )
        if not exists and not path.parent.is_dir():
            raise JournalError(f"cannot create journal {path}: {path.parent} is not a directory")
        try:
            # isolation_level=None: transactions are begun and committed explicitly below,
            # so none is ever left open by the module's implicit BEGIN.
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from exc
        try:
            return cls._setup(conn, path, pool, policy, durability)
        except BaseException:
            conn.close()
            raise

    @classmethod
    def _setup(
        cls,
        conn: sqlite3.Connection,
        path: Path,
        pool: PoolSpec | None,
        policy: PolicySpec | None,
        durability: Durability,
    ) -> Journal:
        try:
            # Another process may be appending; wait for its commit instead of failing.
            conn.execute("PRAGMA busy_timeout = 10000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise JournalError(
                    f"{path}: SQLite refused WAL mode (got {mode!r}); put the state directory "
                    "on a local filesystem"
                )
            conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[durability]}")
            # The usual case, an existing journal, is read without taking the write lock,
            # so that auditing or tailing never makes a live broker's append wait.
            meta = _read_meta(conn, path)
            if meta is None:
                # IMMEDIATE: two brokers starting on one new file must not both write it.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    meta = _read_meta(conn, path) or _create(conn, path, pool, policy)
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"cannot open journal {path}: {exc}") from exc

        stored_pool, stored_policy, meta_line = checked_specs(meta, path, pool, policy)
        return cls(conn, path, stored_pool, stored_policy, meta_line, durability)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _note_policy(self, event: Event, seq: int) -> None:
        """Inside the transaction that appends entry ``seq``: keep the policy in force."""
        self._conn.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            (
                (POLICY_CURRENT, codec.dumps(spec_to_dict(event.policy))),  # type: ignore[attr-defined]
                (POLICY_CHANGED_AT, str(seq)),
            ),
        )

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r}, entries={self._last_seq})"

    # ----- checkpoints

    def manual_checkpoints(self) -> None:
        """Turn off SQLite's automatic checkpoints on this connection; the caller runs
        :meth:`checkpoint`, on a worker thread, instead.

        An automatic checkpoint runs inside the commit that takes the WAL past 1000 pages,
        and a checkpoint fsyncs the WAL and the database file (the only fsyncs under
        ``synchronous=NORMAL``): on a busy disk that one commit, and so every call waiting
        on the service's event loop, took hundreds of milliseconds to seconds."""
        with self._lock:
            self._conn.execute("PRAGMA wal_autocheckpoint = 0")

    def checkpoint(self) -> tuple[int, int]:
        """Copy the WAL's committed frames into the database file, on a connection of its
        own (not under this object's lock): safe from another thread while appends go on.
        Returns (frames in the WAL, frames copied).

        PASSIVE: it never makes an append wait. The WAL starts over only once a checkpoint
        has copied all of it before the next append; so it goes round again (up to
        ``_CHECKPOINT_ROUNDS`` times) while appends landed during the last round, each
        round copying only those. A writer that never pauses could still grow the WAL
        without bound: past ``_WAL_RESTART_FRAMES`` the checkpoint is a RESTART, which waits
        for a gap between appends and holds the next one until it is done."""
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute(f"PRAGMA synchronous = {_SYNCHRONOUS[self.durability]}")
                _, log, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                for _ in range(_CHECKPOINT_ROUNDS - 1):
                    _, again, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if again == log:  # nothing was appended meanwhile: the WAL starts over
                        break
                    log = again
                if log > _WAL_RESTART_FRAMES:
                    _, log, done = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                return log, done
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: checkpoint failed: {exc}") from exc

    # ----- writing

    def append(self, event: Event, decisions: Sequence[Decision], *, commit: bool = True) -> int:
        """Record one applied event and its decisions; returns the entry's ``seq``.

        Committed before it returns: only then may the decisions be acknowledged. With
        ``commit=False`` the entry joins an open transaction (begun by the first such
        append) and is durable only after :meth:`commit`; until then nothing that depends
        on it may be acknowledged, and :meth:`rollback` drops every entry since the last
        commit. The service uses it to commit the entries of requests that arrive
        together in one transaction.
        """
        row = (codec.encode(event), decisions_json(decisions))
        with self._lock:
            seq = self._last_seq + 1
            with self._write_errors(seq):
                if type(event) is ApplyPolicy and commit and self._open is None:
                    # Two statements (the entry and the policy in force): one transaction.
                    self._conn.execute("BEGIN IMMEDIATE")
                    try:
                        self._conn.execute(_INSERT, (seq, *row))
                        self._note_policy(event, seq)
                        self._conn.execute("COMMIT")
                    except BaseException:
                        self._conn.execute("ROLLBACK")
                        raise
                elif commit and self._open is None:
                    # A lone INSERT in autocommit mode is its own transaction, committed when
                    # execute() returns; one statement instead of BEGIN/INSERT/COMMIT is ~25%
                    # faster.
                    self._conn.execute(_INSERT, (seq, *row))
                else:
                    if self._open is None:
                        self._conn.execute("BEGIN IMMEDIATE")
                        self._open = (self._last_seq, self._indexed)
                    self._conn.execute(_INSERT, (seq, *row))
                    if type(event) is ApplyPolicy:
                        self._note_policy(event, seq)
                    if commit:
                        self._conn.execute("COMMIT")
                        self._open = None
            self._last_seq = seq
            return seq

    def rollback(self) -> None:
        """Drop the entries appended with ``commit=False`` since the last commit."""
        with self._lock:
            if self._open is None:
                return
            # A connection that fails here (closed, or the disk gone) commits nothing more.
            with contextlib.suppress(sqlite3.Error):
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            self._last_seq, self._indexed = self._open
            self._open = None

    def append_many(self, items: Iterable[tuple[Event, Sequence[Decision]]]) -> list[int]:
        """Record several entries in one transaction (all or none); returns their seqs.

        One commit for the batch, which is what makes it faster than ``append`` in a
        loop: use it where nothing is acknowledged between the events (a simulator run,
        an import).
        """
        items = list(items)
        rows = [(codec.encode(ev), decisions_json(ds)) for ev, ds in items]
        with self._lock:
            first = self._last_seq + 1
            seqs = list(range(first, first + len(rows)))
            if not seqs:
                return seqs
            with self._write_errors(first):
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(
                        _INSERT, [(s, *r) for s, r in zip(seqs, rows, strict=True)]
                    )
                    for s, (ev, _) in zip(seqs, items, strict=True):
                        if type(ev) is ApplyPolicy:
                            self._note_policy(ev, s)
                    self._conn.execute("COMMIT")
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
            self._last_seq = seqs[-1]
            return seqs

    # ----- reading

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]

    @property
    def last_seq(self) -> int:
        """The highest seq in the file (0 for an empty journal), including other writers'."""
        with self._lock:
            return self._max_seq()

    def _max_seq(self) -> int:
        # Past entries moved to an archive the numbering goes on from the cut, even when
        # the journal holds no entry after it yet.
        row = self._conn.execute(
            "SELECT MAX(COALESCE((SELECT MAX(seq) FROM entries), 0), "
            "COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'archived_through'), 0))"
        ).fetchone()
        return row[0]

    def raw_entries(self, start: int = 0) -> Iterator[tuple[int, str, str]]:
        """``(seq, event_json, decisions_json)`` for each entry with ``seq >= start``, as stored."""
        after = start - 1
        while True:
            with self._lock:
                page = self._conn.execute(
                    "SELECT seq, event, decisions FROM entries WHERE seq > ? ORDER BY seq LIMIT ?",
                    (after, _PAGE),
                ).fetchall()
            if not page:
                return
            yield from page
            after = page[-1][0]

    def raw_entry(self, seq: int) -> tuple[str, str] | None:
        """``(event_json, decisions_json)`` of entry ``seq`` as stored; None if there is none."""
        if not 1 <= seq <= MAX_SEQ:
            return None
        with self._lock:
            row = self._conn.execute(
                "SELECT event, decisions FROM entries WHERE seq = ?", (seq,)
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    def _decisions_before(self, before: int, n: int) -> list[tuple[int, str]]:
        with self._lock:
            return self._conn.execute(
                "SELECT seq, decisions FROM entries WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                (before, n),
            ).fetchall()

    # ----- the decision index

    def ensure_index(self) -> None:
        """Create the decision index if this journal predates it, and bring it up to date.

        Called by the writer when it opens the journal (readers never write)."""
        with self._lock, self._write_errors(self._last_seq):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                # A trigger kept the index in earlier builds: the bulk update replaces it.
                self._conn.execute("DROP TRIGGER IF EXISTS decision_index_fill")
                for statement in _INDEX_SCHEMA:
                    self._conn.execute(statement)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._indexed = self._conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM decision_index"
            ).fetchone()[0]
        self.update_index()

    def update_index(self, limit: int | None = None) -> int:
        """Index the decisions of the entries appended since the last update (at most
        ``limit`` entries), in one statement; returns how many entries it indexed. Only the
        writer calls it."""
        with self._lock:
            open_batch = self._open is not None
            # Entries waiting for their commit are indexed after it: the index must never
            # hold a decision the journal may still drop. The committed ones are indexed
            # inside the open transaction (a rollback takes ``_indexed`` back with it).
            last = self._open[0] if self._open is not None else self._last_seq
            if self._indexed >= last:
                return 0
            start = self._indexed
            if limit is not None:
                last = min(last, start + limit)
            with self._write_errors(last):
                if open_batch:
                    self._conn.execute(_INDEX_BACKFILL, (start, last))
                else:
                    self._conn.execute("BEGIN IMMEDIATE")
                    try:
                        self._conn.execute(_INDEX_BACKFILL, (start, last))
                        self._conn.execute("COMMIT")
                    except BaseException:
                        self._conn.execute("ROLLBACK")
                        raise
            self._indexed = last
            return last - start

    def meta_value(self, key: str) -> str | None:
        with self._lock:
            row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def copy_entries_to(self, other: Journal, first: int, last: int) -> int:
        """Copy entries ``first``..``last`` as stored (same seqs) into ``other``, an empty
        journal of the same pool and policy, in one transaction; returns how many."""
        n = 0
        with other._lock, other._write_errors(first):
            other._conn.execute("BEGIN IMMEDIATE")
            try:
                for seq, event_json, decisions_json in self.raw_entries(first):
                    if seq > last:
                        break
                    other._conn.execute(_INSERT, (seq, event_json, decisions_json))
                    n += 1
                other._conn.execute("COMMIT")
            except BaseException:
                other._conn.execute("ROLLBACK")
                raise
            other._last_seq = max(other._last_seq, last if n else other._last_seq)
        return n

    def cut(self, through: int, meta: Mapping[str, str]) -> None:
        """Delete entries up to ``through`` (and their index rows) and record ``meta``, in
        one transaction: either the journal still holds them or the meta says where they
        went."""
        with self._lock, self._write_errors(through):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.execute("DELETE FROM entries WHERE seq <= ?", (through,))
                self._conn.execute("DELETE FROM decision_index WHERE seq <= ?", (through,))
                self._conn.executemany(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta.items()
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def meta(self) -> dict[str, str]:
        """Every meta row (``bursar journal migrate`` copies them)."""
        with self._lock:
            return dict(self._conn.execute("SELECT key, value FROM meta").fetchall())

    def set_meta(self, meta: Mapping[str, str]) -> None:
        with self._lock, self._write_errors(self._last_seq):
            self._conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta.items()
            )


def open_store(
    location: str | Path,
    pool: PoolSpec | None = None,
    policy: PolicySpec | None = None,
    *,
    durability: Durability = "normal",
) -> JournalStore:
    """Open the journal ``location`` names: a ``postgresql://`` URL (``broker/journal_pg.py``,
    needs the ``postgres`` extra) or an SQLite file."""
    if str(location).startswith(("postgresql://", "postgres://")):
        try:
            from bursar.broker.journal_pg import PgJournal
        except ImportError as exc:
            raise JournalError(
                f"a PostgreSQL journal needs psycopg: pip install 'bursar-broker[postgres]' ({exc})"
            ) from exc
        return PgJournal.open(str(location), pool, policy, durability=durability)
    return Journal.open(location, pool, policy, durability=durability)


def new_engine(journal: JournalStore) -> Engine:
    """A fresh engine built from the specs the journal was written with."""
    from bursar.broker.engine import Engine  # the engine is optional for reading a journal

    return Engine(journal.pool, journal.policy)


def replay(journal: JournalStore, *, verify: bool = False) -> Engine:
    """Rebuild the engine by applying every recorded event, in order.

    Raises :class:`JournalError` if a recorded event is refused (it was accepted when it
    was recorded, so the engine or the journal has changed). With ``verify=True`` also
    raises at the first entry whose re-derived decisions differ from the recorded ones;
    :func:`bursar.broker.audit.audit` reports every such entry instead.
    """
    engine = new_engine(journal)
    for seq, event_json, recorded_json in journal.raw_entries():
        event = decode_entry_event(journal, seq, event_json)
        decisions = apply_recorded(journal, engine, seq, event)
        if verify:
            got = decisions_json(decisions)
            try:
                recorded = codec.dumps(json.loads(recorded_json))
            except ValueError:
                recorded = recorded_json
            if got != recorded:
                raise JournalError(
                    f"{journal.path}: entry {seq}: replay decided {got}, journal recorded "
                    f"{recorded_json}"
                )
    return engine


def decode_entry_event(journal: JournalStore, seq: int, event_json: str) -> Event:
    try:
        return codec.decode_event(event_json)
    except (ValueError, KeyError, TypeError) as exc:
        raise JournalError(
            f"{journal.path}: entry {seq} holds an event that cannot be decoded ({exc}); the "
            "journal is damaged and nothing after this entry can be re-derived"
        ) from exc


def apply_recorded(journal: JournalStore, engine: Engine, seq: int, event: Event) -> list[Decision]:
    """``engine.apply(event)`` for a recorded event; any refusal or crash is a JournalError.

    Every recorded event was accepted when it was recorded, so a refusal here means the
    engine or the journal changed since. A refusal is raised with the RequestError as its
    ``__cause__``; the engine's state is then untouched, so a caller that wants to go on
    (the audit) may.
    """
    try:
        return engine.apply(event)
    except RequestError as exc:
        raise JournalError(
            f"{journal.path}: replaying entry {seq} ({event.kind} at {event.at}) was refused: {exc}"
        ) from exc
    except Exception as exc:
        # An engine bug, not bad input: its state may be half-changed, so stop here, but
        # say which entry triggered it so the bug can be reproduced from the journal.
        raise JournalError(
            f"{journal.path}: the engine failed on entry {seq} ({event.kind} at {event.at}): "
            f"{type(exc).__name__}: {exc}"
        ) from exc
