"""The ElasticFlow traces: deep-learning training jobs with deadlines, and the measured
throughput curves that say how fast each job runs on g GPUs.

A job table (``cluster0N.csv.gz``, ``195job.csv.gz``; gzip or plain CSV) has the columns
``job_id, submission_time, num_iteration, model_name, deadline, batch_size, num_gpu,
duration``: times in seconds on one clock, the deadline absolute. A throughput file
(``throughputs_A100/<model>.csv``) has a ``global_batch_size`` column and one column per
GPU count (1, 2, 4, ... 64), each cell the iterations per second at that batch size on
that many GPUs, or ``nan``, empty or 0 where it was not measured (or does not run). A job's time on g GPUs is
``num_iteration / throughput(model, batch_size, g)``.

Every value is checked as it is read: a bad line raises :class:`TraceError` naming the
file and the line (1 is the header), and a job whose model or batch size has no curve
names the job's own line.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bursar.sim.replay.table import TraceError

__all__ = ["Curves", "Job", "TraceError", "load_curves", "load_jobs", "time_on"]

JOB_COLUMNS = (
    "job_id",
    "submission_time",
    "num_iteration",
    "model_name",
    "deadline",
    "batch_size",
    "num_gpu",
    "duration",
)

Curve = tuple[tuple[int, float], ...]
"""(GPUs, iterations per second) points, GPUs increasing, only the measured ones."""


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    submit: float
    iterations: float
    model: str
    deadline: float
    """Absolute, on the submission clock."""
    batch_size: int
    num_gpu: int
    """What the job asked for in the original cluster."""
    duration: float
    """What it ran there on ``num_gpu`` GPUs."""
    line: int
    """Its line in the file (the header is line 1): errors about the job name it."""


@dataclass(frozen=True, slots=True)
class Curves:
    """The measured throughput of each model at each batch size, from one folder."""

    folder: Path
    points: dict[str, dict[int, Curve]]

    def curve(self, model: str, batch_size: int) -> Curve | None:
        return self.points.get(model, {}).get(batch_size)

    def for_job(self, job: Job, path: str | Path) -> Curve:
        """The job's curve; a job that has none is an error on its line of ``path``."""
        c = self.curve(job.model, job.batch_size)
        if c is None:
            have = sorted(self.points.get(job.model, {}))
            known = f"batch sizes {have}" if have else f"models {sorted(self.points)}"
            raise TraceError(
                f"{path}:{job.line}: job {job.job_id}: no throughput for model "
                f"{job.model!r} at batch size {job.batch_size} in {self.folder} "
                f"(it has {known})"
            )
        return c


def time_on(curve: Curve, iterations: float, gpus: int) -> float:
    """Seconds to run ``iterations`` on ``gpus`` GPUs: only at a measured point (the
    simulator of ElasticFlow allocates measured counts only); inf where none was measured."""
    for g, thr in curve:
        if g == gpus:
            return iterations / thr
    return math.inf


def _open_text(path: Path) -> io.TextIOBase:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    try:
        return io.StringIO(raw.decode("utf-8"), newline="")
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text ({e})") from None


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    with _open_text(path) as f:
        for i, row in enumerate(csv.reader(f), start=1):
            if row and any(c.strip() for c in row):
                yield i, row


def _number(path: Path, line: int, column: str, text: str, *, positive: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} is not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0 or (positive and v == 0):
        bound = "> 0" if positive else ">= 0"
        raise TraceError(f"{path}:{line}: {column} must be a finite number {bound} (got {text!r})")
    return v


def _integer(path: Path, line: int, column: str, text: str) -> int:
    v = _number(path, line, column, text, positive=True)
    if v != int(v):
        raise TraceError(f"{path}:{line}: {column} must be a whole number (got {text!r})")
    return int(v)


def load_jobs(path: str | Path) -> list[Job]:
    """The jobs of one table, in submission order (a stable sort: ties keep file order)."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such file")
    rows = _rows(p)
    first = next(rows, None)
    if first is None:
        raise TraceError(f"{p}: empty file (expected a header {','.join(JOB_COLUMNS)})")
    line, header = first
    names = [h.strip() for h in header]
    missing = [c for c in JOB_COLUMNS if c not in names]
    if missing:
        raise TraceError(f"{p}:{line}: header lacks {', '.join(missing)} (has {names})")
    at = {c: names.index(c) for c in JOB_COLUMNS}
    jobs: list[Job] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        if len(row) != len(names):
            raise TraceError(f"{p}:{line}: {len(row)} fields, the header has {len(names)}")
        cell = {c: row[i].strip() for c, i in at.items()}
        job_id = cell["job_id"]
        if not job_id:
            raise TraceError(f"{p}:{line}: empty job_id")
        if job_id in seen:
            raise TraceError(f"{p}:{line}: job_id {job_id} again (first on line {seen[job_id]})")
        seen[job_id] = line
        submit = _number(p, line, "submission_time", cell["submission_time"], positive=False)
        deadline = _number(p, line, "deadline", cell["deadline"], positive=False)
        if deadline <= submit:
            raise TraceError(
                f"{p}:{line}: deadline {cell['deadline']} is not after the submission "
                f"time {cell['submission_time']}"
            )
        model = cell["model_name"]
        if not model:
            raise TraceError(f"{p}:{line}: empty model_name")
        jobs.append(
            Job(
                job_id=job_id,
                submit=submit,
                iterations=_number(p, line, "num_iteration", cell["num_iteration"], positive=True),
                model=model,
                deadline=deadline,
                batch_size=_integer(p, line, "batch_size", cell["batch_size"]),
                num_gpu=_integer(p, line, "num_gpu", cell["num_gpu"]),
                duration=_number(p, line, "duration", cell["duration"], positive=False),
                line=line,
            )
        )
    if not jobs:
        raise TraceError(f"{p}: a header and no jobs")
    jobs.sort(key=lambda j: j.submit)
    return jobs


def load_curve_file(path: Path) -> dict[int, Curve]:
    rows = _rows(path)
    first = next(rows, None)
    if first is None:
        raise TraceError(f"{path}: empty file (expected global_batch_size,1,2,4,...)")
    line, header = first
    if not header or header[0].strip() != "global_batch_size":
        raise TraceError(f"{path}:{line}: the first column must be global_batch_size")
    gpus = [_integer(path, line, "a GPU count in the header", h) for h in header[1:]]
    if not gpus or any(b <= a for a, b in itertools.pairwise(gpus)):
        raise TraceError(f"{path}:{line}: GPU counts must be given and increase (got {gpus})")
    out: dict[int, Curve] = {}
    for line, row in rows:
        if len(row) != len(header):
            raise TraceError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
        batch = _integer(path, line, "global_batch_size", row[0])
        if batch in out:
            raise TraceError(f"{path}:{line}: batch size {batch} again")
        pts: list[tuple[int, float]] = []
        for g, text in zip(gpus, row[1:], strict=True):
            if text.strip().lower() in ("", "nan"):
                continue  # not measured at this count: the job cannot run there
            thr = _number(path, line, f"throughput on {g} GPUs", text, positive=False)
            if thr > 0:  # a zero is a count the model does not run at (resnet50_cifar10)
                pts.append((g, thr))
        if not pts:
            raise TraceError(f"{path}:{line}: batch size {batch} has no measured throughput")
        out[batch] = tuple(pts)
    return out


def load_curves(folder: str | Path) -> Curves:
    """Every ``<model>.csv`` of a throughput folder (``throughputs_A100``, ``throughputs_T4``)."""
    d = Path(folder)
    files = sorted(d.glob("*.csv")) if d.is_dir() else []
    if not files:
        raise TraceError(f"{d}: no throughput files (<model>.csv)")
    return Curves(d, {f.stem: load_curve_file(f) for f in files})
