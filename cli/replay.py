"""``bursar replay`` and ``bursar matrix``: grade admission policies on real job traces."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bursar.broker.errors import ConfigError
from bursar.cli.policies import PolicyChoice, policies_help, warn_refused_plugins
from bursar.cli.traces import (
    default_traces_dir,
    node_power_option,
    node_power_table,
    resolve_trace,
    trace_option,
    traces_dir_option,
)
from bursar.sim.power.readers import read_m100_node_power
from bursar.sim.replay.estimate import ESTIMATES, EXTENDS
from bursar.sim.replay.fidelity import Fidelity, fidelity, gate_rows
from bursar.sim.replay.ingest import FORMATS
from bursar.sim.replay.kernel import InvariantViolation
from bursar.sim.replay.mapping import ReplayConfig, load_replay_config
from bursar.sim.replay.matrix import run_matrix, write_matrix
from bursar.sim.replay.metrics import DEFAULT_TAU_S
from bursar.sim.replay.policies import POLICIES, plugin
from bursar.sim.replay.power import PowerSpec
from bursar.sim.replay.run import replay_trace, write_run
from bursar.sim.replay.table import QualityReport, TraceError

__all__ = ["default_traces_dir", "fidelity_command", "matrix_command", "replay_command"]

# Catalogue names (bursar traces list): the matrix's default traces.
LARGE_TRACES = ("ctc-sp2", "sdsc-sp2", "hpc2n")


def _config(path: Path | None) -> ReplayConfig:
    if path is None:
        return ReplayConfig()
    try:
        return load_replay_config(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


_policy_choice = PolicyChoice()
_format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(list(FORMATS)),
    help="Trace format; default: told from the file name, else from its first line "
    "(sacct-gpu, sizes in GPUs, is never guessed).",
)


def quality_table(q: QualityReport, title: str = "trace quality") -> Table:
    """The ingestion report: records read, kept, and each reason a record was dropped."""
    table = Table(title=title, show_header=False)
    table.add_row("records", f"{q.records:,}")
    table.add_row("kept", f"{q.kept:,}")
    for reason, count in sorted(q.dropped.items()):
        table.add_row("dropped", f"{count:,}: {reason}")
    if not q.dropped:
        table.add_row("dropped", "none")
    if q.absent:
        table.add_row("not recorded", ", ".join(q.absent))
    for note in q.notes:
        table.add_row("note", note)
    return table


@click.command(
    "replay",
    help=(
        "Replay a job trace (SWF plain or gzip, the Alibaba GPU pod list, the Philly "
        "trace, Slurm sacct --parsable2 output or a PBS/Torque accounting log) under one "
        "admission policy, checking invariants after every event, and "
        "write DIR/metrics.json (jobs, waits, bounded slowdown, utilisation, makespan, "
        "per-campaign shares, starvation, jobs that ran past their request, jobs killed, "
        "the ingestion quality report and the run manifest), DIR/manifest.json and "
        "DIR/schedule.csv (start and end of every job). Every job holds its processors for "
        "its recorded runtime; the requested time is the policies' estimate. A plug-in "
        "policy always replays strict; the manifest names its distribution and version. "
        + policies_help()
    ),
)
@trace_option
@click.option("--policy", required=True, type=_policy_choice, help="Admission policy.")
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    help="Processors (or GPUs) of the machine; default: the trace header's MaxProcs.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/replay"),
    show_default=True,
)
@click.option(
    "--bsld-tau",
    type=float,
    default=DEFAULT_TAU_S,
    show_default=True,
    help="Bounded-slowdown threshold tau in seconds.",
)
@click.option(
    "--strict/--no-strict",
    default=True,
    show_default=True,
    help="Check the invariants after every event and stop at the first violation.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Replay config (TOML): campaigns per user/group/one and their envelopes.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Replay only the first N jobs.")
@_format_option
@click.option(
    "--estimate",
    type=click.Choice(list(ESTIMATES)),
    default="requested",
    show_default=True,
    help="What the policy takes a job's runtime to be: its requested time; Tsafrir's "
    "prediction (the average of the user's last two runtimes, capped at the request); or "
    "the median or 10th percentile of a quantile model trained in time order (needs the "
    "predict extra: scikit-learn). For "
    f"{', '.join(EXTENDS)}. A job outliving its estimate has it extended to its request.",
)
@click.option(
    "--power-cap",
    type=click.FloatRange(min=0, min_open=True),
    metavar="KW",
    help="A facility power cap (kW) the policy keeps (fifo, easy, conservative): a job "
    "starts only if the machine's draw (idle nodes and running jobs, each capacity unit "
    "one node of the --node-power model) stays under it; one whose own draw cannot fit "
    "is stranded. metrics.json then has power: energy, peak, hours above the cap.",
)
@click.option(
    "--meter-power",
    is_flag=True,
    help="Meter the draw (metrics.json: power) without a cap; implied by --power-cap.",
)
@node_power_option
def replay_command(
    trace: Path,
    policy: str,
    capacity: int | None,
    out: Path,
    bsld_tau: float,
    strict: bool,
    config_path: Path | None,
    limit: int | None,
    fmt: str | None,
    estimate: str,
    power_cap: float | None,
    meter_power: bool,
    node_power: Path | None,
    traces_dir: Path | None,
) -> None:
    trace = resolve_trace(trace, traces_dir)
    console = Console(stderr=True)
    warn_refused_plugins()
    config = _config(config_path)
    power = None
    try:
        if power_cap is not None or meter_power:
            node = read_m100_node_power(node_power_table(node_power, traces_dir))
            power = PowerSpec(node, None if power_cap is None else power_cap * 1e3)
        with console.status(f"replaying {trace.name} under {policy}"):
            result = replay_trace(
                trace,
                policy,
                capacity=capacity,
                config=config,
                tau_s=bsld_tau,
                strict=strict,
                limit=limit,
                fmt=fmt,
                estimate=estimate,
                power=power,
            )
    except (TraceError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except InvariantViolation as e:
        plug = plugin(policy)
        who = policy if plug is None else plug.where()
        raise click.ClickException(f"{trace}: {who}: {e}") from None
    path = write_run(result, out)
    m = result.metrics
    title = f"{trace.name} · {policy}" + ("" if estimate == "requested" else f" · {estimate}")
    table = Table(title=title, show_header=False)
    for key in ("jobs", "mean_wait_s", "p95_wait_s", "mean_bsld", "p95_bsld"):
        table.add_row(key, f"{m[key]:,.2f}" if isinstance(m[key], float) else str(m[key]))
    table.add_row("utilization", f"{m['utilization']:.3f}")
    table.add_row("makespan_s", f"{m['makespan_s']:,.0f}")
    table.add_row("starved", str(m["starved"]))
    table.add_row("ran past request", f"{m['ran_past_request']:,}")
    table.add_row(
        "killed", f"{m['killed']:,} ({m['killed_unit_seconds']:,.0f} {m['unit']}-seconds lost)"
    )
    if power is not None:
        pw = m["power"]
        table.add_row(
            "power",
            f"energy {pw['energy_kwh']:,.0f} kWh, peak {pw['peak_kw']:,.1f} kW, idle "
            f"{pw['idle_kw']:,.1f} kW, floor {pw['floor_kw']:,.1f} kW",
        )
    if m["refused"] and power is not None and power.cap_w is not None:
        table.add_row("stranded", f"{m['refused']:,} (their own draw cannot fit under the cap)")
    elif m["refused"]:
        table.add_row("refused", f"{m['refused']:,} (larger than the pool can ever give them)")
    table.add_row(
        "wall", f"{result.wall_s:.2f} s ({len(result.workload) / result.wall_s:,.0f} jobs/s)"
    )
    out_console = Console()
    out_console.print(table)
    out_console.print(quality_table(result.trace.quality))
    click.echo(f"wrote {path}")


@click.command(
    "fidelity",
    help=(
        "Replay a trace that records waits (SWF, sacct, PBS) under a baseline policy and "
        "grade (high, medium, low) how "
        "closely the replay reproduces the schedule the machine ran, as the trace records "
        "it: mean and p95 wait, utilisation, the Kolmogorov-Smirnov distance of the wait "
        "distributions, bounded slowdown percentiles, and the correlation of the queue "
        "length over time. Default baseline: the best fit among fifo, easy and "
        "conservative. Needs recorded waits (not the synthetic Lublin traces)."
    ),
)
@trace_option
@click.option(
    "--policy",
    type=_policy_choice,
    help="Baseline policy; default: the best fit among fifo, easy and conservative.",
)
@click.option(
    "--capacity",
    type=click.IntRange(min=1),
    help="Processors of the machine; default: the trace header's MaxProcs.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Replay only the first N jobs.")
@_format_option
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def fidelity_command(
    trace: Path,
    policy: str | None,
    capacity: int | None,
    limit: int | None,
    fmt: str | None,
    as_json: bool,
    traces_dir: Path | None,
) -> None:
    trace = resolve_trace(trace, traces_dir)
    console = Console(stderr=True)
    warn_refused_plugins()
    what = policy or "fifo, easy and conservative"
    try:
        with console.status(f"replaying {trace.name} under {what}"):
            f = fidelity(trace, policy, capacity=capacity, limit=limit, fmt=fmt)
    except (TraceError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except InvariantViolation as e:
        raise click.ClickException(f"{trace}: {e}") from None
    if as_json:
        click.echo(f.to_json())
        return
    _print_fidelity(f)


def _print_fidelity(f: Fidelity) -> None:
    m = f.measures
    out = Console()
    table = Table(title=f"{Path(f.trace).name} · {f.policy} · {m.jobs:,} jobs")
    table.add_column("measure")
    table.add_column("observed", justify="right")
    table.add_column("replayed", justify="right")
    table.add_row("mean wait (s)", f"{m.mean_wait_obs:,.0f}", f"{m.mean_wait_rep:,.0f}")
    table.add_row("p95 wait (s)", f"{m.p95_wait_obs:,.0f}", f"{m.p95_wait_rep:,.0f}")
    table.add_row("utilisation", f"{m.util_obs:.3f}", f"{m.util_rep:.3f}")
    for k in m.bsld_obs:
        table.add_row(f"bounded slowdown {k}", f"{m.bsld_obs[k]:,.1f}", f"{m.bsld_rep[k]:,.1f}")
    out.print(table)
    gate = Table(title=f"grade: {f.grade}")
    gate.add_column("gate measure")
    gate.add_column("value", justify="right")
    gate.add_column("high", justify="right")
    gate.add_column("medium", justify="right")
    for row in gate_rows(m, f.thresholds):
        gate.add_row(*row)
    out.print(gate)
    if f.candidates:
        tried = ", ".join(
            f"{p} {c['grade']} (KS {c['ks_wait']:.3f})" for p, c in f.candidates.items()
        )
        out.print(f"baseline {f.policy}: {f.chosen_by}; tried {tried}")


@click.command(
    "matrix",
    help=(
        "Run policies x traces and write a Markdown and HTML table, a JSON file with every "
        "run's metrics and manifest, and a figure. Default: every policy on CTC-SP2, "
        "SDSC-SP2 and HPC2N (bursar traces fetch ctc-sp2 sdsc-sp2 hpc2n)."
    ),
)
@click.option(
    "--trace",
    "traces",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="NAME|FILE",
    help="A trace file or catalogue name (repeat); default: the three large PWA traces.",
)
@traces_dir_option
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=_policy_choice,
    help="Repeat; default: every built-in policy (a plug-in runs when named).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs"),
    show_default=True,
)
@click.option("--bsld-tau", type=float, default=DEFAULT_TAU_S, show_default=True)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Replay config (TOML) for every run.",
)
@click.option(
    "--bursar-limit",
    type=click.IntRange(min=1),
    help="Replay only the first N jobs of each trace under the bursar policy (it runs the "
    "full broker engine per decision, much slower than the lean policies).",
)
def matrix_command(
    traces: tuple[Path, ...],
    policies: tuple[str, ...],
    out: Path,
    bsld_tau: float,
    config_path: Path | None,
    bursar_limit: int | None,
    traces_dir: Path | None,
) -> None:
    warn_refused_plugins()
    config = _config(config_path)
    paths = [resolve_trace(t, traces_dir) for t in traces or map(Path, LARGE_TRACES)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise click.ClickException(f"no trace at {missing[0]}; pass --trace NAME or FILE")
    pols = list(policies) or list(POLICIES)
    limits = {p: bursar_limit for p in POLICIES if p.startswith("bursar")} if bursar_limit else {}
    command = "bursar matrix " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    ) as progress:
        task = progress.add_task("policy matrix", total=len(paths) * len(pols))

        def advance(trace: str, policy: str) -> None:
            progress.update(task, advance=1, description=f"done {trace} · {policy}")

        try:
            cells = run_matrix(
                paths, pols, config=config, tau_s=bsld_tau, limits=limits, progress=advance
            )
        except (TraceError, ValueError) as e:
            raise click.ClickException(str(e)) from None
        except InvariantViolation as e:
            raise click.ClickException(str(e)) from None
    for p in write_matrix(cells, out, command.strip()):
        click.echo(f"wrote {p}")
    failed = [c for c in cells if c.error is not None]
    for c in failed:
        click.echo(f"FAILED {c.trace} · {c.policy}: {c.error}", err=True)
    if failed:
        sys.exit(1)
