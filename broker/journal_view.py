"""What ``bursar journal`` shows: an audit mismatch as its first difference, and the
latest decisions as JSON lines or a table."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from bursar.broker import codec
from bursar.broker.audit import Mismatch
from bursar.broker.decisions import Decision

__all__ = ["first_difference", "tail_json_lines", "tail_table"]


def _short(value: Any, limit: int = 160) -> str:
    text = codec.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def first_difference(m: Mismatch) -> str:
    """Point at the first differing decision and its differing fields, not two long lists."""
    try:
        expected, got = json.loads(m.expected), json.loads(m.got)
    except ValueError:
        return f"  expected: {_short(m.expected)}\n  recorded: {_short(m.got)}"
    if not (isinstance(expected, list) and isinstance(got, list)):
        return f"  expected: {_short(expected)}\n  recorded: {_short(got)}"
    lines = []
    if len(expected) != len(got):
        lines.append(f"  {len(expected)} decision(s) expected, {len(got)} recorded")
    for i, (e, g) in enumerate(zip(expected, got, strict=False)):
        if e == g:
            continue
        if not (isinstance(e, dict) and isinstance(g, dict)):
            lines.append(f"  decision #{i}: expected {_short(e)}, recorded {_short(g)}")
            break
        label = " ".join(
            str(x) for x in (e.get("kind"), e.get("lease_id") or e.get("request_id")) if x
        )
        lines.append(f"  decision #{i} ({label}):")
        for key in sorted(set(e) | set(g)):
            if e.get(key, "<absent>") != g.get(key, "<absent>"):
                lines.append(
                    f"    {key}: expected {_short(e.get(key, '<absent>'))}, "
                    f"recorded {_short(g.get(key, '<absent>'))}"
                )
        break
    else:
        n = min(len(expected), len(got))
        extra, label = (expected, "expected") if len(expected) > n else (got, "recorded")
        for i in range(n, len(extra)):
            lines.append(f"  decision #{i}: {label} only: {_short(extra[i])}")
    return "\n".join(lines)


_ID_FIELDS = ("lease_id", "request_id")
_HIDDEN = {"at", "kind", "campaign", "inputs", *_ID_FIELDS}


def _brief(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ",".join(f"{k}={_brief(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(_brief(v) for v in value) if len(value) <= 4 else f"{len(value)} items"
    return str(value)


def tail_json_lines(rows: Sequence[tuple[int, Decision]]) -> list[str]:
    """One canonical JSON object per decision: the decision plus its entry's seq."""
    return [codec.dumps({"seq": seq, **codec.to_dict(d)}) for seq, d in rows]


def _is_time(key: str) -> bool:
    return key.endswith("_at") or key in ("at", "deadline", "until")


def tail_table(
    rows: Sequence[tuple[int, Decision]],
    title: str,
    *,
    time_text: Callable[[float], str] | None = None,
    duration_text: Callable[[float], str] | None = None,
) -> Table:
    """One row per decision: its entry's seq, time, kind, campaign, lease or request, and
    the decision's other fields in brief. ``time_text`` and ``duration_text`` write the
    times (``at``, ``*_at``) and durations (``*_s``) for a reader (the CLI's ISO times and
    "1m56s"); without them they are plain numbers."""

    def brief(key: str, value: Any) -> str:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if time_text is not None and _is_time(key):
                return time_text(float(value))
            if duration_text is not None and key.endswith("_s"):
                return duration_text(float(value))
        return _brief(value)

    table = Table(title=title)
    for name, justify in (
        ("seq", "right"),
        ("at", "right"),
        ("kind", "left"),
        ("campaign", "left"),
        ("lease / request", "left"),
        ("details", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for seq, d in rows:
        fields = codec.to_dict(d)
        ident = next((str(fields[k]) for k in _ID_FIELDS if k in fields), "")
        details = " ".join(
            f"{k}={brief(k, v)}"
            for k, v in fields.items()
            if k not in _HIDDEN and v not in ({}, [])
        )
        table.add_row(
            str(seq),
            brief("at", fields["at"]),
            d.kind,
            str(fields.get("campaign", "")),
            ident,
            details,
        )
    return table
