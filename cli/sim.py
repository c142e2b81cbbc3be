"""``bursar sim run`` and ``bursar sim experiments``: the simulator's studies
(``bursar.sim.study``) from the shell."""

from __future__ import annotations

import json
from pathlib import Path

import click

from bursar.cli.console import report_console
from bursar.sim.experiments import SWEEPS
from bursar.sim.runner import Params
from bursar.sim.scenario import DURATION_S
from bursar.sim.study import DEFAULT_SEEDS, claims_table, run_experiments, run_scenario
from bursar.sim.sweep import SweepError

__all__ = ["sim"]


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
    default=Params.meter_window_s,
    show_default=True,
    help="policy.meter_window_s: one Meter grant is at most burst x this (the default is "
    "the storm's metering period, so one grant covers one period at the burst rate).",
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
    """Run the agent-burst scenario (2 simulated hours) and write its report."""
    console = report_console()
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
    """The simulator's three facility experiments, each cell a run of the real engine.

    \b
    headroom     warm headroom 16..256 GPUs x grace period 15..120 s: the probe's time
                 to 128 GPUs and the mean utilisation (agent-burst scenario)
    overbooking  sum of burst ceilings 2..7x the pool, storms all at once: the guaranteed
                 probe's latency p95 (bound 2 s) and guarantee violations (bound 0)
    enforcement  prepaid vs grant-instant, by lease length: GPU-s above R an adversary
                 with B = 25k GPU-s extracts (bounds: prepaid <= 1.1 B, grant-instant >= 3 B)

    Cells run in parallel on Dask: a local cluster by default, or --scheduler ADDRESS.
    """
    console = report_console()
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
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("dask", "distributed"):
            raise
        raise click.ClickException(
            f"the experiments run their cells on Dask, which is not installed ({exc.name}): "
            "pip install 'bursar[dask]'"
        ) from None
    cpu = sum(r["wall_s"] for r in results)
    console.print(
        f"{len(results)} cells in {wall:.1f} s wall ({cpu:.1f} s of cell time, "
        f"{cpu / wall if wall else 0:.1f}x parallel)"
    )
    console.print(claims_table(table, "Facility experiments, measured"))
    for p in figures:
        console.print(f"figure: {p}", soft_wrap=True)
    console.print(f"cells: {out / 'experiments.json'}", soft_wrap=True)
