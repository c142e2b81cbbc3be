"""Download catalogued traces, check them against the published SHA-256, and only then
write them, atomically: a failed or mismatched download leaves nothing behind.

A file comes from its published address (an archive member is cut out of the archive,
which is checked first), or from a site mirror: ``base_url`` + ``/`` + its path under the
traces folder, that is, a copy of a traces folder served over HTTP (the mirror's file is
checked as the stored file is).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bursar.sim.replay.catalog import Entry, TraceFile, packaged_path, verify

__all__ = ["FetchError", "Fetched", "Progress", "fetch"]

Progress = Callable[[str, int, int | None], None]
"""``(what, bytes so far, bytes in all or None)``, called as a download goes."""

_CHUNK = 1 << 16
_TIMEOUT_S = 60.0


class FetchError(Exception):
    """A trace that could not be fetched; nothing of it was written."""


@dataclass(frozen=True, slots=True)
class Fetched:
    name: str
    path: Path
    status: Literal["fetched", "present", "shipped"]


def _download(url: str, progress: Progress | None, label: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as resp:
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            buf = io.BytesIO()
            while chunk := resp.read(_CHUNK):
                buf.write(chunk)
                if progress is not None:
                    progress(label, buf.tell(), total)
    except urllib.error.HTTPError as e:
        raise FetchError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise FetchError(f"cannot download {url}: {e.reason}") from None
    except (OSError, ValueError) as e:  # timeouts, resets, a malformed address
        raise FetchError(f"cannot download {url}: {e}") from None
    return buf.getvalue()


def _member(archive: bytes, url: str, member: str) -> bytes:
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
            f = tar.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
    except (KeyError, tarfile.TarError) as e:
        raise FetchError(f"{url}: no member {member!r} in the archive ({e})") from None


class _Downloads:
    """Each address downloaded once per fetch (six ElasticFlow tables share one archive),
    and checked against the published SHA-256 before anything is cut out of it."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._got: dict[str, bytes] = {}

    def published(self, f: TraceFile) -> bytes:
        data = self._got.get(f.url)
        if data is None:
            data = _download(f.url, self._progress, f.url.rsplit("/", 1)[-1])
            got = hashlib.sha256(data).hexdigest()
            if got != f.sha256:
                raise FetchError(
                    f"{f.url}: not the published file: SHA-256 {got}, expected {f.sha256}; "
                    "nothing was written"
                )
            self._got[f.url] = data
        if f.member is None:
            return data
        member = _member(data, f.url, f.member)
        # No name or time stamp in the gzip header: a fetch today equals one tomorrow.
        return gzip.compress(member, mtime=0) if f.path.endswith(".gz") else member

    def mirrored(self, f: TraceFile, base_url: str) -> bytes:
        return _download(f"{base_url.rstrip('/')}/{f.path}", self._progress, f.path)


def _present(f: TraceFile, dest: Path) -> bool:
    p = dest / f.path
    return p.is_file() and verify(f, p.read_bytes()) is None


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fetch(
    entries: Iterable[Entry],
    dest: Path,
    *,
    base_url: str | None = None,
    progress: Progress | None = None,
) -> list[Fetched]:
    """Fetch each entry's files into ``dest`` (skipping those already there and intact).
    An entry is written only once all its files are downloaded and checked; a
    :class:`FetchError` stops at the first entry that fails, with the entries before it
    written and nothing of it."""
    downloads = _Downloads(progress)
    done: list[Fetched] = []
    for e in entries:
        if e.packaged is not None:
            done.append(Fetched(e.name, packaged_path(e), "shipped"))
            continue
        staged: list[tuple[Path, bytes]] = []
        for f in e.files:
            if _present(f, dest):
                continue
            if base_url is None:
                data = downloads.published(f)
                where = f.url
            else:
                data = downloads.mirrored(f, base_url)
                where = f"{base_url.rstrip('/')}/{f.path}"
            why = verify(f, data)
            if why is not None:
                raise FetchError(f"{where}: not the published {f.path}: {why}; nothing was written")
            staged.append((dest / f.path, data))
        for path, data in staged:
            _write_atomically(path, data)
        main = e.main
        assert main is not None, e.name
        done.append(Fetched(e.name, dest / main, "fetched" if staged else "present"))
    return done
