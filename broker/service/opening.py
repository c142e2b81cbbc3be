"""Opening a broker's state directory for the service: its lock, the runtime resumed from
the journal (the requests left queued by the last server withdrawn, the downtime caught
up), and the campaigns' tokens (shared through the journal's store when it is
PostgreSQL). ``ServiceCore.open`` builds the core on what this opens.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bursar.broker.actuator import actuator_for
from bursar.broker.backends.base import PoolBackend
from bursar.broker.clock import Clock
from bursar.broker.config import Config, default_config
from bursar.broker.errors import DISTRIBUTION
from bursar.broker.events import CancelRequest
from bursar.broker.journal import JOURNAL_FILENAME, Journal, JournalStore
from bursar.broker.runtime import Follower, Runtime
from bursar.broker.service.auth import TOKENS_DB, TokenStore, load_admin_token
from bursar.broker.state_lock import LOCK_FILE, try_lock

__all__ = ["Opened", "lock_state_dir", "open_state", "push_tokens", "version_string"]


def version_string() -> str:
    """The installed distribution's version (what Status reports)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


@dataclass
class Opened:
    """A state directory opened for serving: its lock is held until the core closes."""

    runtime: Runtime
    tokens: TokenStore
    admin_token_path: Path
    issued: list[str]
    """Campaigns whose tokens were issued while opening (new ones)."""
    lock: int


def open_state(
    state: Path,
    config: Config | None,
    *,
    durability: str,
    snapshot_every: int,
    clock: Clock,
    admin_token_file: Path | None,
    backend: PoolBackend | None,
    store: JournalStore | None,
    follower: Follower | None,
) -> Opened:
    """Lock ``state`` and open its broker (see ``ServiceCore.open``); the lock is let go
    again if opening fails."""
    state.mkdir(parents=True, exist_ok=True)
    lock = lock_state_dir(state)
    try:
        journal_path = state / JOURNAL_FILENAME
        resumed = journal_path.exists() if store is None else store.last_seq > 0
        if config is None:
            if store is not None and resumed:
                config = Config(pool=store.pool, policy=store.current_policy)
            elif resumed:
                with Journal.open(journal_path) as j:
                    config = Config(pool=j.pool, policy=j.current_policy)
            else:
                config = default_config()
        # A slow backend (Slurm) is driven from worker threads, never from the event loop.
        broker = Runtime.open(
            state,
            config,
            backend,
            at=clock.now(),
            durability=durability,
            snapshot_every=snapshot_every,
            actuator=lambda pool: actuator_for(pool, clock),
            journal=store,
            engine=follower,
        )
        broker.coalesce_ticks = True
        try:
            if resumed:
                _withdraw_orphans(broker)
                # The downtime, before serving: the leases that ended meanwhile are ended
                # by the time anyone can ask.
                broker.catch_up(clock.now())
            admin_token, admin_path, _ = load_admin_token(state, admin_token_file)
            if hasattr(store, "share_tokens"):
                _pull_tokens(state, store)
            tokens = TokenStore(state, admin_token)
            issued = tokens.issue_missing(sorted(broker.engine.campaigns), clock.now())
            if hasattr(store, "share_tokens"):
                push_tokens(state, store)
        except BaseException:
            broker.close()
            raise
    except BaseException:
        os.close(lock)
        raise
    return Opened(broker, tokens, admin_path, sorted(issued), lock)


def lock_state_dir(state: Path) -> int:
    """Hold the state directory's lock while serving (``broker/state_lock.py``): one server
    per state directory."""
    fd = try_lock(state)
    if fd is None:
        raise ValueError(
            f"another bursar serve is using {state} (it holds {state / LOCK_FILE}); stop it "
            "or choose another --state-dir"
        )
    return fd


def _withdraw_orphans(broker: Runtime) -> None:
    """Cancel the requests that were queued when the last server stopped.

    Each belonged to a blocking Acquire call that the stop cut off: nobody is waiting for
    its grant any more (the client retries against the new server), and a grant nobody
    hears of would hold capacity until it expired.
    """
    # Withdrawn as of the last journaled instant, when the old server was still alive:
    # first catching up on the downtime could grant one of them (a lease ending then frees
    # capacity) to nobody. All in one step, so that withdrawing one cannot grant the next.
    ids = [p.id for p in sorted(broker.engine.pending.values(), key=lambda p: p.seq)]
    if ids:
        broker.submit(CancelRequest(at=broker.engine.now, request_id=ids[0], also=tuple(ids[1:])))


def _pull_tokens(state: Path, store: Any) -> None:
    """Copy the brokers' shared token digests into this broker's token store (before it
    opens it), so that it accepts the tokens another leader issued."""
    rows = store.shared_tokens()
    if not rows:
        return
    with contextlib.closing(sqlite3.connect(state / TOKENS_DB)) as conn, conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tokens (campaign TEXT PRIMARY KEY, "
            "sha256 TEXT NOT NULL UNIQUE, issued_at REAL NOT NULL)"
        )
        # A token rotated elsewhere replaces this broker's copy; its old digest goes first,
        # so that the UNIQUE digest never clashes.
        conn.executemany("DELETE FROM tokens WHERE campaign = ?", [(c,) for c, _, _ in rows])
        conn.executemany("INSERT INTO tokens (campaign, sha256, issued_at) VALUES (?, ?, ?)", rows)


def push_tokens(state: Path, store: Any) -> None:
    """Share this broker's token digests through the journal's store (PostgreSQL), for the
    standbys."""
    with contextlib.closing(sqlite3.connect(state / TOKENS_DB)) as conn:
        rows = conn.execute("SELECT campaign, sha256, issued_at FROM tokens").fetchall()
    store.share_tokens(rows)
