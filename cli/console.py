"""The console the report-style commands (``bursar demo``, ``bursar sim``) print with, and
the one way the CLI writes times and durations for people (``iso_time``, ``human_duration``;
``--json`` output keeps the numbers).

Rich sizes a console to 80 columns when stdout is not a terminal (a file, a CI log), and
its tables then cut their cells short with an ellipsis. Those outputs are read later, in
an editor or a log viewer that scrolls sideways, so off a terminal the console is made wide
enough for the widest table instead; ``COLUMNS`` still wins when it is set.
"""

from __future__ import annotations

import math
import os
import sys
from datetime import UTC, datetime
from typing import TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["OFF_TERMINAL_WIDTH", "human_duration", "iso_time", "report_console", "tsv_lines"]

OFF_TERMINAL_WIDTH = 200
"""Columns when stdout is not a terminal and COLUMNS is unset: wider than any report table."""


def report_console(file: TextIO | None = None, *, highlight: bool = True) -> Console:
    out = file if file is not None else sys.stdout
    if out.isatty() or os.environ.get("COLUMNS"):
        return Console(file=file, highlight=highlight)
    return Console(file=file, width=OFF_TERMINAL_WIDTH, highlight=highlight)


def _plain(cell: object) -> str:
    text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
    return " ".join(text.split())  # no tab or newline inside a field


def tsv_lines(table: Table) -> list[str]:
    """A rich table as tab-separated lines: the header, then one line per row."""
    columns = table.columns
    rows = zip(*(list(c.cells) for c in columns), strict=True)
    return ["\t".join(_plain(c.header) for c in columns)] + [
        "\t".join(_plain(cell) for cell in row) for row in rows
    ]


def iso_time(t: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC to the millisecond, e.g.
    ``2026-12-01T22:50:12.123Z``: one reading whatever the reader's time zone."""
    if not math.isfinite(t):
        return "never" if t > 0 else "-"
    stamp = datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def human_duration(s: float) -> str:
    """Seconds for a person: ``0.5s``, ``42s``, ``1m56s``, ``3h05m``, ``2d04h``; ``∞`` for
    unlimited. Negative durations keep their sign."""
    if math.isnan(s):
        return "-"
    if s < 0:
        return "-" + human_duration(-s)
    if math.isinf(s):
        return "∞"
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s".replace(".0s", "s")
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"
