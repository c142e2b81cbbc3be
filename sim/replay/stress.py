"""Stress scenarios for a what-if: the same candidates graded on generated workloads of
known shape (``synth``) as well as on the site's history.

A change graded on one history says nothing of a burst the site has not had yet. Each
scenario is a ``SynthParams`` variation on the history's machine size: the model's own
workload (``base``), a heavy tail of runtimes, a burst shock, one user dominating, and a
low load. Every scenario is one seed's workload, written beside the report, so a failure
can be replayed alone. A candidate *fails* a scenario when its verdict there is
"rejected" (a hard constraint broken, or p95 bounded slowdown no better than the
baseline's; see ``whatif``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from bursar.sim.replay.synth import SynthParams

DAY_S = 86_400.0

SCENARIOS: dict[str, dict[str, Any]] = {
    "base": {},
    "heavy-tail": {"tail_alpha": 1.0, "max_runtime_s": 7 * DAY_S},
    "burst": {"burst": (10 * DAY_S, 3 * DAY_S, 8.0)},
    "one-user": {"user_skew": 2.5},
    "low-load": {"load": 0.3},
}
"""Each scenario's knobs over ``SynthParams``' defaults (``bursar traces synth``)."""


def scenario_params(name: str, capacity: int, jobs: int, seed: int) -> SynthParams:
    """The workload of scenario ``name`` on a machine of ``capacity``."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown stress scenario {name!r}; allowed: {', '.join(SCENARIOS)}")
    p = replace(SynthParams(), jobs=jobs, capacity=capacity, seed=seed, **SCENARIOS[name])
    p.check()
    return p


def summary(verdicts: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
    """Per candidate (in order): its verdict in each setting ("history" and the scenarios)
    and the settings it fails. ``verdicts`` maps a setting to candidate label -> verdict."""
    labels: list[str] = []
    for per in verdicts.values():
        labels.extend(k for k in per if k not in labels)
    rows = []
    for label in labels:
        got = {s: per.get(label, "not run") for s, per in verdicts.items()}
        rows.append(
            {
                "label": label,
                "verdicts": got,
                "fails": [s for s, v in got.items() if v != "accepted"],
            }
        )
    return rows


def markdown(rows: Sequence[dict[str, Any]], settings: Sequence[str], command: str) -> str:
    """The stress table: a row per candidate, a column per setting, and where it fails."""
    out = [
        "# Stress what-if",
        "",
        f"Regenerate with `{command}`. Each scenario is a generated workload (bursar "
        "traces synth) on the history's machine size; a candidate fails a setting where "
        "its verdict is rejected. Each setting's full report is in its own folder.",
        "",
        "| candidate | " + " | ".join(settings) + " | fails in |",
        "|---|" + "---|" * len(settings) + "---|",
    ]
    for r in rows:
        cells = [r["verdicts"].get(s, "not run") for s in settings]
        fails = ", ".join(r["fails"]) or "none"
        out.append(f"| `{r['label']}` | " + " | ".join(cells) + f" | {fails} |")
    out.append("")
    out.append("Scenarios (over the synth defaults):")
    out.append("")
    for name, knobs in SCENARIOS.items():
        shown = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "the model's defaults"
        out.append(f"- `{name}`: {shown}")
    return "\n".join(out) + "\n"
