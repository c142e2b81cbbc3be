"""``bursar traces``: the public traces the guide uses, where they come from, and fetching
them; and how the replay commands turn a catalogue name into a file."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from bursar.sim.replay.catalog import (
    CATALOG,
    SAMPLE_SOURCE,
    Entry,
    UnknownTrace,
    entry,
    locate,
    with_needs,
)
from bursar.sim.replay.fetch import FetchError, fetch
from bursar.sim.replay.synth import SynthParams, write_swf

__all__ = [
    "DEFAULT_DIR",
    "default_traces_dir",
    "resolve_trace",
    "search_dirs",
    "trace_option",
    "traces",
    "traces_dir_option",
]

DEFAULT_DIR = Path("traces")
"""Where ``bursar traces fetch`` writes, relative to the current directory."""

F = TypeVar("F", bound=Callable[..., Any])


def default_traces_dir() -> Path:
    """BURSAR_TRACES_DIR; else ``shared/traces`` beside the repository, where the project's
    own tests read real traces; else ``./traces``, where ``bursar traces fetch`` writes."""
    env = os.environ.get("BURSAR_TRACES_DIR")
    if env:
        return Path(env)
    # cli/traces.py: parents[1] is the repository, parents[2] the folder beside it.
    shared = Path(__file__).resolve().parents[2] / "shared" / "traces"
    return shared if shared.is_dir() else DEFAULT_DIR


M100_TABLE = Path("m100-node-power-daily") / "cov_all.csv.gz"
"""Marconi100's node power per node per day, in the traces directory: the node power
model's source (``bursar whatif --power-sweep``, ``bursar replay --power-cap``)."""


def node_power_table(given: Path | None, traces_dir: Path | None) -> Path:
    """``--node-power`` if given, else the Marconi100 table in the traces directory."""
    return given or (traces_dir or default_traces_dir()) / M100_TABLE


def node_power_option(f: F) -> F:
    """``--node-power FILE``: the node-day power table the node power model comes from."""
    return click.option(
        "--node-power",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The node-day power table the node power model is derived from (Marconi100's "
        "cov_all.csv.gz; default: m100-node-power-daily/ in the traces directory).",
    )(f)


def search_dirs(traces_dir: Path | None) -> list[Path]:
    """Where a catalogue name is looked for, in order: the fetch folder (``--traces DIR``,
    else ``./traces``), then :func:`default_traces_dir`."""
    out: list[Path] = []
    for d in (traces_dir or DEFAULT_DIR, default_traces_dir()):
        if d not in out:
            out.append(d)
    return out


def _names(kind: str | None = None) -> str:
    return ", ".join(n for n, e in CATALOG.items() if kind is None or e.kind == kind)


def resolve_trace(value: Path, traces_dir: Path | None) -> Path:
    """A trace option's value as a file: a file that exists is itself; a catalogue name is
    its fetched (or shipped) file; anything else is left for the reader to refuse."""
    if value.is_file():
        return value
    name = str(value)
    if name in CATALOG:
        e = CATALOG[name]
        if e.kind != "swf":
            raise click.ClickException(
                f"{name} is not a job log for replay ({e.title}); "
                + (f"use: bursar sim elastic --trace {name}" if e.kind == "elastic" else "")
            )
        dirs = search_dirs(traces_dir)
        found = locate(e, dirs)
        if found is None:
            to = f" --to {traces_dir}" if traces_dir is not None else ""
            looked = ", ".join(str(d) for d in dirs)
            raise click.ClickException(
                f"trace {name} is not fetched (looked in {looked}); "
                f"run: bursar traces fetch {name}{to}"
            )
        return found
    if value.parent == Path(".") and not value.suffix and not value.exists():
        raise click.ClickException(
            f"no file {name} and no catalogue trace called {name}; the catalogue's job logs "
            f"are: {_names('swf')} (bursar traces list)"
        )
    return value


def traces_dir_option(f: F) -> F:
    """``--traces DIR``: where catalogue names are looked for first."""
    return click.option(
        "--traces",
        "traces_dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Folder of fetched traces, where a catalogue NAME is looked for first "
        f"(default: ./{DEFAULT_DIR}, then BURSAR_TRACES_DIR or shared/traces beside the repo).",
    )(f)


def trace_option(f: F) -> F:
    """``--trace NAME|FILE`` (required) and ``--traces DIR``: the replay commands' trace;
    the command resolves it with :func:`resolve_trace`."""
    f = traces_dir_option(f)
    return click.option(
        "--trace",
        "trace",
        required=True,
        metavar="NAME|FILE",
        type=click.Path(dir_okay=False, path_type=Path),
        help="A trace file, or a catalogue name (bursar traces list; `sample` ships with bursar).",
    )(f)


@click.group(
    "traces",
    help="The public traces that replay, fidelity, what-if, matrix and the elastic "
    "simulation use: list them with their source, licence and SHA-256, and fetch them "
    f"into ./{DEFAULT_DIR} (the folder those commands look in). `sample` ships with bursar.",
)
def traces() -> None:
    pass


def _mib(n: int) -> str:
    return f"{n / 1_048_576:.1f} MiB" if n else "-"


@traces.command("list")
@traces_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the catalogue as JSON.")
def list_command(traces_dir: Path | None, as_json: bool) -> None:
    """Every catalogued trace: what it is, its download size and licence, whether it is
    fetched (and where), then each file's source address and pinned SHA-256."""
    dirs = search_dirs(traces_dir)
    rows = [(e, locate(e, dirs) if e.files or e.packaged else None) for e in CATALOG.values()]
    if as_json:
        doc = [
            {
                "name": e.name,
                "kind": e.kind,
                "title": e.title,
                "licence": e.licence,
                "attribution": e.attribution,
                "needs": list(e.needs),
                "packaged": e.packaged is not None,
                "local": None if where is None else str(where),
                "files": [
                    {
                        "path": f.path,
                        "url": f.url,
                        "sha256": f.sha256,
                        "size": f.size,
                        "member": f.member,
                        "member_sha256": f.member_sha256,
                    }
                    for f in e.files
                ],
            }
            for e, where in rows
        ]
        click.echo(json.dumps(doc, indent=2))
        return
    table = Table(title="traces", title_justify="left")
    for col in ("name", "what", "download", "licence", "here"):
        table.add_column(col, overflow="fold")
    for e, where in rows:
        if e.packaged:
            here = "shipped with bursar"
        elif where is None:
            here = "not fetched"
        else:  # curves are a folder of files
            here = str(where.parent if e.kind == "curves" else where)
        table.add_row(e.name, e.title, _mib(e.size), e.licence, here)
    out = Console()
    out.print(table)
    out.print("sources (SHA-256 of the published file; --json for every file):")
    for e, _ in rows:
        click.echo(f"  {e.name}: {_source(e)}")


def _source(e: Entry) -> str:
    if e.packaged:
        return f"cut from {SAMPLE_SOURCE} by scripts/slice_trace.py"
    urls = {f.url: f for f in e.files}
    if len(urls) > 1:
        folder = e.files[0].url.rsplit("/", 1)[0]
        return f"{len(urls)} files under {folder}/"
    f = e.files[0]
    member = f" (member {f.member})" if f.member else ""
    return f"{f.url}{member}\n    {f.sha256}"


@traces.command("fetch")
@click.argument("names", nargs=-1, metavar="NAME...")
@click.option("--all", "fetch_all", is_flag=True, help="Every catalogued trace.")
@click.option(
    "--to",
    "dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Folder to write into (pass the same folder to the commands as --traces).",
)
@click.option(
    "--from",
    "base_url",
    metavar="URL_BASE",
    help="A site mirror: a traces folder served over HTTP; each file is fetched from "
    "URL_BASE/<folder>/<file> instead of its published address, and checked the same way.",
)
def fetch_command(
    names: tuple[str, ...], fetch_all: bool, dest: Path, base_url: str | None
) -> None:
    """Download traces, check each against its pinned SHA-256 and write it under DIR (a
    mismatch or a failed download writes nothing). An ElasticFlow table brings the A100
    throughput curves that `bursar sim elastic` reads beside it."""
    if not names and not fetch_all:
        raise click.UsageError(f"name a trace or give --all; the names are: {_names()}")
    try:
        wanted = with_needs(CATALOG if fetch_all else names)
    except UnknownTrace as e:
        raise click.BadParameter(str(e), param_hint="NAME") from None
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(label: str, done: int, total: int | None) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done)

        try:
            got = fetch(wanted, dest, base_url=base_url, progress=progress)
        except FetchError as e:
            # Offline, or behind a firewall: a site's copy of a traces folder serves as well.
            hint = "" if base_url else " (from a site mirror instead: --from URL_BASE)"
            raise click.ClickException(f"{e}{hint}") from None
    what = {"fetched": "fetched", "present": "already there", "shipped": "shipped with bursar"}
    for g in got:
        path = g.path.parent if entry(g.name).kind == "curves" else g.path  # a folder of files
        click.echo(f"{g.name}: {what[g.status]}: {path}")
    if dest != DEFAULT_DIR and any(entry(g.name).kind == "swf" for g in got):
        click.echo(f"pass --traces {dest} to bursar replay, fidelity, whatif and matrix")


def _burst(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    if value is None:
        return None
    try:
        start, length, factor = (float(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected START,LENGTH,FACTOR (seconds, seconds, a rate multiplier)"
        ) from None
    return (start, length, factor)


@traces.command("synth")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The SWF file to write (gzip if it ends in .gz).",
)
@click.option("--jobs", type=click.IntRange(min=1), default=10_000, show_default=True)
@click.option(
    "--capacity", type=click.IntRange(min=1), default=128, show_default=True, help="MaxProcs."
)
@click.option(
    "--load",
    type=float,
    default=0.7,
    show_default=True,
    help="Offered load: processor-seconds asked per second over the capacity.",
)
@click.option("--min-runtime", type=float, default=10.0, show_default=True, help="Seconds.")
@click.option("--max-runtime", type=float, default=86_400.0, show_default=True, help="Seconds.")
@click.option(
    "--tail-alpha",
    type=float,
    help="Heavy-tailed runtimes: Pareto of this shape above --min-runtime (smaller is "
    "heavier), capped at --max-runtime; default: log-uniform.",
)
@click.option(
    "--burst",
    callback=_burst,
    metavar="START,LENGTH,FACTOR",
    help="A burst shock: arrivals FACTOR times as fast for LENGTH seconds from START "
    "seconds after the first submission.",
)
@click.option("--users", type=click.IntRange(min=1), default=100, show_default=True)
@click.option(
    "--user-skew",
    type=float,
    default=1.0,
    show_default=True,
    help="Zipf exponent of the users' shares of jobs (0: alike; 2: one user dominates).",
)
@click.option("--seed", type=int, default=1, show_default=True)
def synth_command(
    out: Path,
    jobs: int,
    capacity: int,
    load: float,
    min_runtime: float,
    max_runtime: float,
    tail_alpha: float | None,
    burst: tuple[float, float, float] | None,
    users: int,
    user_skew: float,
    seed: int,
) -> None:
    """Write a generated workload as SWF (Downey 1997's log-uniform sizes and runtimes,
    sizes leaning to powers of two as in Lublin and Feitelson 2003, Poisson arrivals at the
    offered load), with knobs for heavy tails, a burst shock, user skew and load. The
    same options and seed write the same bytes; the file's header records them."""
    params = SynthParams(
        jobs=jobs,
        capacity=capacity,
        load=load,
        min_runtime_s=min_runtime,
        max_runtime_s=max_runtime,
        tail_alpha=tail_alpha,
        burst=burst,
        users=users,
        user_skew=user_skew,
        seed=seed,
    )
    try:
        params.check()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    path = write_swf(params, out)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    click.echo(f"wrote {path} ({jobs:,} jobs, sha256 {digest})")
