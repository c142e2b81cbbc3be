"""One PNG per experiment (matplotlib, Agg; no pyplot, so no global state or display).

Each figure pools the seeds of a cell (latency percentiles over the pooled samples,
utilisation and extraction as the mean over seeds) and draws the claim's bound (or the
prototype's value where the issue sets no bound) as a dashed line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from bursar.sim.experiments import ADVERSARY_BUCKET, pooled
from bursar.sim.scenario import percentile

__all__ = ["write_figures"]

_DPI = 110


def _values(results: list[dict[str, Any]], sweep: str, key: str) -> list[Any]:
    return sorted({r["params"][key] for r in results if r["sweep"] == sweep})


def _mean(results: list[dict[str, Any]], sweep: str, key: str, **params: Any) -> float | None:
    xs = [
        r["measured"][key]
        for r in results
        if r["sweep"] == sweep and all(r["params"].get(k) == v for k, v in params.items())
    ]
    return sum(xs) / len(xs) if xs else None


def _seeds(results: list[dict[str, Any]], sweep: str) -> int:
    return len({r["seed"] for r in results if r["sweep"] == sweep})


def headroom_figure(results: list[dict[str, Any]], path: Path) -> Path:
    heads = _values(results, "headroom", "warm_headroom")
    graces = _values(results, "headroom", "grace_s")
    fig = Figure(figsize=(11, 4.2), dpi=_DPI, layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    colors = ["#1f77b4", "#2ca02c", "#ff7f0e", "#d62728", "#9467bd", "#8c564b"]
    for k, g in enumerate(graces):
        c = colors[k % len(colors)]
        p50, p95 = [], []
        for h in heads:
            lat = pooled(results, "headroom", "probe_latencies_s", warm_headroom=h, grace_s=g)
            p50.append(percentile(lat, 0.5))
            p95.append(percentile(lat, 0.95))
        ax1.plot(heads, [float("nan") if v is None else v for v in p50], "o-", color=c,
                 label=f"grace {g:g} s: p50")  # fmt: skip
        ax1.plot(heads, [float("nan") if v is None else v for v in p95], "^:", color=c,
                 alpha=0.6, label=f"grace {g:g} s: p95")  # fmt: skip
        ax1.axhline(g + 2, color=c, ls="--", lw=1, alpha=0.8)
        util = [
            _mean(results, "headroom", "utilisation", warm_headroom=h, grace_s=g) for h in heads
        ]
        ax2.plot(heads, [100 * (u or 0) for u in util], "o-", color=c, label=f"grace {g:g} s")
    ax1.plot([], [], "k--", lw=1, label="prototype: p50 = grace + 2 s")
    head = [r for r in results if r["sweep"] == "headroom"]
    unserved = sum(r["measured"]["probe_refused"] for r in head)
    served = sum(len(r["measured"]["probe_latencies_s"]) for r in head)
    ax1.text(
        0.01,
        0.99,
        f"{unserved} of {unserved + served} probes not served within 290 s (not plotted)",
        transform=ax1.transAxes,
        va="top",
        fontsize=7,
    )
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(heads, [f"{h:g}" for h in heads])
    ax1.set_xlabel("warm headroom (GPUs)")
    ax1.set_ylabel("probe time to 128 GPUs (s)")
    ax1.set_title("Time to 128 GPUs (probe, every 5 min)")
    ax1.legend(fontsize=7, ncol=2)
    ax2.axhline(85, color="k", ls="--", lw=1, label="bound: 85% (with backfill)")
    ax2.set_xscale("log", base=2)
    ax2.set_xticks(heads, [f"{h:g}" for h in heads])
    ax2.set_xlabel("warm headroom (GPUs)")
    ax2.set_ylabel("mean pool utilisation (%)")
    ax2.set_ylim(0, 100)
    ax2.set_title("Utilisation")
    ax2.legend(fontsize=8)
    fig.suptitle(
        f"Warm headroom x grace period (agent-burst scenario, {_seeds(results, 'headroom')} seed(s) pooled)"
    )
    fig.savefig(path)
    return path


def overbooking_figure(results: list[dict[str, Any]], path: Path) -> Path:
    factors = _values(results, "overbooking", "factor")
    fig = Figure(figsize=(11, 4.2), dpi=_DPI, layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    p95, p50 = [], []
    for f in factors:
        lat = pooled(results, "overbooking", "probe_latencies_s", factor=f)
        p95.append(percentile(lat, 0.95))
        p50.append(percentile(lat, 0.5))
    ax1.plot(factors, [float("nan") if v is None else v for v in p95], "o-", label="p95")
    ax1.plot(factors, [float("nan") if v is None else v for v in p50], "s:", label="p50")
    ax1.axhline(2.0, color="k", ls="--", lw=1, label="bound: p95 <= 2 s")
    ax1.set_ylim(bottom=-0.2, top=max([2.5, *[v for v in p95 if v is not None]]) * 1.1)
    ax1.set_xlabel("overbooking: sum of burst ceilings / pool (x)")
    ax1.set_ylabel("guaranteed probe time to 128 GPUs (s)")
    ax1.set_title("Guaranteed probe latency")
    ax1.legend(fontsize=8)
    viol = []
    for f in factors:
        xs = [
            r["measured"]["guarantee_violations"]
            for r in results
            if r["sweep"] == "overbooking" and r["params"]["factor"] == f
        ]
        viol.append(sum(xs))
    ax2.bar(factors, viol, width=0.5, color="#d62728", label="violations (probe + victim)")
    for f, v in zip(factors, viol, strict=True):
        ax2.annotate(str(v), (f, v), ha="center", va="bottom", xytext=(0, 3),
                     textcoords="offset points")  # fmt: skip
    ax2.axhline(0, color="k", ls="--", lw=1, label="bound: 0")
    ax2.set_ylim(-0.5, max([1, *viol]) + 0.5)
    ax2.set_xlabel("overbooking: sum of burst ceilings / pool (x)")
    ax2.set_ylabel("guarantee violations (requests)")
    ax2.set_title("Requests within a guarantee not served at once")
    ax2.legend(fontsize=8)
    fig.suptitle(
        "Overbooking with correlated storms "
        f"({_seeds(results, 'overbooking')} seed(s) pooled, 512-GPU pool)"
    )
    fig.savefig(path)
    return path


def enforcement_figure(results: list[dict[str, Any]], path: Path) -> Path:
    leases = _values(results, "enforcement", "lease_s")
    fig = Figure(figsize=(7, 4.5), dpi=_DPI, layout="constrained")
    ax = fig.subplots()
    for mode, style in (("prepaid", "o-"), ("grant_instant", "s-")):
        ys = [
            _mean(results, "enforcement", "extracted_over_bucket", enforcement=mode, lease_s=x)
            for x in leases
        ]
        pts = [(x, y) for x, y in zip(leases, ys, strict=True) if y is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=mode.replace("_", "-"))
    ax.axhline(1.1, color="#1f77b4", ls="--", lw=1, label="bound: prepaid <= 1.1 B")
    ax.axhline(3.0, color="#ff7f0e", ls="--", lw=1, label="bound: grant-instant >= 3 B")
    ax.set_yscale("symlog", linthresh=0.5, linscale=0.5)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("adversary lease length (s)")
    ax.set_ylabel(f"GPU-s above R extracted / B (B = {ADVERSARY_BUCKET:.0f} GPU-s)")
    ax.set_title("Bucket enforcement: what an adversary extracts")
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


def write_figures(results: list[dict[str, Any]], out: Path) -> list[Path]:
    """One PNG per sweep present in ``results``."""
    made = []
    sweeps = {r["sweep"] for r in results}
    for name, fn in (
        ("headroom", headroom_figure),
        ("overbooking", overbooking_figure),
        ("enforcement", enforcement_figure),
    ):
        if name in sweeps:
            made.append(fn(results, out / f"{name}.png"))
    return made
