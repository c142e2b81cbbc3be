"""Signing in to the dashboard with a one-time login link, as Jupyter does.

``bursar serve`` prints ``http://HOST:PORT/?login=CODE``; ``bursar dashboard`` asks the
running broker for a fresh one (``POST /api/login`` with the admin token). Opening the link
trades the code for a session cookie (HttpOnly, SameSite=Strict) and redirects to the
clean URL. Both live in this process's memory only: nothing is written to disk or to the
journal, a code works once, and a restart ends every code and session (the page then asks
again). Only SHA-256 hashes of codes and session ids are kept, so the table itself holds
nothing a caller could present.

Why ask the broker rather than derive codes from a secret in the state directory: a
derived code needs a long-lived signing key on disk that mints admin sessions for anyone
who reads it, and "works once" would still need the broker's memory. Asked over HTTP, the
only credential is the admin token the operator already holds, and the code exists only in
the process that honours it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from bursar.broker.service.auth import Principal
from bursar.broker.service.core import ServiceCore

__all__ = ["MAX_CODES", "MAX_SESSIONS", "Logins", "cookie_name", "login_link", "logins_of"]

MAX_CODES = 100
"""Unused codes kept; the oldest is forgotten (stops working) past this."""

MAX_SESSIONS = 1000
"""Open sessions kept; the oldest ends past this."""


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def cookie_name(port: int) -> str:
    """The session cookie's name. Browsers share cookies between the ports of one host, so
    each broker's dashboard names its own: signing in to one never signs another out."""
    return f"bursar_session_{port}"


@dataclass(frozen=True, slots=True)
class Session:
    who: Principal
    generation: int
    """The campaign's token generation when the session opened: a rotated token ends it."""


class Logins:
    """The one-time codes not yet used and the sessions they opened."""

    def __init__(self) -> None:
        self._codes: OrderedDict[str, Principal] = OrderedDict()
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def code(self, who: Principal) -> str:
        """A new one-time code that signs in as ``who``."""
        code = secrets.token_urlsafe(24)
        self._codes[_digest(code)] = who
        while len(self._codes) > MAX_CODES:
            self._codes.popitem(last=False)
        return code

    def take(self, code: str) -> Principal | None:
        """Whom a code signs in as; it stops working. None for a code that is wrong or
        already used."""
        return self._codes.pop(_digest(code), None)

    def open(self, who: Principal, generation: int) -> str:
        """A new session for ``who``: its id, for the cookie."""
        sid = secrets.token_urlsafe(32)
        self._sessions[_digest(sid)] = Session(who, generation)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return sid

    def session(self, sid: str) -> Session | None:
        return self._sessions.get(_digest(sid))

    def end(self, sid: str) -> None:
        self._sessions.pop(_digest(sid), None)


_BY_CORE: WeakKeyDictionary[ServiceCore, Logins] = WeakKeyDictionary()


def logins_of(core: ServiceCore) -> Logins:
    """The login table of a service core's dashboard (one per core)."""
    table = _BY_CORE.get(core)
    if table is None:
        table = _BY_CORE[core] = Logins()
    return table


def login_link(core: ServiceCore, dashboard_url: str, who: Principal | None = None) -> str:
    """A fresh one-time login link to the dashboard at ``dashboard_url`` (the admin's by
    default): what ``bursar serve`` prints on start."""
    code = logins_of(core).code(who if who is not None else Principal(None))
    return f"{dashboard_url}?login={code}"
