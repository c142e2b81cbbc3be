"""``bursar whatif``: an operator's what-if on a job trace, a baseline against candidates.

Not the live ``bursar leases whatif`` (which asks a running broker about one request):
this replays recorded history under each config and reports the deltas and verdicts.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console

from bursar.broker.errors import ConfigError
from bursar.cli.policies import PolicyChoice, warn_refused_plugins
from bursar.cli.traces import node_power_option, node_power_table, resolve_trace, trace_option
from bursar.sim.power.readers import read_m100_node_power
from bursar.sim.replay.ingest import FORMATS
from bursar.sim.replay.kernel import InvariantViolation
from bursar.sim.replay.metrics import DEFAULT_TAU_S
from bursar.sim.replay.policies.powercap import power_policy
from bursar.sim.replay.power_sweep import markdown as power_markdown
from bursar.sim.replay.power_sweep import sweep
from bursar.sim.replay.stress import SCENARIOS, scenario_params, summary
from bursar.sim.replay.stress import markdown as stress_markdown
from bursar.sim.replay.synth import write_swf
from bursar.sim.replay.table import TraceError
from bursar.sim.replay.whatif import (
    DEFAULT_ISOLATION_BOUND_S,
    DEFAULT_UTIL_TOLERANCE_PTS,
    baseline_fidelity,
    compare,
    parse_candidate,
    run_whatif,
    write_whatif,
)

__all__ = ["whatif_command"]


def _caps(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> list[float] | bool | None:
    """False: no sweep; None: auto caps; else the caps in watts."""
    if value is None:
        return False
    if value.strip() == "auto":
        return None
    try:
        caps = [float(v) * 1e3 for v in value.split(",")]
    except ValueError:
        caps = []
    if not caps or any(not math.isfinite(c) or c <= 0 for c in caps):
        raise click.BadParameter(
            f"{value!r}: give auto or caps in kW > 0 joined by commas (150,120,100)"
        )
    return caps


def _power_sweep(
    trace: Path,
    policy: str,
    caps: list[float] | None,
    node_power: Path | None,
    traces_dir: Path | None,
    capacity: int | None,
    limit: int | None,
    out: Path,
    tau_s: float,
    fmt: str | None,
) -> None:
    table = node_power_table(node_power, traces_dir)
    console = Console(stderr=True, log_path=False)
    command = "bursar whatif " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    try:
        power_policy(policy)
        with console.status(f"node power from {table.name}"):
            node = read_m100_node_power(table)
        with console.status(f"replaying {trace.name} under each cap"):
            rep = sweep(
                trace,
                policy,
                node,
                caps,
                capacity=capacity,
                limit=limit,
                tau_s=tau_s,
                fmt=fmt,
                progress=lambda label: console.log(f"done {label}"),
            )
    except (TraceError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except InvariantViolation as e:
        raise click.ClickException(f"{trace}: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    today = datetime.now(UTC).date().isoformat()
    md = out / "power-sweep.md"
    md.write_text(power_markdown(rep, command.strip(), today))
    (out / "power-sweep.json").write_text(
        json.dumps({"command": command.strip(), "date": today, **rep}, indent=1) + "\n"
    )
    click.echo(f"wrote {md}")
    knee = rep["knee_kw"]
    click.echo(
        f"floor {rep['floor_kw']:,.1f} kW, knee "
        + ("none" if knee is None else f"{knee:,.1f} kW")
        + f", uncapped peak {rep['uncapped_peak_kw']:,.1f} kW"
    )


@click.command(
    "whatif",
    help=(
        "Replay one job trace under a baseline replay config and under each candidate, and "
        "write DIR/whatif.md, DIR/whatif.html (figure inline), DIR/whatif.json and every "
        "run's manifest (DIR/runs/): KPI deltas against the baseline (p95 bounded slowdown, "
        "mean and p95 wait, utilisation, per-campaign share, starved jobs, guarantee "
        "violations, jobs killed at refused renewals), a verdict per candidate under stated "
        "hard constraints, the Pareto front, why each rejected candidate was blocked, and the "
        "fidelity gate's grade of the baseline (one more replay). "
        "A candidate is a replay config (TOML path), capacity=N, policy=NAME, or several "
        "joined by commas (policy=easy,capacity=512)."
    ),
)
@trace_option
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The baseline's replay config (TOML); default: the default replay config.",
)
@click.option(
    "--candidate",
    "candidates",
    multiple=True,
    help="A candidate: a replay config path, capacity=N, policy=NAME (repeat). Required "
    "unless --power-sweep.",
)
@click.option(
    "--policy",
    type=PolicyChoice(),
    default="bursar",
    show_default=True,
    help="The policy of the baseline and of every candidate that does not name one (a "
    "built-in or an installed plug-in).",
)
@click.option("--capacity", type=click.IntRange(min=1), help="The baseline's capacity.")
@click.option("--limit", type=click.IntRange(min=1), help="Replay only the first N jobs.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/whatif"),
    show_default=True,
)
@click.option("--bsld-tau", type=float, default=DEFAULT_TAU_S, show_default=True)
@click.option(
    "--util-tolerance",
    type=click.FloatRange(min=0),
    default=DEFAULT_UTIL_TOLERANCE_PTS,
    show_default=True,
    help="How many percentage points of utilisation a candidate may lose and be accepted.",
)
@click.option(
    "--isolation-bound",
    type=click.FloatRange(min=0),
    default=DEFAULT_ISOLATION_BOUND_S,
    show_default=True,
    help="Seconds within which a request inside its unmet guarantee must start.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(FORMATS)),
    help="Trace format; default: told from the file name, else from its first line "
    "(sacct-gpu, sizes in GPUs, is never guessed).",
)
@click.option(
    "--stress",
    is_flag=True,
    help="Grade the candidates on generated workloads too (bursar traces synth on the "
    f"trace's machine size: {', '.join(SCENARIOS)}), each written with its report under "
    "DIR/stress/NAME/; DIR/stress.md says which scenario each candidate fails.",
)
@click.option(
    "--stress-jobs",
    type=click.IntRange(min=100),
    default=3000,
    show_default=True,
    help="Jobs in each generated workload.",
)
@click.option("--stress-seed", type=int, default=1, show_default=True)
@click.option(
    "--power-sweep",
    "power_sweep",
    metavar="auto|KW,KW,...",
    callback=_caps,
    help="Instead of candidates: replay the trace uncapped and under each facility power "
    "cap (kW; auto: 100% down to 40% of the uncapped peak draw), each capacity unit one "
    "node of the --node-power model, under --policy (fifo, easy or conservative; default "
    "here easy), and write DIR/power-sweep.md and .json: per cap p95 bounded slowdown, "
    "energy, peak draw, hours above the cap (and the uncapped run's), jobs stranded, the "
    "knee and the feasibility floor.",
)
@node_power_option
def whatif_command(
    trace: Path,
    config_path: Path | None,
    candidates: tuple[str, ...],
    policy: str,
    capacity: int | None,
    limit: int | None,
    out: Path,
    bsld_tau: float,
    util_tolerance: float,
    isolation_bound: float,
    fmt: str | None,
    stress: bool,
    stress_jobs: int,
    stress_seed: int,
    power_sweep: list[float] | bool | None,
    node_power: Path | None,
    traces_dir: Path | None,
) -> None:
    trace = resolve_trace(trace, traces_dir)
    warn_refused_plugins()
    if power_sweep is not False:
        if candidates or stress:
            raise click.UsageError("--power-sweep runs alone: no --candidate, no --stress")
        ctx = click.get_current_context()
        if ctx.get_parameter_source("policy") == click.core.ParameterSource.DEFAULT:
            policy = "easy"
        _power_sweep(
            trace, policy, power_sweep, node_power, traces_dir, capacity, limit, out, bsld_tau, fmt
        )
        return
    if not candidates:
        raise click.UsageError("Missing option '--candidate' (or --power-sweep).")
    try:
        cands = [parse_candidate(c) for c in candidates]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--candidate") from None
    # No source location (whatif.py:NNN) in the progress lines: they are for users.
    console = Console(stderr=True, log_path=False)
    command = "bursar whatif " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    try:
        with console.status(f"replaying {trace.name}: baseline"):
            base, arms = run_whatif(
                trace,
                config_path,
                cands,
                policy=policy,
                capacity=capacity,
                limit=limit,
                tau_s=bsld_tau,
                progress=lambda label: console.log(f"done {label}"),
                fmt=fmt,
            )
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    except (TraceError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except InvariantViolation as e:
        raise click.ClickException(f"{trace}: {e}") from None
    with console.status("grading the baseline's fidelity"):
        try:
            fid = baseline_fidelity(
                trace,
                policy,
                capacity=capacity,
                limit=limit,
                config=base.config,
                tau_s=bsld_tau,
                fmt=fmt,
            )
        except (InvariantViolation, ValueError) as e:
            raise click.ClickException(f"{trace}: fidelity of the baseline: {e}") from None
    rep = compare(
        base,
        arms,
        util_tolerance_pts=util_tolerance,
        isolation_bound_s=isolation_bound,
        fidelity=fid,
    )
    for p in write_whatif(base, arms, rep, out, command.strip()):
        click.echo(f"wrote {p}")
    for c in rep["candidates"]:
        click.echo(f"{c['label']}: {c['verdict']}")
        for line in c["narrative"]:
            click.echo(f"  {line}")
    if not stress:
        return
    assert base.result is not None  # compare raised otherwise
    cap = base.result.workload.capacity
    verdicts = {"history": {c["label"]: c["verdict"] for c in rep["candidates"]}}
    for name in SCENARIOS:
        where = out / "stress" / name
        params = scenario_params(name, cap, stress_jobs, stress_seed)
        generated = write_swf(params, where / f"{name}.swf.gz")
        try:
            with console.status(f"stress scenario {name}"):
                s_base, s_arms = run_whatif(
                    generated, config_path, cands, policy=policy, tau_s=bsld_tau
                )
            s_rep = compare(
                s_base,
                s_arms,
                util_tolerance_pts=util_tolerance,
                isolation_bound_s=isolation_bound,
            )
        except (InvariantViolation, ValueError) as e:
            raise click.ClickException(f"stress scenario {name}: {e}") from None
        write_whatif(s_base, s_arms, s_rep, where, command.strip())
        verdicts[name] = {c["label"]: c["verdict"] for c in s_rep["candidates"]}
    rows = summary(verdicts)
    (out / "stress.md").write_text(stress_markdown(rows, list(verdicts), command.strip()))
    (out / "stress.json").write_text(
        json.dumps({"command": command.strip(), "candidates": rows}, indent=1) + "\n"
    )
    click.echo(f"wrote {out / 'stress.md'}")
    for r in rows:
        fails = ", ".join(r["fails"])
        click.echo(f"{r['label']}: " + (f"fails in {fails}" if fails else "holds in every setting"))
