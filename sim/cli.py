"""``bursar sim run``: the §3 scenario in virtual time, its report, metrics and journals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bursar.broker.audit import audit
from bursar.broker.codec import json_safe
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.sim.experiments import FULL, QUICK, SWEEPS, cells, experiment_claims, run_cell
from bursar.sim.report import write_report
from bursar.sim.runner import Params
from bursar.sim.scenario import DURATION_S, SeedRun, claims, run_seed
from bursar.sim.sweep import SweepError, cores, run_cells

__all__ = ["claims_table", "run_experiments", "run_scenario", "sim"]

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
    probe = [
        (x["at"], x["latency"])
        for k, x in first.records
        if k == "latency" and x["campaign"] == "probe" and x["latency"] is not None
    ]
    victim = [
        (x["at"], x["latency"])
        for k, x in first.records
        if k == "latency" and x["campaign"] == "victim" and x["latency"] is not None
    ]
    report = write_report(
        out,
        series=first.series,
        probe=probe,
        victim=victim,
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


@click.group("sim")
def sim() -> None:
    """Facility scenarios in virtual time, on the real engine and the simulated pool."""


@sim.command("run")
@click.option("--seed", type=int, default=None, help="One seed (default: seeds 1, 2, 3 pooled).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/sim"),
    show_default=True,
    help="Output dir: report.html, metrics.json and the journal(s) (the dir itself for one "
    "seed, DIR/seed-N/ for several; each is a state dir for `bursar journal audit`).",
)
@click.option("--minutes", type=float, default=DURATION_S / 60, show_default=True)
@click.option(
    "--headroom", type=float, default=32.0, show_default=True, help="Warm headroom, GPUs."
)
@click.option("--grace", type=float, default=30.0, show_default=True, help="Grace period, s.")
@click.option("--boot", type=float, default=60.0, show_default=True, help="Boot latency, s.")
@click.option("--no-backfill", is_flag=True, help="Run without the preemptible backfill tier.")
@click.option(
    "--meter-window",
    type=float,
    default=60.0,
    show_default=True,
    help="policy.meter_window_s: one Meter grant is at most burst x this (agents meter "
    "once per task step, not every second).",
)
def run_cmd(
    seed: int | None,
    out: Path,
    minutes: float,
    headroom: float,
    grace: float,
    boot: float,
    no_backfill: bool,
    meter_window: float,
) -> None:
    """Run the §3 agent-burst scenario (2 simulated hours) and write its report."""
    console = Console()
    seeds = (seed,) if seed is not None else DEFAULT_SEEDS
    params = Params(
        warm_headroom=headroom,
        grace_s=grace,
        boot_latency_s=boot,
        backfill=not no_backfill,
        meter_window_s=meter_window,
    )
    runs, table, report = run_scenario(out, seeds, params, minutes * 60.0)
    for r in runs:
        console.print(
            f"seed {r.seed}: {r.events} events in {r.wall_s:.2f} s; "
            f"journal {r.state_dir} sha256 {r.journal_sha256}",
            soft_wrap=True,
        )
    m = json.loads((out / "metrics.json").read_text())
    for line in m["audit"]:
        console.print(line)
    console.print(f"metrics: {out / 'metrics.json'}", soft_wrap=True)
    # The claims table and where the report is come last: they are what a person reads.
    console.print(claims_table(table, "Claims of the prototype, measured"))
    console.print(f"report: {report}  (open it in a browser)", soft_wrap=True)


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
    import time

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


def _seeds(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(x) for x in value.replace(",", " ").split())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give integers separated by commas, e.g. --seeds 1,2,3"
        ) from None
    if not seeds:
        raise click.BadParameter("give at least one seed, e.g. --seeds 1")
    return seeds


@sim.command("experiments")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/experiments"),
    show_default=True,
    help="Output dir: experiments.json (every cell: parameters, seed, measured values) and "
    "headroom.png, overbooking.png, enforcement.png.",
)
@click.option(
    "--scheduler",
    metavar="ADDRESS",
    default=None,
    help="A running Dask scheduler (e.g. tcp://host:8786) whose workers have Bursar "
    "installed. Default: a local cluster, one worker process per core.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes of the local cluster (default: the cores this process may use).",
)
@click.option(
    "--seeds",
    default=",".join(str(s) for s in DEFAULT_SEEDS),
    show_default=True,
    callback=_seeds,
    help="Seeds per cell, comma-separated; latency percentiles pool them.",
)
@click.option(
    "--sweep",
    "sweeps",
    type=click.Choice(SWEEPS),
    multiple=True,
    help="Run only this sweep (repeatable). Default: all three.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="A small grid with short runs (2 values per axis, 30-40 simulated minutes): "
    "for tests and a first look.",
)
def experiments_cmd(
    out: Path,
    scheduler: str | None,
    workers: int | None,
    seeds: tuple[int, ...],
    sweeps: tuple[str, ...],
    quick: bool,
) -> None:
    """The three experiments of DESIGN.md §3, each cell a run of the real engine.

    \b
    headroom     warm headroom 16..256 GPUs x grace period 15..120 s: the probe's time
                 to 128 GPUs and the mean utilisation (§3 scenario)
    overbooking  sum of burst ceilings 2..7x the pool, storms all at once: the guaranteed
                 probe's latency p95 (bound 2 s) and guarantee violations (bound 0)
    enforcement  prepaid vs grant-instant, by lease length: GPU-s above R an adversary
                 with B = 25k GPU-s extracts (bounds: prepaid <= 1.1 B, grant-instant >= 3 B)

    Cells run in parallel on Dask: a local cluster by default, or --scheduler ADDRESS.
    """
    console = Console()
    try:
        results, table, figures, wall = run_experiments(
            out,
            seeds=seeds,
            quick=quick,
            sweeps=sweeps or SWEEPS,
            scheduler=scheduler,
            workers=workers,
        )
    except SweepError as exc:
        raise click.ClickException(str(exc)) from None
    cpu = sum(r["wall_s"] for r in results)
    console.print(
        f"{len(results)} cells in {wall:.1f} s wall ({cpu:.1f} s of cell time, "
        f"{cpu / wall if wall else 0:.1f}x parallel)"
    )
    console.print(claims_table(table, "Experiments of DESIGN.md §3, measured"))
    for p in figures:
        console.print(f"figure: {p}", soft_wrap=True)
    console.print(f"cells: {out / 'experiments.json'}", soft_wrap=True)
