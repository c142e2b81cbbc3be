"""Tokens as people hand them over: a bare token, or the ``tokens.json`` that ``bursar
serve`` writes (``{"campaign": "token", ...}``) with the campaign to pick.

A token travels as gRPC call metadata, which takes printable ASCII only. Checking that
here, before a call, turns a JSON file passed as a token (or a token with a stray control
character) into one clear message instead of gRPC's "Illegal header value" deep in a call.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = ["InvalidToken", "check_token", "read_token_file"]

# What gRPC accepts in an ASCII metadata value, less the space: a bearer token is one word.
_LEGAL = re.compile(r"[\x21-\x7e]+")


class InvalidToken(ValueError):
    """A token, or a token file, that cannot be sent: the message says what to pass."""


def check_token(token: str, source: str = "the token") -> str:
    """``token`` if it can travel as a bearer token, else :class:`InvalidToken`."""
    if _LEGAL.fullmatch(token):
        return token
    if token.lstrip().startswith("{"):
        what = "JSON (a token table?)"
    elif not token.strip():
        what = "nothing"
    else:
        bad = next(c for c in token if not _LEGAL.fullmatch(c))
        what = f"the character {bad!r}, which cannot be sent in call metadata"
    raise InvalidToken(
        f"{source} is not a token: it holds {what}; pass the token itself, or the broker's "
        "STATE/tokens.json as a token file with the campaign's name"
    )


def read_token_file(path: str | os.PathLike[str], campaign: str | None = None) -> str:
    """The token in ``path``: the file's one line, or, for a JSON table of campaigns'
    tokens (``STATE/tokens.json``), ``campaign``'s entry (which may be left out when the
    table has one entry). Raises :class:`InvalidToken` with what to pass instead."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidToken(f"cannot read the token file {p}: {exc}") from None
    if not text.startswith("{"):
        if not text:
            raise InvalidToken(f"the token file {p} is empty")
        return check_token(text, f"the token file {p}")
    try:
        table = json.loads(text)
    except ValueError as exc:
        raise InvalidToken(f"{p} is neither a token nor a JSON token table ({exc})") from None
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise InvalidToken(f'{p} is JSON but not a token table ({{"campaign": "token", ...}})')
    names = ", ".join(sorted(table)) or "none"
    if campaign is None:
        if len(table) != 1:
            raise InvalidToken(
                f"{p} holds the tokens of several campaigns ({names}): name one with "
                "--campaign NAME (or BURSAR_CAMPAIGN)"
            )
        campaign = next(iter(table))
    if campaign not in table:
        raise InvalidToken(f"{p} has no token for campaign {campaign!r} (it has: {names})")
    return check_token(table[campaign], f"the token of {campaign!r} in {p}")
