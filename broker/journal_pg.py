"""The journal on PostgreSQL: the same rows as the SQLite journal, in a server that
PostgreSQL's own replication can protect, and the leadership of the brokers that share it.

``bursar serve --journal postgresql://...`` keeps its journal here instead of in
``STATE/journal.sqlite``. The tables live in their own schema, ``bursar``, so that a
database shared with other software is never touched outside it::

    bursar.meta(key TEXT PRIMARY KEY, value TEXT)            -- as the SQLite journal's
    bursar.entries(seq BIGINT PRIMARY KEY, event TEXT, decisions TEXT)
    bursar.decision_index(seq, idx, kind, campaign, ref, at) -- derived, as in SQLite
    bursar.leader(id = 1, epoch BIGINT, address TEXT, since DOUBLE PRECISION)

Entries are stored as the same texts, so the canonical form, its hash, replay, the audit
and the snapshots' entry hashes are the same as for an SQLite journal with the same
entries (``bursar journal migrate`` copies one into the other and compares the hashes).

Leadership. Several brokers may open one journal; the one that holds the session-level
advisory lock ``LEADER_LOCK`` (on a connection of its own) leads. Taking the lead bumps
``leader.epoch`` and records the leader's address; every write transaction begins by
reading the epoch ``FOR SHARE`` and is refused (:class:`Deposed`) when it is not the
writer's own. Fencing therefore holds even when a deposed leader wakes up late: the new
leader's epoch bump waits for the old leader's transaction in flight (the share lock) and
commits before the new leader reads the journal's end, and every later transaction of
the old leader sees the new epoch and commits nothing. The lock itself is released by
the server when the leader's session ends: at once when its process dies (the socket
closes), after the TCP keepalive settings below when its machine or network is gone.

Durability: every commit waits for the server's own (``synchronous_commit`` as the
server is configured; with synchronous replicas, for them too). ``durability`` is kept
for the interface and changes nothing here.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, errors

from bursar.broker import codec
from bursar.broker.decisions import Decision
from bursar.broker.errors import JournalError
from bursar.broker.events import ApplyPolicy, Event
from bursar.broker.journal import (
    MAX_SEQ,
    POLICY_CHANGED_AT,
    POLICY_CURRENT,
    Durability,
    JournalStore,
    checked_specs,
    decisions_json,
    new_meta,
)
from bursar.broker.policy import PolicySpec, PoolSpec
from bursar.broker.specs import spec_to_dict

__all__ = [
    "LEADER_LOCK",
    "SCHEME",
    "Deposed",
    "Peer",
    "PgJournal",
    "Topology",
    "is_postgres",
    "redacted",
]

SCHEME = ("postgresql://", "postgres://")
"""How ``--journal`` names a PostgreSQL journal (libpq's connection URIs)."""

LEADER_LOCK = 0x62757273  # "burs"
"""The advisory lock key whose holder leads."""
_SETUP_LOCK = LEADER_LOCK + 1
"""Held (per transaction) while a journal's tables are created: two brokers starting on
an empty database must not both create them."""

_PAGE = 1000

# Session settings of the leader's lock connection: the server drops a session whose peer
# is gone (machine down, network cut) after about keepalives_idle + interval * count
# seconds, or tcp_user_timeout for data left unacknowledged, and with it the lock.
_KEEPALIVE = {
    "keepalives": "1",
    "keepalives_idle": "1",
    "keepalives_interval": "1",
    "keepalives_count": "2",
    "tcp_user_timeout": "3000",
}
_SERVER_KEEPALIVE = (
    "SET tcp_keepalives_idle = 1",
    "SET tcp_keepalives_interval = 1",
    "SET tcp_keepalives_count = 2",
    "SET tcp_user_timeout = 3000",
)

_SCHEMA = (
    "CREATE SCHEMA IF NOT EXISTS bursar",
    "CREATE TABLE bursar.meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE bursar.entries (seq BIGINT PRIMARY KEY, event TEXT NOT NULL, "
    "decisions TEXT NOT NULL)",
    "CREATE TABLE bursar.decision_index (seq BIGINT NOT NULL, idx INTEGER NOT NULL, "
    "kind TEXT NOT NULL, campaign TEXT, ref TEXT, at DOUBLE PRECISION, PRIMARY KEY (seq, idx))",
    "CREATE INDEX decision_index_campaign ON bursar.decision_index (campaign, seq)",
    "CREATE INDEX decision_index_ref ON bursar.decision_index (ref, seq)",
    "CREATE TABLE bursar.leader (id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL, "
    "address TEXT NOT NULL, since DOUBLE PRECISION NOT NULL)",
    "INSERT INTO bursar.leader (id, epoch, address, since) VALUES (1, 0, '', 0)",
)

_TOKENS = (
    "CREATE TABLE IF NOT EXISTS bursar.tokens (campaign TEXT PRIMARY KEY, "
    "sha256 TEXT NOT NULL UNIQUE, issued_at DOUBLE PRECISION NOT NULL)"
)
"""The campaign tokens' digests the brokers share, so that a standby that takes the lead
accepts the tokens the last leader issued (each broker keeps its copy in STATE/tokens.sqlite)."""

_BROKERS_DASHBOARD = (
    "ALTER TABLE bursar.brokers ADD COLUMN IF NOT EXISTS dashboard TEXT NOT NULL DEFAULT ''"
)
"""Each broker's dashboard URL (empty: none), so that a standby's page links the leader's;
added to a journal created before it."""

_BROKERS = (
    "CREATE TABLE IF NOT EXISTS bursar.brokers (address TEXT PRIMARY KEY, role TEXT NOT NULL, "
    "applied BIGINT NOT NULL, seen DOUBLE PRECISION NOT NULL)"
)
"""What each broker on the journal last said of itself (``bursar journal brokers``): its
role and the last entry it applied, so that an operator sees the standbys' lag."""

_INSERT = "INSERT INTO bursar.entries (seq, event, decisions) VALUES (%s, %s, %s)"
_FENCED_INSERT = (
    "INSERT INTO bursar.entries (seq, event, decisions) SELECT %s, %s, %s "
    "FROM bursar.leader WHERE epoch = %s FOR SHARE"
)
_UPSERT_META = (
    "INSERT INTO bursar.meta (key, value) VALUES (%s, %s) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
_INDEX_BACKFILL = (
    "INSERT INTO bursar.decision_index (seq, idx, kind, campaign, ref, at) "
    "SELECT e.seq, d.ord - 1, d.value->>'kind', d.value->>'campaign', "
    "coalesce(d.value->>'lease_id', d.value->>'request_id'), (d.value->>'at')::float8 "
    "FROM bursar.entries AS e, jsonb_array_elements(e.decisions::jsonb) WITH ORDINALITY "
    "AS d(value, ord) WHERE e.seq > %s AND e.seq <= %s ON CONFLICT DO NOTHING"
)


def is_postgres(location: str | Path) -> bool:
    """Whether ``--journal`` names a PostgreSQL journal (else an SQLite file)."""
    return str(location).startswith(SCHEME)


def redacted(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        params = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise JournalError(f"--journal: not a PostgreSQL connection URL ({exc})") from exc
    host = params.get("host") or "localhost"
    port = f":{params['port']}" if params.get("port") else ""
    user = f"{params['user']}@" if params.get("user") else ""
    return f"postgresql://{user}{host}{port}/{params.get('dbname', '')}"


@dataclass(frozen=True, slots=True)
class Peer:
    """One broker on a shared journal, as it last reported itself."""

    address: str
    role: str
    """``leader`` (it holds the current epoch), ``standby``, or ``former``: it led under an
    earlier epoch and has not reported since."""
    applied: int
    """The last entry it applied."""
    lag_entries: int
    """Committed entries it had not applied."""
    lag_s: float
    """How long the oldest of those had been in the journal (its time to ``now``); 0 when
    caught up."""
    reported_at: float
    """When it said so (its own clock)."""
    dashboard: str = ""
    """Its dashboard's URL (empty: it serves none)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """The brokers on a shared journal as the store knows them (``bursar status``,
    ``bursar journal brokers``, the metrics)."""

    epoch: int
    leader: str
    """The leader's address; empty before any broker led."""
    last_seq: int
    brokers: tuple[Peer, ...]
    """By address."""

    @property
    def leader_dashboard(self) -> str:
        """The leader's dashboard URL (empty: none, or not known)."""
        return next((p.dashboard for p in self.brokers if p.address == self.leader), "")


class Deposed(JournalError):
    """A write refused because another broker has taken the lead since (a newer epoch)."""


class PgJournal(JournalStore):
    """A journal in PostgreSQL (see the module doc). Open with :meth:`PgJournal.open`;
    methods are safe to call from several threads of one process."""

    _P = "%s"
    _ENTRIES = "bursar.entries"
    _INDEX = "bursar.decision_index"
    _CLASH = errors.UniqueViolation
    _ERROR = psycopg.Error

    def __init__(
        self,
        url: str,
        conn: psycopg.Connection[Any],
        pool: PoolSpec,
        policy: PolicySpec,
        meta_line: str,
        durability: Durability,
    ) -> None:
        self.url = url
        self.path = Path(redacted(url))
        self.location = redacted(url)
        self._conn = conn
        self._lock = threading.RLock()
        self.pool = pool
        self.policy = policy
        self.durability = durability
        self._meta_line = meta_line
        self._last_seq = self._max_seq()
        self._indexed = 0
        self._open: tuple[int, int] | None = None
        self._epoch: int | None = None
        """The epoch this broker leads under (None: not leading; writes are not fenced)."""
        self._lock_conn: psycopg.Connection[Any] | None = None

    # ----- opening

    @classmethod
    def open(
        cls,
        url: str,
        pool: PoolSpec | None = None,
        policy: PolicySpec | None = None,
        *,
        durability: Durability = "normal",
        application_name: str = "bursar",
    ) -> PgJournal:
        """Open the journal in the database ``url`` names, creating its tables there if it
        has none (which needs ``pool``); the specs are checked as for an SQLite journal."""
        where = redacted(url)
        try:
            conn = psycopg.connect(url, autocommit=True, application_name=application_name)
        except psycopg.Error as exc:
            raise JournalError(f"cannot open journal {where}: {exc}") from exc
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SETUP_LOCK,))
                found = conn.execute("SELECT to_regclass('bursar.meta')").fetchone()
                if found is None or found[0] is None:
                    if pool is None:
                        raise JournalError(
                            f"no journal in {where}; to create one, pass the pool spec (the "
                            "broker does this on its first start)"
                        )
                    for statement in _SCHEMA:
                        conn.execute(statement)
                    conn.cursor().executemany(
                        "INSERT INTO bursar.meta (key, value) VALUES (%s, %s)",
                        list(new_meta(pool, policy).items()),
                    )
                conn.execute(_TOKENS)
                conn.execute(_BROKERS)
                conn.execute(_BROKERS_DASHBOARD)
                meta = dict(conn.execute("SELECT key, value FROM bursar.meta").fetchall())
            stored_pool, stored_policy, meta_line = checked_specs(meta, Path(where), pool, policy)
            return cls(url, conn, stored_pool, stored_policy, meta_line, durability)
        except psycopg.Error as exc:
            conn.close()
            raise JournalError(f"cannot open journal {where}: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def describe(url: str) -> str:
        return redacted(url)

    @staticmethod
    def holds_journal(url: str) -> bool:
        """Whether the database ``url`` names holds a journal already."""
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute("SELECT to_regclass('bursar.meta')").fetchone()
        except psycopg.Error as exc:
            raise JournalError(f"cannot open journal {redacted(url)}: {exc}") from exc
        return row is not None and row[0] is not None

    def close(self) -> None:
        with self._lock:
            self.resign()
            self._conn.close()

    @property
    def where(self) -> str:
        return self.location

    def __repr__(self) -> str:
        return f"PgJournal({self.location!r}, entries={self._last_seq})"

    # ----- leadership

    @property
    def epoch(self) -> int | None:
        """The epoch this broker leads under; None while it does not lead."""
        return self._epoch

    def leader(self) -> tuple[int, str]:
        """The current leadership record: (epoch, the leader's address)."""
        with self._lock, self._errors("reading the leader"):
            row = self._conn.execute("SELECT epoch, address FROM bursar.leader").fetchone()
        return (int(row[0]), str(row[1])) if row else (0, "")

    def lead(self, address: str, at: float) -> int | None:
        """Take the lead if no other broker holds it: returns the new epoch, or None if
        another leads. Once it returns, every write of an earlier leader is refused."""
        with self._lock:
            if self._epoch is not None:
                return self._epoch
            try:
                if self._lock_conn is None or self._lock_conn.closed:
                    self._lock_conn = psycopg.connect(
                        self.url, autocommit=True, application_name="bursar-leader", **_KEEPALIVE
                    )
                    for statement in _SERVER_KEEPALIVE:
                        self._lock_conn.execute(statement)
                row = self._lock_conn.execute(
                    "SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)
                ).fetchone()
            except psycopg.Error as exc:
                self._drop_lock_conn()
                raise JournalError(f"{self.location}: cannot reach the store: {exc}") from exc
            if not row or not row[0]:
                return None
            try:
                with self._errors("taking the lead"), self._conn.transaction():
                    got = self._conn.execute(
                        "UPDATE bursar.leader SET epoch = epoch + 1, address = %s, since = %s "
                        "RETURNING epoch",
                        (address, at),
                    ).fetchone()
            except BaseException:
                self._drop_lock_conn()
                raise
            self._epoch = int(got[0]) if got else None
            # Entries the last leader committed before the bump are all there now.
            self._last_seq = self._max_seq()
            return self._epoch

    def holds_lead(self) -> bool:
        """Whether the lock session is alive (so the lock is still this broker's). May block
        while the network is cut: call it from a worker thread, with a timeout."""
        conn = self._lock_conn
        if self._epoch is None or conn is None:
            return False
        try:
            conn.execute("SELECT 1").fetchone()
        except psycopg.Error:
            return False
        return True

    def resign(self) -> None:
        """Give the lead up (the lock's session ends); writes are no longer fenced by it."""
        self._epoch = None
        self._drop_lock_conn()

    def _drop_lock_conn(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _fence(self) -> None:
        """Inside a write transaction: refuse it unless this broker's epoch is current."""
        if self._epoch is None:
            return
        row = self._conn.execute("SELECT epoch FROM bursar.leader FOR SHARE").fetchone()
        if not row or int(row[0]) != self._epoch:
            raise Deposed(
                f"{self.location}: another broker leads now (epoch {row[0] if row else '?'}, "
                f"this one led under {self._epoch}); this broker may commit nothing more"
            )

    # ----- writing

    def append(self, event: Event, decisions: Sequence[Decision], *, commit: bool = True) -> int:
        row = (codec.encode(event), decisions_json(decisions))
        policy = type(event) is ApplyPolicy
        with self._lock:
            seq = self._last_seq + 1
            try:
                with self._write_errors(seq):
                    if commit and self._open is None and not policy:
                        # One statement in autocommit mode is its own transaction: one round
                        # trip to the server instead of four (BEGIN, fence, INSERT, COMMIT).
                        self._insert(seq, row)
                    else:
                        if self._open is None:
                            self._conn.execute("BEGIN")
                            self._open = (self._last_seq, self._indexed)
                        self._insert(seq, row)
                        if policy:
                            self._note_policy(event, seq)
                        if commit:
                            self._conn.execute("COMMIT")
                            self._open = None
            except BaseException:
                self.rollback()
                raise
            self._last_seq = seq
            return seq

    def _insert(self, seq: int, row: tuple[str, str]) -> None:
        """Insert one entry, fenced: the insert reads the leader's row ``FOR SHARE`` and
        inserts nothing unless the epoch is this broker's (see the module doc)."""
        if self._epoch is None:
            self._conn.execute(_INSERT, (seq, *row))
            return
        cur = self._conn.execute(_FENCED_INSERT, (seq, *row, self._epoch))
        if cur.rowcount != 1:
            self._fence()  # raises Deposed, naming the epoch in force
            raise Deposed(f"{self.location}: this broker's epoch {self._epoch} is over")

    def _note_policy(self, event: Event, seq: int) -> None:
        self._conn.cursor().executemany(
            _UPSERT_META,
            [
                (POLICY_CURRENT, codec.dumps(spec_to_dict(event.policy))),  # type: ignore[attr-defined]
                (POLICY_CHANGED_AT, str(seq)),
            ],
        )

    def rollback(self) -> None:
        with self._lock:
            if self._open is None:
                return
            with contextlib.suppress(psycopg.Error):
                self._conn.execute("ROLLBACK")
            self._last_seq, self._indexed = self._open
            self._open = None

    def append_many(self, items: Iterable[tuple[Event, Sequence[Decision]]]) -> list[int]:
        items = list(items)
        rows = [(codec.encode(ev), decisions_json(ds)) for ev, ds in items]
        with self._lock:
            first = self._last_seq + 1
            seqs = list(range(first, first + len(rows)))
            if seqs:
                self._insert_rows(
                    [(s, *r) for s, r in zip(seqs, rows, strict=True)],
                    [(ev, s) for s, (ev, _) in zip(seqs, items, strict=True)],
                )
            return seqs

    def insert_raw(self, rows: Sequence[tuple[int, str, str]]) -> None:
        """Append entries as stored elsewhere (same seqs and texts), in one transaction:
        ``bursar journal migrate``. They must follow this journal's last entry."""
        with self._lock:
            if rows and rows[0][0] != self._last_seq + 1:
                raise JournalError(
                    f"{self.location}: entry {rows[0][0]} does not follow the last "
                    f"({self._last_seq})"
                )
            self._insert_rows(list(rows), [])

    def _insert_rows(
        self, rows: list[tuple[int, str, str]], policies: list[tuple[Event, int]]
    ) -> None:
        with self._write_errors(rows[0][0] if rows else 0):
            self._conn.execute("BEGIN")
            try:
                self._fence()
                self._conn.cursor().executemany(_INSERT, rows)
                for ev, s in policies:
                    if type(ev) is ApplyPolicy:
                        self._note_policy(ev, s)
                self._conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(psycopg.Error):
                    self._conn.execute("ROLLBACK")
                raise
        if rows:
            self._last_seq = rows[-1][0]

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            raise JournalError(f"{self.location}: {doing} failed: {exc}") from exc

    # ----- reading

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._errors("reading"):
            return self._conn.execute(sql, args).fetchall()  # type: ignore[arg-type]

    def __len__(self) -> int:
        return int(self._rows("SELECT COUNT(*) FROM bursar.entries")[0][0])

    @property
    def last_seq(self) -> int:
        with self._lock, self._errors("reading"):
            return self._max_seq()

    def _max_seq(self) -> int:
        row = self._conn.execute(
            "SELECT GREATEST(COALESCE((SELECT MAX(seq) FROM bursar.entries), 0), "
            "COALESCE((SELECT value::bigint FROM bursar.meta WHERE key = 'archived_through'), 0))"
        ).fetchone()
        return int(row[0]) if row else 0

    def raw_entries(self, start: int = 0) -> Iterator[tuple[int, str, str]]:
        after = start - 1
        while True:
            page = self._rows(
                "SELECT seq, event, decisions FROM bursar.entries WHERE seq > %s ORDER BY seq "
                "LIMIT %s",
                (after, _PAGE),
            )
            if not page:
                return
            yield from ((int(s), e, d) for s, e, d in page)
            after = page[-1][0]

    def raw_entry(self, seq: int) -> tuple[str, str] | None:
        if not 1 <= seq <= MAX_SEQ:
            return None
        rows = self._rows("SELECT event, decisions FROM bursar.entries WHERE seq = %s", (seq,))
        return (rows[0][0], rows[0][1]) if rows else None

    def _decisions_before(self, before: int, n: int) -> list[tuple[int, str]]:
        return [
            (int(s), d)
            for s, d in self._rows(
                "SELECT seq, decisions FROM bursar.entries WHERE seq < %s ORDER BY seq DESC "
                "LIMIT %s",
                (before, n),
            )
        ]

    # ----- the decision index

    def ensure_index(self) -> None:
        with self._lock:
            self._indexed = int(
                self._rows("SELECT COALESCE(MAX(seq), 0) FROM bursar.decision_index")[0][0]
            )
        self.update_index()

    def update_index(self, limit: int | None = None) -> int:
        with self._lock:
            # Inside an open batch the rows commit (or roll back) with it; only committed
            # entries are indexed, as in SQLite.
            last = self._open[0] if self._open is not None else self._last_seq
            if self._indexed >= last:
                return 0
            start = self._indexed
            if limit is not None:
                last = min(last, start + limit)
            with self._write_errors(last):
                # Derived rows, not fenced: any broker's index of committed entries is right.
                self._conn.execute(_INDEX_BACKFILL, (start, last))
            self._indexed = last
            return last - start

    # ----- the brokers on this journal

    def report(self, address: str, role: str, applied: int, at: float, dashboard: str = "") -> None:
        """Record this broker's role, the last entry it applied and its dashboard's URL, as
        of ``at``."""
        with self._lock, self._errors("reporting"):
            self._conn.execute(
                "INSERT INTO bursar.brokers (address, role, applied, seen, dashboard) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (address) DO UPDATE SET "
                "role = excluded.role, applied = excluded.applied, seen = excluded.seen, "
                "dashboard = excluded.dashboard",
                (address, role, applied, at, dashboard),
            )

    def brokers(self) -> list[tuple[str, str, int, float, str]]:
        """(address, role, last entry applied, when it said so, dashboard URL) per broker,
        by address."""
        return [
            (str(a), str(r), int(n), float(t), str(u))
            for a, r, n, t, u in self._rows(
                "SELECT address, role, applied, seen, dashboard FROM bursar.brokers "
                "ORDER BY address"
            )
        ]

    def topology(self, now: float) -> Topology:
        """The leader, its epoch and every broker's lag, as of ``now`` (the caller's clock;
        the journal's times are the leader's). A few reads: call it off the event loop."""
        epoch, leader = self.leader()
        last = self._max_seq()
        peers = []
        for address, role, applied, seen, dashboard in self.brokers():
            lag = max(0, last - applied)
            lag_s = 0.0
            if lag:
                # The entry it has yet to apply: how long it has waited.
                row = self.raw_entry(applied + 1)
                if row is not None:
                    lag_s = max(0.0, now - float(json.loads(row[0]).get("at", now)))
            # The record names the leader; a row's role is as of its last report.
            shown = "leader" if address == leader else "standby" if role == "standby" else "former"
            peers.append(Peer(address, shown, applied, lag, lag_s, seen, dashboard))
        return Topology(epoch, leader, last, tuple(peers))

    # ----- tokens

    def shared_tokens(self) -> list[tuple[str, str, float]]:
        """(campaign, token SHA-256, issued at) of every campaign token issued so far."""
        return [
            (str(c), str(d), float(t))
            for c, d, t in self._rows("SELECT campaign, sha256, issued_at FROM bursar.tokens")
        ]

    def share_tokens(self, rows: Sequence[tuple[str, str, float]]) -> None:
        """Record the tokens this broker issued (replacing a campaign's older one)."""
        with self._lock, self._errors("sharing the tokens"), self._conn.transaction():
            self._fence()
            self._conn.cursor().executemany(
                "INSERT INTO bursar.tokens (campaign, sha256, issued_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (campaign) DO UPDATE SET sha256 = excluded.sha256, "
                "issued_at = excluded.issued_at",
                list(rows),
            )

    # ----- meta

    def meta_value(self, key: str) -> str | None:
        rows = self._rows("SELECT value FROM bursar.meta WHERE key = %s", (key,))
        return rows[0][0] if rows else None

    def meta(self) -> dict[str, str]:
        return dict(self._rows("SELECT key, value FROM bursar.meta"))  # type: ignore[arg-type]

    def set_meta(self, meta: Mapping[str, str]) -> None:
        with self._lock, self._write_errors(self._last_seq):
            self._conn.cursor().executemany(_UPSERT_META, list(meta.items()))
