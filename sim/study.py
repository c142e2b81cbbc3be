"""The simulator's studies, run end to end and written to disk: the agent-burst scenario over
seeds (``bursar sim run``: audited journals, ``report.html``, ``metrics.json``) and the
three experiments' sweeps on Dask (``bursar sim experiments``: ``experiments.json`` and one
figure per sweep), and their claims as a terminal table."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bursar.broker.audit import audit
from bursar.broker.codec import json_safe
from bursar.broker.errors import require
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.sim.experiments import FULL, QUICK, SWEEPS, cells, experiment_claims, run_cell
from bursar.sim.report import write_report
from bursar.sim.runner import Params
from bursar.sim.scenario import DURATION_S, SeedRun, claims, run_seed
from bursar.sim.sweep import cores, run_cells

__all__ = ["DEFAULT_SEEDS", "claims_table", "run_experiments", "run_scenario"]

DEFAULT_SEEDS = (1, 2, 3)


def run_scenario(
    out: Path,
    seeds: tuple[int, ...] = DEFAULT_SEEDS,
    params: Params | None = None,
    duration: float = DURATION_S,
    console: Console | None = None,
) -> tuple[list[SeedRun], list[dict[str, Any]], Path]:
    """Run every seed (one state dir each: ``out`` for one seed, ``out/seed-N`` for
    several), audit each journal, and write ``report.html`` and ``metrics.json``."""
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console(stderr=True)
    runs: list[SeedRun] = []
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[t]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        for seed in seeds:
            task = progress.add_task(f"seed {seed}", total=duration, t="")
            state = out if len(seeds) == 1 else out / f"seed-{seed}"

            def tick(t: float, task: Any = task) -> None:
                progress.update(task, completed=t, t=f"{t / 60:.0f}/{duration / 60:.0f} min")

            runs.append(run_seed(seed, state, params, duration, progress=tick))
            progress.update(task, completed=duration)
    audit_lines = []
    reports = []
    for r in runs:
        with Journal.open(r.state_dir / JOURNAL_FILENAME) as j:
            rep = audit(j)
        reports.append(rep)
        audit_lines.append(
            f"seed {r.seed}: audited {rep.events_checked} events, {rep.decisions_checked} "
            f"decisions: {'clean' if rep.ok else f'{len(rep.mismatches)} MISMATCHES'}"
        )
    table = claims(runs, reports)
    first = runs[0]
    replays = {r.seed: _replay(r) for r in runs}
    shown = replays[first.seed]
    report = write_report(
        out,
        series=first.series,
        probe=shown["probe"],
        victim=shown["victim"],
        unserved=shown["unserved"],
        replays=replays,
        claims=table,
        hashes={r.seed: r.journal_sha256 for r in runs},
        audit_lines=audit_lines,
        wall={r.seed: r.wall_s for r in runs},
        title_seed=first.seed,
        capacity=512.0,
    )
    metrics = {
        "duration_s": duration,
        "seeds": {str(r.seed): r.metrics for r in runs},
        "journals": {
            str(r.seed): {"state_dir": str(r.state_dir), "sha256": r.journal_sha256} for r in runs
        },
        "audit": audit_lines,
        "claims": table,
    }
    (out / "metrics.json").write_text(
        json.dumps(json_safe(metrics), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    return runs, table, report


def claims_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for col in ("claim", "bound", "measured", "pass"):
        t.add_column(col)
    for c in rows:
        if c["bound"] == "(measured only)":
            verdict = "[dim]-"  # no bound to pass or miss
        else:
            verdict = "[green]pass" if c["holds"] else "[red]miss"
        t.add_row(c["claim"], c["bound"], c["measured"], verdict)
    return t


def run_experiments(
    out: Path,
    *,
    seeds: tuple[int, ...] = DEFAULT_SEEDS,
    quick: bool = False,
    sweeps: tuple[str, ...] = SWEEPS,
    scheduler: str | None = None,
    workers: int | None = None,
    console: Console | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Path], float]:
    """Run the sweeps' cells on Dask; write ``experiments.json`` and one PNG per sweep.
    Returns (cells with results, claims, figure paths, wall seconds)."""
    # Both extras are checked before any cell runs, not after minutes of work.
    require(
        "dask.distributed", extra="dask", feature="bursar sim experiments (its cells run on Dask)"
    )
    require("matplotlib", extra="plots", feature="the experiments' figures")
    grid = QUICK if quick else FULL
    todo = cells(grid, seeds, sweeps)
    t0 = time.perf_counter()
    results = run_cells(
        run_cell,
        todo,
        scheduler=scheduler,
        workers=workers,
        console=console,
        description=f"{len(todo)} cells",
    )
    wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    table = experiment_claims(results)
    # matplotlib takes a second to import: only the command that draws pays for it.
    from bursar.sim.figures import write_figures

    figures = write_figures(results, out)
    doc = {
        "grid": {"quick": quick, **dataclasses.asdict(grid)},
        "seeds": list(seeds),
        "sweeps": list(sweeps),
        "scheduler": scheduler or f"LocalCluster({workers or cores()} workers)",
        "wall_s": round(wall, 3),
        "cell_wall_s_total": round(sum(r["wall_s"] for r in results), 3),
        "claims": table,
        "figures": [p.name for p in figures],
        "cells": results,
    }
    (out / "experiments.json").write_text(
        json.dumps(json_safe(doc), indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    return results, table, figures, wall


def _replay(r: SeedRun) -> dict[str, Any]:
    """One seed's replay for the report: its series, the probe's and victim's latencies,
    and their requests never served (refused, or timed out: no latency, drawn apart)."""

    def lat(who: str) -> list[tuple[float, float]]:
        return [
            (x["at"], x["latency"])
            for k, x in r.records
            if k == "latency" and x["campaign"] == who and x["latency"] is not None
        ]

    s = r.series
    return {
        "t": s["t"],
        "held": s["held"],
        "bucket": s["bucket"],
        "price": s["price"],
        "idle": s["idle"],
        "probe": lat("probe"),
        "victim": lat("victim"),
        "unserved": [
            (x["at"], x["campaign"])
            for k, x in r.records
            if k == "latency" and x["campaign"] in ("probe", "victim") and x["latency"] is None
        ],
    }
