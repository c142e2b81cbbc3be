"""A facility power cap sweep: one trace replayed uncapped (metered) and under each cap.

Per cap: p95 bounded slowdown, mean wait, energy, peak draw, the hours the draw spent
above the cap (0 under enforcement: the kernel checks it after every start) beside the
hours the uncapped run spent above it, and the jobs stranded (a job whose own draw
exceeds the cap less the machine's idle draw can never start under it: refused). Two
marks: the feasibility floor (the machine idle but for the job with the largest draw;
below it that job, and any like it, is stranded) and the knee, the lowest cap whose p95
bounded slowdown stays within ``KNEE_TOLERANCE`` of the uncapped run's.

The functional core is ``sweep`` (no I/O beyond reading the trace); ``markdown`` renders
the report.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bursar.broker.codec import json_safe
from bursar.sim.power.model import NodePower
from bursar.sim.replay.manifest import canonical, sha256
from bursar.sim.replay.power import PowerSpec, facility, power_metrics
from bursar.sim.replay.run import RunResult, replay_trace

KNEE_TOLERANCE = 0.10
"""The knee: the lowest cap whose p95 bounded slowdown is within 10% of the uncapped run's."""
AUTO_FRACTIONS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.55, 0.5, 0.475, 0.45, 0.425, 0.4)
"""``auto`` caps: these fractions of the uncapped run's peak draw (those above its idle
draw): coarse near the peak, where a cap strands a few of the largest jobs and costs the
rest little, finer towards the mean draw, where waits grow."""


def auto_caps(peak_w: float, idle_w: float) -> list[float]:
    """The caps of an ``auto`` sweep: fractions of the uncapped peak, whole watts, above idle."""
    return [c for c in (float(math.floor(f * peak_w)) for f in AUTO_FRACTIONS) if c > idle_w]


def _row(cap_w: float | None, r: RunResult, uncapped_above: dict[str, float]) -> dict[str, Any]:
    m = r.metrics
    pw = m["power"]
    key = f"{cap_w / 1e3:g}" if cap_w is not None else None
    return {
        "cap_kw": None if cap_w is None else cap_w / 1e3,
        "jobs": m["jobs"],
        "stranded": pw["stranded"],
        "p95_bsld": m["p95_bsld"],
        "mean_wait_s": m["mean_wait_s"],
        "energy_mwh": pw["energy_kwh"] / 1e3,
        "peak_kw": pw["peak_kw"],
        "hours_above": 0.0 if key is None else pw["hours_above"].get(key, 0.0),
        "uncapped_hours_above": None if key is None else uncapped_above.get(key, 0.0),
        "schedule_sha256": r.manifest["outputs"]["schedule_sha256"],
    }


def sweep(
    trace: str | Path,
    policy: str,
    node: NodePower,
    caps_w: Sequence[float] | None = None,
    *,
    capacity: int | None = None,
    limit: int | None = None,
    tau_s: float | None = None,
    fmt: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The uncapped run and one run per cap (``None``: ``auto_caps``), as plain data."""
    kw: dict[str, Any] = {"capacity": capacity, "limit": limit, "fmt": fmt}
    if tau_s is not None:
        kw["tau_s"] = tau_s
    base = replay_trace(trace, policy, power=PowerSpec(node), **kw)
    fp = facility(base.workload, PowerSpec(node))
    peak = base.metrics["power"]["peak_kw"] * 1e3
    if caps_w is None:
        caps_w = auto_caps(peak, fp.idle_w)
    bad = [c for c in caps_w if not c > fp.idle_w]
    if bad:
        raise ValueError(
            f"a cap must be above the machine's idle draw ({fp.idle_w / 1e3:g} kW): "
            f"{', '.join(f'{c / 1e3:g} kW' for c in bad)} is not"
        )
    caps = sorted(set(caps_w), reverse=True)
    uncapped = power_metrics(base.workload, base.schedule, fp, caps)
    if progress:
        progress("uncapped")
    rows = [_row(None, base, uncapped["hours_above"])]
    for cap in caps:
        r = replay_trace(trace, policy, power=PowerSpec(node, cap), **kw)
        rows.append(_row(cap, r, uncapped["hours_above"]))
        if progress:
            progress(f"{cap / 1e3:g} kW")
    ref = rows[0]["p95_bsld"]
    within = [r for r in rows[1:] if r["p95_bsld"] <= ref * (1 + KNEE_TOLERANCE)]
    knee = min((r["cap_kw"] for r in within), default=None)
    # The run hash: every row (each run's schedule digest among them), canonical JSON.
    run_hash = sha256(canonical(json_safe(rows)))
    return {
        "run_sha256": run_hash,
        "trace": str(trace),
        "policy": policy,
        "jobs": base.metrics["jobs"],
        "capacity": base.workload.capacity,
        "node": PowerSpec(node).to_dict(),
        "idle_kw": fp.idle_w / 1e3,
        "floor_kw": uncapped["floor_kw"],
        "uncapped_peak_kw": uncapped["peak_kw"],
        "knee_kw": knee,
        "knee_tolerance": KNEE_TOLERANCE,
        "rows": rows,
    }


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def markdown(rep: dict[str, Any], command: str, date: str) -> str:
    node = rep["node"]
    lines = [
        f"Trace `{Path(rep['trace']).name}`, policy `{rep['policy']}`, {rep['jobs']:,} jobs on "
        f"{rep['capacity']} nodes. Node power: idle {node['idle_w']:g} W, peak "
        f"{node['peak_w']:g} W ({node['source']}). Measured {date} (run hash "
        f"`{rep['run_sha256'][:16]}`) with:",
        "",
        f"    {command}",
        "",
        f"Idle draw {rep['idle_kw']:,.1f} kW; uncapped peak {rep['uncapped_peak_kw']:,.1f} kW; "
        f"feasibility floor {rep['floor_kw']:,.1f} kW (below it the job with the largest "
        f"draw is stranded); knee "
        + (
            f"{rep['knee_kw']:,.1f} kW (the lowest cap with p95 bounded slowdown within "
            f"{rep['knee_tolerance']:.0%} of the uncapped run's)."
            if rep["knee_kw"] is not None
            else f"none (every cap costs more than {rep['knee_tolerance']:.0%})."
        ),
        "",
        "| cap (kW) | jobs run | stranded | p95 bsld | mean wait (s) | energy (MWh) | peak (kW) "
        "| hours above cap | uncapped hours above cap | schedule sha256 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rep["rows"]:
        cap = "none" if r["cap_kw"] is None else f"{r['cap_kw']:,.1f}"
        lines.append(
            f"| {cap} | {r['jobs'] - r['stranded']:,} | {r['stranded']:,} | "
            f"{r['p95_bsld']:,.2f} | {r['mean_wait_s']:,.0f} | {r['energy_mwh']:,.1f} | "
            f"{r['peak_kw']:,.1f} | {_f(r['hours_above'], ',.1f')} | "
            f"{_f(r['uncapped_hours_above'], ',.1f')} | `{r['schedule_sha256'][:12]}` |"
        )
    return "\n".join(lines) + "\n"
