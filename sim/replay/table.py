"""The canonical job table every trace format is read into, and its quality report.

One row per job, kept as parallel columns: plain lists where a reader appends row by
row, or compact arrays (``JobTable.compact``: 8 bytes a value, not a Python object each)
where a reader converts whole columns at once, as the SWF reader does for a million-job
trace. Both index alike. ``-1`` means unknown, as in the Standard Workload Format; a
field a format does not record at all is ``-1`` for every job and is listed in
``QualityReport.absent``.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

UNKNOWN = -1


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and the line."""


@dataclass(slots=True)
class JobTable:
    """Jobs in file order. Times in seconds from the trace's start; sizes in ``unit``."""

    unit: str = "processors"
    """What ``procs`` counts: processors (SWF) or GPUs (GPU traces)."""
    id: MutableSequence[int] = field(default_factory=list)
    submit: MutableSequence[float] = field(default_factory=list)
    wait: MutableSequence[float] = field(default_factory=list)
    run: MutableSequence[float] = field(default_factory=list)
    procs: MutableSequence[float] = field(default_factory=list)
    """Allocated processors (or GPUs); -1 if unknown."""
    req_procs: MutableSequence[float] = field(default_factory=list)
    req_time: MutableSequence[float] = field(default_factory=list)
    status: MutableSequence[int] = field(default_factory=list)
    user: MutableSequence[int] = field(default_factory=list)
    group: MutableSequence[int] = field(default_factory=list)
    user_names: list[str] = field(default_factory=list)
    """A user id's name (``user_names[id]``) where the trace records names (accounting
    logs); empty where the ids are the trace's own numbers (SWF)."""
    group_names: list[str] = field(default_factory=list)
    """Likewise for groups (Slurm accounts, PBS groups)."""
    power: MutableSequence[float] | None = None
    """Each job's measured average draw (W, all its nodes), where the trace records it
    (PM100's job table); None where it does not. Not one of ``COLUMNS``: most readers
    never fill it."""

    @classmethod
    def compact(cls, unit: str) -> JobTable:
        """An empty table whose columns are arrays: int64 ids, status, users and groups,
        float64 times and sizes."""
        return cls(
            unit=unit,
            **{c: array("q") for c in _INT_COLUMNS},
            **{c: array("d") for c in COLUMNS if c not in _INT_COLUMNS},
        )

    def __len__(self) -> int:
        return len(self.id)

    def size(self, i: int) -> float:
        """Processors used: allocated, else requested (the common replay convention)."""
        p = self.procs[i]
        return p if p > 0 else self.req_procs[i]


COLUMNS = (
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
"""The per-job columns of ``JobTable``."""
_INT_COLUMNS = ("id", "status", "user", "group")


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
    wait) is not filtered on; it is named in ``quality.absent`` instead. ``table`` is
    consumed: each of its columns is emptied once its kept rows are copied, so that a
    large trace is never held twice.
    """
    n = len(table)
    check_wait = any(w >= 0 for w in table.wait) if n else True
    if not check_wait:
        quality.absent.append("wait")
    wait, run, procs, req = table.wait, table.run, table.procs, table.req_procs
    keep = bytearray(n)
    no_wait = no_run = no_procs = 0
    for i in range(n):
        if check_wait and wait[i] < 0:
            no_wait += 1
        elif run[i] < 0:
            no_run += 1
        elif not (procs[i] > 0 or req[i] > 0):
            no_procs += 1
        else:
            keep[i] = 1
    dropped = quality.dropped
    for reason, count in (
        ("wait < 0 (unknown)", no_wait),
        ("run < 0 (unknown)", no_run),
        ("procs <= 0 (allocated and requested unknown)", no_procs),
    ):
        if count:
            dropped[reason] += count
    out = JobTable(
        unit=table.unit,
        user_names=list(table.user_names),
        group_names=list(table.group_names),
    )
    for c in COLUMNS:
        col = getattr(table, c)
        if isinstance(col, array):
            kept: MutableSequence[float] = array(col.typecode, compress(col, keep))
            setattr(table, c, array(col.typecode))
        else:
            kept = list(compress(col, keep))
            setattr(table, c, [])
        setattr(out, c, kept)
    if table.power is not None:
        out.power = array("d", compress(table.power, keep))
        table.power = None
    quality.kept = len(out)
    return out
