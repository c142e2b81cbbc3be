"""The canonical job table every trace format is read into, and its quality report.

One row per job, kept as parallel columns (plain lists): a replay of 200,000 jobs reads
them millions of times, and list indexing is the cheapest access Python has. ``-1`` means
unknown, as in the Standard Workload Format; a field a format does not record at all is
``-1`` for every job and is listed in ``QualityReport.absent``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

UNKNOWN = -1


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(slots=True)
class JobTable:
    """Jobs in file order. Times in seconds from the trace's start; sizes in ``unit``."""

    unit: str = "processors"
    """What ``procs`` counts: processors (SWF) or GPUs (GPU traces)."""
    id: list[int] = field(default_factory=list)
    submit: list[float] = field(default_factory=list)
    wait: list[float] = field(default_factory=list)
    run: list[float] = field(default_factory=list)
    procs: list[float] = field(default_factory=list)
    """Allocated processors (or GPUs); -1 if unknown."""
    req_procs: list[float] = field(default_factory=list)
    req_time: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    user: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    user_names: list[str] = field(default_factory=list)
    """A user id's name (``user_names[id]``) where the trace records names (accounting
    logs); empty where the ids are the trace's own numbers (SWF)."""
    group_names: list[str] = field(default_factory=list)
    """Likewise for groups (Slurm accounts, PBS groups)."""

    def __len__(self) -> int:
        return len(self.id)

    def size(self, i: int) -> float:
        """Processors used: allocated, else requested (the common replay convention)."""
        p = self.procs[i]
        return p if p > 0 else self.req_procs[i]


@dataclass(frozen=True, slots=True)
class Header:
    """What a trace says about itself (SWF ``; Key: value`` lines, or a format's defaults)."""

    format: str
    fields: dict[str, str]
    max_procs: int | None = None
    max_nodes: int | None = None
    unix_start: int | None = None

    @property
    def capacity(self) -> int | None:
        """The machine size a replay defaults to: MaxProcs, else MaxNodes."""
        return self.max_procs or self.max_nodes


@dataclass(slots=True)
class QualityReport:
    """How many records were read, kept and dropped (with the reason for each drop)."""

    records: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    absent: list[str] = field(default_factory=list)
    """Fields the trace never records (all unknown): the filter does not apply to them."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "absent": list(self.absent),
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace read and filtered: the header, the kept jobs and the report on the rest."""

    path: str
    header: Header
    jobs: JobTable
    quality: QualityReport


def default_filter(table: JobTable, quality: QualityReport) -> JobTable:
    """Keep jobs with wait >= 0, run >= 0 and procs > 0 (allocated, else requested).

    A field the trace does not record for any job (the synthetic Lublin traces have no
    wait) is not filtered on; it is named in ``quality.absent`` instead.
    """
    n = len(table)
    check_wait = any(w >= 0 for w in table.wait) if n else True
    if not check_wait:
        quality.absent.append("wait")
    out = JobTable(
        unit=table.unit,
        user_names=list(table.user_names),
        group_names=list(table.group_names),
    )
    cols = (
        "id",
        "submit",
        "wait",
        "run",
        "procs",
        "req_procs",
        "req_time",
        "status",
        "user",
        "group",
    )
    src = [getattr(table, c) for c in cols]
    dst = [getattr(out, c) for c in cols]
    wait, run, procs, req = table.wait, table.run, table.procs, table.req_procs
    dropped = quality.dropped
    for i in range(n):
        if check_wait and wait[i] < 0:
            dropped["wait < 0 (unknown)"] += 1
        elif run[i] < 0:
            dropped["run < 0 (unknown)"] += 1
        elif not (procs[i] > 0 or req[i] > 0):
            dropped["procs <= 0 (allocated and requested unknown)"] += 1
        else:
            for s, d in zip(src, dst, strict=True):
                d.append(s[i])
    quality.kept = len(out)
    return out
