"""Parameter types the commands share."""

from __future__ import annotations

import math
from typing import Any

import click


class Finite(click.FloatRange):
    """A number within a range, and a number at all: ``click.FloatRange`` lets ``nan``
    (which compares false with every bound) and ``inf`` (within any range without a
    maximum) through, and a simulated run for ``inf`` minutes never ends."""

    name = "finite number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv
