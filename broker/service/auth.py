"""Who is calling: campaign tokens, the admin token, and where they live.

Every call carries ``authorization: Bearer <token>`` metadata.

* **Campaign tokens** are random (``bsr_`` + 43 URL-safe characters, 256 bits). The
  broker stores only their SHA-256, in ``STATE/tokens.sqlite``
  (``tokens(campaign PRIMARY KEY, sha256 UNIQUE, issued_at)``). A token is issued when
  a campaign is created through the Admin service (returned once, in the response), and
  at start-up for every campaign that has none yet: the config's campaigns on the first
  start, or campaigns of a journal written without the service. Tokens issued at
  start-up are written to ``STATE/tokens.json`` (``{"campaign": "token"}``, mode 0600)
  for the operator to hand out; ``Admin.RotateToken`` replaces a token and removes the
  stale entry from that file.
* **The admin token** is read from ``--admin-token-file`` if given; otherwise from
  ``STATE/admin.token``, which is generated (mode 0600) on the first start.

The state directory therefore holds secrets: keep it private to the broker's user.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.service.errors import PermissionDenied, Unauthenticated

__all__ = [
    "ADMIN_TOKEN_FILE",
    "DIGEST_CACHE_SIZE",
    "TOKENS_DB",
    "TOKENS_JSON",
    "DigestCache",
    "Principal",
    "Rotations",
    "TokenStore",
    "bearer_token",
    "digest",
    "load_admin_token",
    "new_token",
]

TOKENS_DB = "tokens.sqlite"
TOKENS_JSON = "tokens.json"
ADMIN_TOKEN_FILE = "admin.token"
_PREFIX = "bsr_"
_MAX_TOKEN_LEN = 512


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller: one campaign, or the admin."""

    campaign: str | None
    """The campaign a campaign token acts for; None for the admin."""

    @property
    def admin(self) -> bool:
        return self.campaign is None

    def __str__(self) -> str:
        return "admin" if self.campaign is None else f"campaign:{self.campaign}"

    def acting_for(self, requested: str) -> str:
        """The campaign a request acts for: the token's own, or the one the admin names."""
        if self.campaign is None:
            if not requested:
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    "campaign",
                    "the admin token acts for no campaign of its own: name one in `campaign`",
                )
            return requested
        if requested and requested != self.campaign:
            raise PermissionDenied(
                "OTHER_CAMPAIGN",
                f"this token acts for campaign {self.campaign!r}, not {requested!r}",
                str(self),
            )
        return self.campaign

    def may_see(self, campaign: str | None) -> bool:
        return self.campaign is None or self.campaign == campaign

    def require_admin(self, what: str) -> None:
        if self.campaign is not None:
            raise PermissionDenied(
                "ADMIN_ONLY", f"{what} needs the admin token; a campaign token may not", str(self)
            )


def new_token() -> str:
    return _PREFIX + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


DIGEST_CACHE_SIZE = 1024
"""Tokens whose digests a :class:`DigestCache` keeps (the oldest goes first)."""


class DigestCache:
    """``digest(token)``, remembered for the last :data:`DIGEST_CACHE_SIZE` tokens seen.

    Every call carries its token, and hashing it twice per call (the rate limiter's key,
    then the lookup) was a measurable part of a request. Only the hash is cached, never
    the verdict: whether a digest is valid is looked up afresh on every call, so a rotated
    token fails from the moment it is rotated, cached or not. Bounded, so that a client
    sending random tokens costs a hash per call, as before, and no memory.
    """

    def __init__(self, size: int = DIGEST_CACHE_SIZE) -> None:
        self._size = size
        self._by_token: dict[str, str] = {}

    def __call__(self, token: str) -> str:
        d = self._by_token.get(token)
        if d is None:
            d = digest(token)
            if len(self._by_token) >= self._size:
                del self._by_token[next(iter(self._by_token))]  # dicts keep insertion order
            self._by_token[token] = d
        return d

    def forget(self, d: str) -> None:
        """Drop the token whose digest is ``d`` (rotated: no need to keep it in memory)."""
        for token in [t for t, x in self._by_token.items() if x == d]:
            del self._by_token[token]

    def __len__(self) -> int:
        return len(self._by_token)


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an ``authorization: Bearer <token>`` header; None if absent.

    Raises Unauthenticated for an authorization header that is not a bearer token.
    """
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN_LEN:
            raise Unauthenticated(
                "MALFORMED_TOKEN", "the authorization metadata must be 'Bearer <token>'"
            )
        return token
    return None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by the owner only (0600)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def load_admin_token(state_dir: Path, token_file: Path | None) -> tuple[str, Path, bool]:
    """The admin token, the file it came from, and whether it was generated just now."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read the admin token file {token_file}: {exc}") from exc
        if len(token) < 16 or len(token) > _MAX_TOKEN_LEN or any(c.isspace() for c in token):
            raise ValueError(
                f"{token_file}: the admin token must be 16 to {_MAX_TOKEN_LEN} characters "
                "without spaces"
            )
        return token, token_file, False
    path = state_dir / ADMIN_TOKEN_FILE
    if path.exists():
        return path.read_text(encoding="utf-8").strip(), path, False
    token = new_token()
    _write_private(path, token + "\n")
    return token, path, True


class TokenStore:
    """Campaign tokens by SHA-256 (``STATE/tokens.sqlite``), and the admin token."""

    def __init__(self, state_dir: Path, admin_token: str) -> None:
        self.state_dir = state_dir
        self.digest = DigestCache()
        """Token -> SHA-256, cached (the rate limiter keys clients by it too)."""
        self._admin = digest(admin_token)
        self._conn = sqlite3.connect(state_dir / TOKENS_DB, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout = 5000")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS tokens (campaign TEXT PRIMARY KEY, "
            "sha256 TEXT NOT NULL UNIQUE, issued_at REAL NOT NULL)"
        )
        with contextlib.suppress(OSError):
            os.chmod(state_dir / TOKENS_DB, 0o600)
        self._by_digest: dict[str, str] = {}
        self._issued_at: dict[str, float] = {}
        for campaign, sha, at in self._conn.execute(
            "SELECT campaign, sha256, issued_at FROM tokens"
        ):
            self._by_digest[sha] = campaign
            self._issued_at[campaign] = at

    def close(self) -> None:
        self._conn.close()

    def authenticate(self, token: str | None) -> Principal:
        if token is None:
            raise Unauthenticated(
                "MISSING_TOKEN",
                "no credentials: send 'authorization: Bearer <token>' metadata with a "
                "campaign token or the admin token",
            )
        d = self.digest(token)
        if secrets.compare_digest(d, self._admin):
            return Principal(None)
        campaign = self._by_digest.get(d)
        if campaign is None:
            raise Unauthenticated("INVALID_TOKEN", "the token is not valid (unknown or rotated)")
        return Principal(campaign)

    def has_token(self, campaign: str) -> bool:
        return campaign in self._issued_at

    def issued_at(self, campaign: str) -> float:
        return self._issued_at.get(campaign, 0.0)

    def issue(self, campaign: str, now: float) -> str:
        """A new token for ``campaign``, replacing any old one (which stops working)."""
        token = new_token()
        d = digest(token)
        self._conn.execute(
            "INSERT INTO tokens (campaign, sha256, issued_at) VALUES (?, ?, ?) "
            "ON CONFLICT(campaign) DO UPDATE SET sha256 = excluded.sha256, "
            "issued_at = excluded.issued_at",
            (campaign, d, now),
        )
        for old, name in list(self._by_digest.items()):
            if name == campaign:
                del self._by_digest[old]
                self.digest.forget(old)
        self._by_digest[d] = campaign
        self._issued_at[campaign] = now
        return token

    def issue_missing(self, campaigns: Sequence[str], now: float) -> dict[str, str]:
        """Issue tokens for the campaigns that have none; record them in tokens.json."""
        issued = {c: self.issue(c, now) for c in campaigns if not self.has_token(c)}
        if issued:
            self._update_json(issued, ())
        return issued

    def rotate(self, campaign: str, now: float) -> str:
        token = self.issue(campaign, now)
        self._update_json({}, (campaign,))
        return token

    def _update_json(self, add: dict[str, str], drop: Iterable[str]) -> None:
        path = self.state_dir / TOKENS_JSON
        current: dict[str, str] = {}
        if path.exists():
            try:
                current = json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                current = {}
        drop = set(drop)
        if not add and not (drop & set(current)):
            return
        merged = {k: v for k, v in current.items() if k not in drop}
        merged.update(add)
        _write_private(path, json.dumps(merged, indent=2, sort_keys=True) + "\n")


class Rotations:
    """How many times each campaign's token was rotated while serving: a stream remembers
    the count it opened with, and a rotation since ends it (the old token stops working
    at once, streams it opened included)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def rotated(self, campaign: str) -> Unauthenticated:
        """Count a rotation of ``campaign``'s token; the error its streams end with."""
        self._count[campaign] = self._count.get(campaign, 0) + 1
        return _rotated(campaign)

    def generation(self, campaign: str | None) -> int:
        """Rotations of ``campaign``'s token (0 for the admin)."""
        return 0 if campaign is None else self._count.get(campaign, 0)

    def check(self, campaign: str | None, opened_with: int) -> None:
        """Raise UNAUTHENTICATED if ``campaign``'s token was rotated since ``opened_with``."""
        if self.generation(campaign) != opened_with:
            assert campaign is not None
            raise _rotated(campaign)


def _rotated(campaign: str) -> Unauthenticated:
    return Unauthenticated(
        "TOKEN_ROTATED",
        f"campaign {campaign}'s token was rotated: reconnect with the new token",
    )
