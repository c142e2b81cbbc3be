"""A private PostgreSQL server for the tests: Debian's ``postgresql`` package, its own data
directory and socket under a temporary directory, no TCP port (nothing to collide with).

As root (CI) the server runs as the ``postgres`` user (PostgreSQL refuses to run as root);
otherwise as the current user. Without the package (or psycopg) the tests that need it
skip, unless ``BURSAR_REQUIRE_SYSTEM_TESTS=1`` (CI), where they fail.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from conftest import missing_system_part

_BIN_GLOB = "/usr/lib/postgresql/*/bin"
_counter = itertools.count(1)


def _bindir() -> Path | None:
    found = sorted(glob.glob(_BIN_GLOB), key=lambda p: int(Path(p).parent.name))
    return Path(found[-1]) if found else None


def require_postgres() -> Path:
    """The server binaries' directory, or skip (fail under BURSAR_REQUIRE_SYSTEM_TESTS=1)."""
    why = None
    bindir = _bindir()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        why = "psycopg missing: install the dev (or postgres) extra"
    if bindir is None:
        why = "PostgreSQL missing (Debian's postgresql): run scripts/system-deps.sh"
    elif os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            why = "running as root, and there is no postgres user to run the server as"
    if why:
        missing_system_part(why)
    assert bindir is not None
    return bindir


@dataclass
class PgServer:
    bindir: Path
    base: Path
    socket_dir: Path
    user: str
    _as: list[str]

    def url(self, dbname: str, user: str | None = None) -> str:
        return f"postgresql://{user or self.user}@/{dbname}?host={self.socket_dir}"

    def sql(self, statement: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def new_database(self) -> str:
        """A new, empty database; returns its URL."""
        name = f"bursar_{os.getpid()}_{next(_counter)}"
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            [
                *self._as,
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.base / "data"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[PgServer]:
    """Start a private server (initdb, then pg_ctl start) and stop it afterwards."""
    bindir = require_postgres()
    base = Path(tempfile.mkdtemp(prefix="bursar-pg-"))
    run_as: list[str] = []
    user = pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        user = "postgres"
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(base, "postgres", "postgres")
    data, sock = base / "data", base / "run"
    subprocess.run([*run_as, "mkdir", str(sock)], check=True)
    subprocess.run(
        [
            *run_as,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            user,
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
    )
    # No TCP port and no durability work: the tests kill brokers, never this server.
    opts = (
        f"-c listen_addresses='' -k {sock} -c fsync=off -c full_page_writes=off "
        "-c max_connections=200 -c shared_buffers=32MB"
    )
    subprocess.run(
        [
            *run_as,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(base / "server.log"),
            "-o",
            opts,
            "-w",
            "-t",
            "60",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    server = PgServer(bindir, base, sock, user, run_as)
    try:
        yield server
    finally:
        server.stop()
