"""A campaign has one colour in every report and in the dashboard: fixed for the demo's
and the scenario's campaigns, from a fixed palette by a hash of the name otherwise."""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from bursar.broker.colours import PALETTE, campaign_colour
from bursar.sim.report import write_report


@given(st.text(min_size=1, max_size=40))
def test_a_campaign_colour_depends_on_its_name_only(name: str) -> None:
    c = campaign_colour(name)
    assert re.fullmatch(r"#[0-9a-f]{6}", c)
    assert c == campaign_colour(str(name))
    assert c in PALETTE or name in {
        "victim",
        "adaptive-sci",
        "naive-sci",
        "storm",
        "backfill",
        "probe",
    }


def test_the_scenario_report_uses_the_campaign_colours(tmp_path: Path) -> None:
    series = {
        "t": [0.0, 10.0],
        "held": {"victim": [1, 2], "site-a": [0, 3]},
        "bucket": {"victim": [5, 4]},
        "price": [0.0, 0.1],
        "idle": {},
    }
    page = write_report(
        tmp_path,
        series=series,
        probe=[],
        victim=[(1.0, 0.5)],
        claims=[],
        unserved=[(5.0, "probe")],
        hashes={1: "0" * 64},
        audit_lines=[],
        wall={1: 1.0},
        title_seed=1,
        capacity=8,
    )
    text = page.read_text()
    blob = re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S)
    assert blob is not None
    data = json.loads(blob.group(1))
    colors = data["colors"]
    # A request that was never served is drawn too (it has no latency).
    assert data["unserved"] == [[5.0, "probe"]]
    assert colors["victim"] == campaign_colour("victim") == "#d62728"
    assert colors["site-a"] == campaign_colour("site-a")
