"""One colour per campaign, the same in every report and in the dashboard.

The demo's and the scenario's campaigns keep the colours their figures have always had;
any other campaign gets one from a fixed palette by a hash of its name, so a site's
campaign has the same colour in every report and on every broker, whatever the order in
which campaigns appear (an index into the palette would change with it)."""

from __future__ import annotations

import hashlib

__all__ = ["PALETTE", "campaign_colour"]

_KNOWN = {
    "victim": "#d62728",
    "adaptive-sci": "#2ca02c",
    "naive-sci": "#ff7f0e",
    "storm": "#9467bd",
    "backfill": "#7f7f7f",
    "probe": "#1f77b4",
}

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#393b79",
    "#637939",
    "#843c39",
)


def campaign_colour(name: str) -> str:
    """The campaign's colour as ``#rrggbb``."""
    known = _KNOWN.get(name)
    if known is not None:
        return known
    h = int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")
    return PALETTE[h % len(PALETTE)]
