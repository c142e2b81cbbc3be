"""The policy matrix: every policy on every trace, as Markdown, HTML, JSON and figures."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker.errors import require
from bursar.sim.replay.mapping import ReplayConfig
from bursar.sim.replay.metrics import DEFAULT_TAU_S
from bursar.sim.replay.run import replay_trace
from bursar.sim.replay.table import TraceError

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # key, header, format
    ("jobs", "jobs", "{:,}"),
    ("mean_wait_s", "mean wait (s)", "{:,.0f}"),
    ("p50_wait_s", "p50 wait (s)", "{:,.0f}"),
    ("p95_wait_s", "p95 wait (s)", "{:,.0f}"),
    ("max_wait_s", "max wait (s)", "{:,.0f}"),
    ("mean_bsld", "mean bsld", "{:,.2f}"),
    ("p95_bsld", "p95 bsld", "{:,.2f}"),
    ("utilization", "utilisation", "{:.3f}"),
    ("makespan_s", "makespan (s)", "{:,.0f}"),
    ("starved", "starved", "{:,}"),
    ("killed", "killed", "{:,}"),
    ("wall_s", "wall (s)", "{:.1f}"),
)


@dataclass(frozen=True, slots=True)
class Cell:
    trace: str
    policy: str
    metrics: dict[str, Any]
    manifest: dict[str, Any]
    wall_s: float
    limit: int | None
    error: str | None = None
    """Why the run failed (an invariant violation, an engine error); None if it ran."""


def run_matrix(
    traces: Sequence[Path],
    policies: Sequence[str],
    *,
    config: ReplayConfig | None = None,
    tau_s: float = DEFAULT_TAU_S,
    limits: dict[str, int] | None = None,
    progress: Callable[[str, str], None] | None = None,
) -> list[Cell]:
    """``limits`` maps a policy to a job prefix (the broker policy on the largest traces).

    A run that fails (an invariant violation, an error in the engine) becomes a cell with
    the error, and the matrix goes on: it is published win or lose. A trace that cannot
    be read stops it (``TraceError``), since every cell of that trace would fail alike.
    """
    cells = []
    for trace in traces:
        label = trace_label(trace)
        for policy in policies:
            limit = (limits or {}).get(policy)
            t0 = time.perf_counter()
            try:
                r = replay_trace(trace, policy, config=config, tau_s=tau_s, limit=limit)
            except TraceError:
                raise
            except Exception as e:  # recorded in the published matrix, not swallowed
                wall = time.perf_counter() - t0
                err = f"{type(e).__name__}: {e}"
                cells.append(Cell(label, policy, {}, {}, wall, limit, err))
            else:
                cells.append(Cell(label, policy, r.metrics, r.manifest, r.wall_s, limit))
            if progress is not None:
                progress(trace_label(trace), policy)
    return cells


def trace_label(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".swf", ".csv"):
        name = name.removesuffix(suffix)
    return name.removesuffix("-cln")


def _value(c: Cell, key: str) -> Any:
    return c.wall_s if key == "wall_s" else c.metrics.get(key)


def _fmt(fmt: str, v: Any) -> str:
    return "n/a" if v is None else fmt.format(v)


def _policy_label(c: Cell) -> str:
    return c.policy if c.limit is None else f"{c.policy} (first {c.limit:,} jobs)"


def markdown(cells: Sequence[Cell], command: str) -> str:
    ok = [c for c in cells if c.error is None]
    tau = ok[0].metrics["bsld_tau_s"] if ok else DEFAULT_TAU_S
    starve = ok[0].metrics["starvation_s"] if ok else 86400.0
    out = [
        "# Replay policy matrix",
        "",
        f"Regenerate with `{command}`. Every run is strict (invariants checked after every "
        "event); wall time includes reading the trace. Bounded slowdown uses "
        f"tau = {tau:g} s; a job counts as starved when it waits longer than {starve:g} s. "
        "Every job holds its processors for its recorded runtime, also past its requested "
        "time, which the policies use as their estimate only; killed counts the jobs the "
        "broker ended at the expiry of a lease it would not renew.",
        "",
    ]
    for trace in dict.fromkeys(c.trace for c in cells):
        rows = [c for c in cells if c.trace == trace]
        ok = [c for c in rows if c.error is None]
        about = (
            f"Capacity {ok[0].metrics['capacity']} {ok[0].metrics['unit']}; input sha256 "
            f"`{ok[0].manifest['input']['sha256'][:16]}`."
            if ok
            else "No run finished."
        )
        out += [
            f"## {trace}",
            "",
            about,
            "",
            "| policy | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
            "|---|" + "---:|" * len(COLUMNS),
        ]
        for c in rows:
            vals = [_fmt(f, _value(c, k)) for k, _, f in COLUMNS]
            out.append(f"| {_policy_label(c)} | " + " | ".join(vals) + " |")
        out.append("")
        for c in rows:
            if c.error is not None:
                out += [f"**{c.policy} failed**: {c.error}", ""]
    out += [
        "![mean wait, mean bounded slowdown and utilisation per policy and trace]"
        "(replay-matrix.png)",
        "",
    ]
    return "\n".join(out)


def html_table(cells: Sequence[Cell], command: str) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Replay policy matrix</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
        "margin-bottom:2em}td,th{border:1px solid #ccc;padding:4px 8px}td{text-align:right}"
        "td:first-child{text-align:left}</style></head><body>",
        "<h1>Replay policy matrix</h1>",
        f"<p>Regenerate with <code>{html.escape(command)}</code>. Strict invariants on.</p>",
    ]
    for trace in dict.fromkeys(c.trace for c in cells):
        rows = [c for c in cells if c.trace == trace]
        parts.append(f"<h2>{html.escape(trace)}</h2><table><tr><th>policy</th>")
        parts += [f"<th>{html.escape(h)}</th>" for _, h, _ in COLUMNS]
        parts.append("</tr>")
        for c in rows:
            parts.append(f"<tr><td>{html.escape(_policy_label(c))}</td>")
            parts += [f"<td>{_fmt(f, _value(c, k))}</td>" for k, _, f in COLUMNS]
            parts.append("</tr>")
        parts.append("</table>")
        for c in rows:
            if c.error is not None:
                parts.append(
                    f"<p><b>{html.escape(c.policy)} failed</b>: {html.escape(c.error)}</p>"
                )
    parts.append("<img src='replay-matrix.png' alt='policy matrix figure'></body></html>")
    return "\n".join(parts)


def figure(cells: Sequence[Cell], path: Path) -> None:
    require("matplotlib", extra="plots", feature="the replay matrix figure")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(c.trace for c in cells))
    policies = list(dict.fromkeys(c.policy for c in cells))
    panels = (("mean_wait_s", "mean wait (s)"), ("mean_bsld", "mean bounded slowdown"))
    panels += (("utilization", "utilisation"),)
    # One column of panels, 8 in wide: the figure fits a printed page (A4 or letter).
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels) + 0.6), sharex=True)
    width = 0.8 / max(1, len(policies))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for i, pol in enumerate(policies):
            ys = []
            for t in traces:
                c = next((c for c in cells if c.trace == t and c.policy == pol), None)
                v = None if c is None else c.metrics.get(key)
                ys.append(float("nan") if v is None else v)
            xs = [k + (i - (len(policies) - 1) / 2) * width for k in range(len(traces))]
            ax.bar(xs, ys, width, label=pol)
        ax.set_xticks(range(len(traces)), traces, fontsize=8)
        ax.set_ylabel(title, fontsize=8)
        if key != "utilization":
            ax.set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 7), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_matrix(cells: Sequence[Cell], out: Path, command: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "replay-matrix.md"
    md.write_text(markdown(cells, command))
    page = out / "replay-matrix.html"
    page.write_text(html_table(cells, command))
    data = out / "replay-matrix.json"
    data.write_text(
        json.dumps(
            [
                {
                    "trace": c.trace,
                    "policy": c.policy,
                    "limit": c.limit,
                    "wall_s": round(c.wall_s, 2),
                    "error": c.error,
                    "metrics": {k: v for k, v in c.metrics.items() if k != "campaigns"},
                    "manifest": c.manifest,
                }
                for c in cells
            ],
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )
    png = out / "replay-matrix.png"
    figure(cells, png)
    return [md, page, data, png]
