"""The comparison end to end: every trace under every variant, then the table (Markdown
and JSON) and the figure (bars of deadlines met per variant per trace)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker.errors import require
from bursar.sim.elastic.runner import (
    DEFAULT_CHECK,
    DEFAULT_LEASE_TERM_S,
    MEASURED,
    VARIANTS,
    Cluster,
    RunResult,
    Variant,
    engine_resizes,
    run,
)
from bursar.sim.elastic.trace import Curves, Job

__all__ = ["Outputs", "TraceInput", "compare", "markdown"]

QUICK_JOBS = 30
"""The prefix ``--quick`` keeps of each trace."""


@dataclass(frozen=True, slots=True)
class TraceInput:
    name: str
    path: Path
    jobs: list[Job]
    cluster: Cluster


def compare(
    traces: Sequence[TraceInput],
    curves: Curves,
    variants: Sequence[Variant] = VARIANTS,
    *,
    lease_term_s: float = DEFAULT_LEASE_TERM_S,
    progress: Callable[[int], None] | None = None,
    done: Callable[[RunResult], None] | None = None,
    journals: Path | None = None,
    speed_models: Sequence[str] = (MEASURED,),
    check: str = DEFAULT_CHECK,
) -> list[RunResult]:
    """Every speed model, trace and variant, in that order (one engine per run). With
    ``journals`` each run is journaled in ``journals/<trace>/<policy>/`` (under the
    measured model; ``journals/<model>/<trace>/<policy>/`` under another)."""
    out = []
    for model, t, v in ((m, t, v) for m in speed_models for t in traces for v in variants):
        sub = Path(t.name) / v.name if model == MEASURED else Path(model) / t.name / v.name
        r = run(
            t.jobs,
            curves,
            v,
            t.cluster,
            trace_name=t.name,
            lease_term_s=lease_term_s,
            progress=progress,
            state_dir=None if journals is None else journals / sub,
            speed_model=model,
            check=check,
        )
        out.append(r)
        if done is not None:
            done(r)
    return out


def notes(elastic_engine: bool) -> list[str]:
    out = [
        "The traces carry no degrade modes: dmug-no-degrade equals dmug by construction "
        "(same decisions, same hash).",
        "All values are 1: the value rule grows leases in edf's order (its ties go by "
        "deadline), but moves no step between leases of equal value, where edf moves one "
        "to an earlier deadline.",
        "One campaign for the whole trace (the traces name no users); its envelope binds "
        "nothing (sustained and burst are the cluster, no bucket).",
        "A job unfinished at its deadline is withdrawn then (step decay: no value left).",
    ]
    if not elastic_engine:
        out.insert(
            0,
            "This build's engine has no elastic pass (no Resized for a lone elastic lease on "
            "an idle node): every elastic lease stays at its min, 1 GPU, so the rule and "
            "ablation rows other than fixed are the same run.",
        )
    return out


_COLUMNS = (
    ("trace", "trace"),
    ("cluster", "cluster"),
    ("policy", "policy"),
    ("speed model", "speed_model"),
    ("jobs", "jobs"),
    ("met", "met"),
    ("met share", "met_share"),
    ("refused", "refused"),
    ("late", "late"),
    ("value share", "value_share"),
    ("utilisation", "utilisation"),
    ("mean peak GPUs", "mean_peak_gpus"),
    ("resizes", "resized"),
    ("checks", "invariant_checks"),
    ("hash", "sha256"),
    ("wall s", "wall_s"),
)


def _row(r: RunResult) -> dict[str, Any]:
    return {
        "trace": r.trace,
        "cluster": r.cluster,
        "policy": r.variant,
        "speed_model": r.speed_model,
        **r.metrics,
        "sha256": r.sha256,
        "journal_sha256": r.journal_sha256,
        "wall_s": r.wall_s,
    }


def _cell(key: str, v: Any) -> str:
    if key == "sha256":
        return f"`{str(v)[:12]}`"
    if key in ("met_share", "value_share", "utilisation"):
        return f"{v:.3f}"
    if key in ("mean_peak_gpus", "wall_s"):
        return f"{v:.2f}"
    return str(v)


def markdown(results: Sequence[RunResult]) -> str:
    head = "| " + " | ".join(h for h, _ in _COLUMNS) + " |"
    rule = "|" + "|".join("---" if k in ("trace", "cluster", "policy", "speed_model") else "---:"
                          for _, k in _COLUMNS) + "|"  # fmt: skip
    lines = [head, rule]
    for r in results:
        row = _row(r)
        lines.append("| " + " | ".join(_cell(k, row[k]) for _, k in _COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def figure(results: Sequence[RunResult], path: Path) -> Path:
    # Imported here, not at the top: the CLI imports this module, and a base install
    # without the plots extra must still start.
    require("matplotlib", extra="plots", feature="the elastic comparison's figure")
    from matplotlib.figure import Figure

    traces = list(dict.fromkeys(r.trace for r in results))
    models = list(dict.fromkeys(r.speed_model for r in results))

    def label(r: RunResult) -> str:
        return r.variant if len(models) == 1 else f"{r.variant} ({r.speed_model})"

    variants = list(dict.fromkeys(label(r) for r in results))
    share = {(r.trace, label(r)): r.metrics["met_share"] for r in results}
    fig = Figure(figsize=(max(6.0, 1.2 + 0.55 * len(variants) * len(traces)), 4.2), dpi=110,
                 layout="constrained")  # fmt: skip
    ax = fig.subplots()
    width = 0.8 / max(len(variants), 1)
    for k, v in enumerate(variants):
        xs = [i + (k - (len(variants) - 1) / 2) * width for i in range(len(traces))]
        ys = [share.get((t, v), float("nan")) for t in traces]
        ax.bar(xs, ys, width, label=v)
    ax.set_xticks(range(len(traces)), traces)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of deadlines met")
    ax.set_title(
        "Deadlines met per policy (real engine, ElasticFlow traces; speed model: "
        + ", ".join(models)
        + ")"
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path)
    return path


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a run killed while writing leaves
    the previous version, never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class Outputs:
    """The comparison's files, kept up to date run by run, so that an invocation stopped
    part-way (a time limit, Ctrl-C) leaves every run that finished:

    * ``elastic.jsonl``: one JSON line per run, appended as it finishes (emptied when
      the invocation starts);
    * ``elastic.json`` (the conditions, the notes and the runs so far; ``complete`` is
      false until the last run) and ``elastic.md`` (the table so far), rewritten after
      every run;
    * ``elastic.png``, the figure, once every run has finished."""

    def __init__(self, out: Path, conditions: dict[str, Any]) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        elastic_engine = engine_resizes()
        self.conditions = {**conditions, "engine_elastic_pass": elastic_engine}
        self.notes = notes(elastic_engine)
        self.results: list[RunResult] = []
        self.lines = out / "elastic.jsonl"
        self.lines.write_text("")
        self._write(complete=False)

    def add(self, r: RunResult) -> None:
        self.results.append(r)
        with self.lines.open("a") as f:
            f.write(json.dumps(_row(r), sort_keys=True) + "\n")
        self._write(complete=False)

    def finish(self) -> list[Path]:
        paths = self._write(complete=True)
        return [*paths, figure(self.results, self.out / "elastic.png")]

    def _write(self, *, complete: bool) -> list[Path]:
        body = {
            "complete": complete,
            "conditions": self.conditions,
            "notes": self.notes,
            "runs": [_row(r) for r in self.results],
        }
        j, md = self.out / "elastic.json", self.out / "elastic.md"
        _replace(j, json.dumps(body, indent=2, sort_keys=True) + "\n")
        table = markdown(self.results) + "\n" + "\n".join(f"- {n}" for n in self.notes) + "\n"
        _replace(md, table)
        return [j, md, self.lines]
