"""``bursar sim run`` and ``bursar sim experiments``: the simulator's studies
(``bursar.sim.study``) from the shell; ``bursar sim elastic``: elastic, deadline-aware
leases on the ElasticFlow traces (``bursar.sim.elastic``)."""

from __future__ import annotations

import json
import shlex
import sys
from collections import Counter
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bursar.cli.console import report_console
from bursar.cli.params import Finite
from bursar.sim.elastic.report import QUICK_JOBS, Outputs, TraceInput, compare, markdown
from bursar.sim.elastic.runner import (
    CHECK_SAMPLE,
    CHECKS,
    DEFAULT_CHECK,
    DEFAULT_LEASE_TERM_S,
    MEASURED,
    SPEED_MODELS,
    VARIANTS,
    Cluster,
    InvariantViolation,
    RunResult,
    UnknownCluster,
    parse_cluster,
    with_cluster,
)
from bursar.sim.elastic.trace import TraceError, load_curves, load_jobs
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
@click.option(
    "--minutes",
    type=Finite(min=0, min_open=True),
    default=DURATION_S / 60,
    show_default=True,
    help="Simulated minutes.",
)
@click.option(
    "--headroom", type=Finite(min=0), default=32.0, show_default=True, help="Warm headroom, GPUs."
)
@click.option(
    "--grace", type=Finite(min=0), default=30.0, show_default=True, help="Grace period, s."
)
@click.option(
    "--boot", type=Finite(min=0), default=60.0, show_default=True, help="Boot latency, s."
)
@click.option("--no-backfill", is_flag=True, help="Run without the preemptible backfill tier.")
@click.option(
    "--meter-window",
    type=Finite(min=0, min_open=True),
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
    twice = sorted(s for s, n in Counter(seeds).items() if n > 1)
    if twice:
        # A seed run twice gives the same run twice: pooled, it would count double.
        raise click.BadParameter(
            f"{value!r}: seed {', '.join(map(str, twice))} given more than once; "
            "give each seed once"
        )
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
    cpu = sum(r["wall_s"] for r in results)
    console.print(
        f"{len(results)} cells in {wall:.1f} s wall ({cpu:.1f} s of cell time, "
        f"{cpu / wall if wall else 0:.1f}x parallel)"
    )
    console.print(claims_table(table, "Facility experiments, measured"))
    for p in figures:
        console.print(f"figure: {p}", soft_wrap=True)
    console.print(f"cells: {out / 'experiments.json'}", soft_wrap=True)


ELASTIC_DIR = "elasticflow-itp"
ELASTIC_DEFAULT_TRACES = ("195job", "cluster05")


def _elastic_trace(value: str) -> tuple[str, Path]:
    """A trace by name (``195job``, ``cluster05``: under the traces dir) or by path."""
    p = Path(value)
    if p.is_file():
        name = p.name.removesuffix(".gz").removesuffix(".csv")
        return name, p
    from bursar.cli.replay import default_traces_dir

    return value, default_traces_dir() / ELASTIC_DIR / f"{value}.csv.gz"


def _given_clusters(items: tuple[str, ...], names: list[str]) -> dict[str, Cluster]:
    """``--cluster TRACE=NODESxGPUS`` options, checked: a known form, a trace of this run."""
    out: dict[str, Cluster] = {}
    for item in items:
        name, eq, size = item.partition("=")
        try:
            if not eq or not name:
                raise ValueError(f"{item!r} is not TRACE=NODESxGPUS (e.g. cluster01=64x8)")
            out[name] = parse_cluster(size)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--cluster") from None
        if name not in names:
            raise click.BadParameter(
                f"{name!r} is not a trace of this run ({', '.join(names)})",
                param_hint="--cluster",
            )
    return out


@sim.command("elastic")
@click.option(
    "--trace",
    "traces",
    multiple=True,
    metavar="NAME|FILE",
    help="An ElasticFlow job table: a name under $BURSAR_TRACES_DIR/elasticflow-itp "
    "(195job, cluster01 ... cluster05) or a CSV(.gz) path. Repeatable. "
    f"Default: {', '.join(ELASTIC_DEFAULT_TRACES)}.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Choice([v.name for v in VARIANTS]),
    help="Run only this policy (repeatable). Default: all of them.",
)
@click.option(
    "--cluster",
    "clusters",
    multiple=True,
    metavar="TRACE=NODESxGPUS",
    help="One trace's cluster, e.g. cluster01=64x8 (64 nodes of 8 GPUs); repeatable. Beats "
    "--nodes and --gpus-per-node for that trace. Needed for a trace ElasticFlow gives no "
    "size for (any but 195job and cluster01-05), unless --nodes is given.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Nodes in every trace's cluster. Default: ElasticFlow's for the trace (16 for "
    "195job, 64 for cluster01-03 and 05, 128 for cluster04).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs per node. Default: 8, as ElasticFlow's A100 clusters.",
)
@click.option(
    "--gpu-type",
    type=click.Choice(["A100", "T4"]),
    default="A100",
    show_default=True,
    help="Which measured throughput curves (throughputs_A100/ or throughputs_T4/ beside the "
    "traces); the ITP traces' models are measured on A100.",
)
@click.option(
    "--lease-term",
    type=click.FloatRange(min=1.0),
    default=DEFAULT_LEASE_TERM_S,
    show_default=True,
    help="Seconds each lease is asked for; renewed for as long again while work is left.",
)
@click.option(
    "--speed-model",
    "speed_models",
    multiple=True,
    type=click.Choice(SPEED_MODELS),
    help="How a job's measured curve gives its speed: measured (at the measured GPU counts "
    "only, the jobs' sizes limited to them, as ElasticFlow's simulator) or interpolated "
    "(linear between them, any whole GPU count). Repeatable: each model runs every trace "
    "and policy. Default: measured.",
)
@click.option(
    "--check",
    type=click.Choice(CHECKS),
    default=DEFAULT_CHECK,
    show_default=True,
    help="When the engine's full invariant check runs: after every event, after every "
    f"{CHECK_SAMPLE}th (sampled), or at the end only; always once after the last event. The "
    "runner's own checks (sizes, holdings) run after every event.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="The first N jobs only.")
@click.option("--quick", is_flag=True, help=f"The first {QUICK_JOBS} jobs of each trace (tests).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/elastic"),
    show_default=True,
    help="Output dir: elastic.json, elastic.md, elastic.png.",
)
@click.option(
    "--journal",
    "journals",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="Journal every run into DIR/<trace>/<policy>/ (a state dir for `bursar journal "
    "audit --state-dir`); DIR must not hold those journals yet. Off by default (slower).",
)
def elastic_cmd(
    traces: tuple[str, ...],
    policies: tuple[str, ...],
    clusters: tuple[str, ...],
    nodes: int | None,
    gpus_per_node: int | None,
    gpu_type: str,
    lease_term: float,
    speed_models: tuple[str, ...],
    check: str,
    limit: int | None,
    quick: bool,
    out: Path,
    journals: Path | None,
) -> None:
    """Elastic, deadline-aware leases on the ElasticFlow traces, through the real engine.

    Each job asks at its submission for an elastic lease: min 1 GPU, max the fewest GPUs
    at which its curve peaks (at most 64, its batch size and the cluster), its model's measured
    throughput curve as the speedup model, its iterations as the work, its deadline,
    value 1 with step decay. The engine grants min and hands spare GPUs out by the
    policy's rule; the job follows its size, counts its progress on the same curve,
    renews its lease and releases it when done (or at its deadline, worth nothing then).

    \b
    Policies (one engine each, same trace):
      dmug               deadline-aware marginal-utility greedy (the default rule)
      edf, value, proportional   the baseline rules
      dmug-no-elastic    max = min: every job on 1 GPU
      dmug-no-degrade    elastic_degrade off (the traces carry no degrade modes: = dmug)
      dmug-no-admission  elastic_admission off (no DEADLINE_UNREACHABLE refusals)
      dmug-no-risk       elastic_risk off
      fixed              the trace's own num_gpu as a plain lease (no intent)

    Reported per trace and policy: deadlines met (share), refused, value share, GPU
    utilisation, the speed model, the engine's invariants checked (as --check says) and
    every lease within [min, max] on an allowed size, and the SHA-256 of every event with its decisions (same inputs, same hash).

    Each run's row is written as soon as it finishes (a line of OUT/elastic.jsonl, and
    elastic.json and elastic.md rewritten with the runs so far: "complete" turns true with
    the last run), so a run stopped part-way keeps what it finished; a progress bar on
    stderr counts the jobs submitted and names the run under way.
    """
    console = Console(stderr=True)
    names = traces or ELASTIC_DEFAULT_TRACES
    given = _given_clusters(clusters, [_elastic_trace(t)[0] for t in names])
    resolved = [_elastic_trace(t) for t in names]
    missing = [p for _, p in resolved if not p.is_file()]
    if missing:
        raise click.ClickException(
            f"no trace at {missing[0]}; set BURSAR_TRACES_DIR or pass --trace FILE"
        )
    folder = resolved[0][1].parent / f"throughputs_{gpu_type}"
    keep = QUICK_JOBS if quick else limit
    try:
        curves = load_curves(folder)
        inputs = []
        for name, path in resolved:
            jobs = load_jobs(path)
            if keep is not None:
                jobs = jobs[:keep]
            try:
                cluster = with_cluster(name, nodes, gpus_per_node, given)
            except UnknownCluster as e:
                raise click.UsageError(
                    f"{e}: give its size with --cluster {name}=NODESxGPUS (e.g. "
                    f"--cluster {name}=64x8 for 64 nodes of 8 GPUs), or --nodes N for every "
                    "trace"
                ) from None
            inputs.append(TraceInput(name, path, jobs, cluster))
    except TraceError as e:
        raise click.ClickException(str(e)) from None
    variants = [v for v in VARIANTS if not policies or v.name in policies]
    models = speed_models or (MEASURED,)
    total = sum(len(t.jobs) for t in inputs) * len(variants) * len(models)
    conditions = {
        "command": "bursar sim elastic " + " ".join(shlex.quote(a) for a in sys.argv[3:]),
        "traces": {
            t.name: {
                "file": t.path.name,
                "jobs": len(t.jobs),
                "cluster": str(t.cluster),
                "gpus": t.cluster.gpus,
            }
            for t in inputs
        },
        "gpu_type": gpu_type,
        "lease_term_s": lease_term,
        "limit": keep,
        "speed_models": list(models),
        "check": check,
    }
    outputs = Outputs(out, conditions)
    runs = len(inputs) * len(variants) * len(models)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(f"run 1/{runs}", total=total)

        def done(r: RunResult) -> None:
            outputs.add(r)
            n = len(outputs.results)
            bar.update(
                task, description=f"run {min(n + 1, runs)}/{runs} (done {r.trace} · {r.variant})"
            )

        try:
            results = compare(
                inputs,
                curves,
                variants,
                lease_term_s=lease_term,
                progress=lambda k: bar.advance(task, k),
                done=done,
                journals=journals,
                speed_models=models,
                check=check,
            )
        except (TraceError, ValueError, InvariantViolation) as e:
            raise click.ClickException(str(e)) from None
    paths = outputs.finish()
    click.echo(markdown(results), nl=False)
    for p in paths:
        click.echo(f"wrote {p}")
