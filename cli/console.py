"""The console the report-style commands (``bursar demo``, ``bursar sim``) print with.

Rich sizes a console to 80 columns when stdout is not a terminal (a file, a CI log), and
its tables then cut their cells short with an ellipsis. Those outputs are read later, in
an editor or a log viewer that scrolls sideways, so off a terminal the console is made wide
enough for the widest table instead; ``COLUMNS`` still wins when it is set.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console

__all__ = ["OFF_TERMINAL_WIDTH", "report_console"]

OFF_TERMINAL_WIDTH = 200
"""Columns when stdout is not a terminal and COLUMNS is unset: wider than any report table."""


def report_console(file: TextIO | None = None) -> Console:
    out = file if file is not None else sys.stdout
    if out.isatty() or os.environ.get("COLUMNS"):
        return Console(file=file)
    return Console(file=file, width=OFF_TERMINAL_WIDTH)
