"""The scenario report explains, on the page, each claim it misses."""

from __future__ import annotations

from pathlib import Path

from bursar.sim.report import write_report


def test_a_missed_claim_shows_why_beside_its_measured_value(tmp_path: Path) -> None:
    series = {"t": [0.0], "held": {"victim": [1]}, "bucket": {}, "price": [0.0], "idle": {}}
    claims = [
        {"claim": "a", "prototype": "x", "bound": ">= 2", "measured": "1.5", "holds": False,
         "why": "because of B & C"},
        {"claim": "b", "prototype": "y", "bound": ">= 1", "measured": "3", "holds": True,
         "why": ""},
    ]  # fmt: skip
    page = write_report(
        tmp_path,
        series=series,
        probe=[],
        victim=[],
        claims=claims,
        hashes={1: "0" * 64},
        audit_lines=[],
        wall={1: 1.0},
        title_seed=1,
        capacity=8,
    ).read_text()
    assert "<div class='why'>because of B &amp; C</div>" in page
    assert page.count("class='why'") == 1
