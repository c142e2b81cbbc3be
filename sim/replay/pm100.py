"""Reading PM100's job table: Marconi100's jobs with their measured power.

PM100 (Antici et al., "PM100: A Job Power Consumption Dataset of a Large-scale
Production HPC System", SC-W '23) publishes one row per Slurm job of CINECA's Marconi100
(May to October 2020) with Slurm's fields and the job's measured power. The columns this
reader uses (the dataset's own names and meanings):

* ``job_id``, ``user_id``, ``group_id``: integers (anonymised);
* ``submit_time``, ``start_time``, ``end_time``: timestamps (Parquet timestamps, or in a
  CSV export ISO 8601 text or seconds since the epoch);
* ``run_time``: seconds; ``time_limit``: minutes, or ``INFINITE``;
* ``num_nodes_alloc`` (else ``num_nodes_req``): the job's size, in nodes;
* ``job_state``: Slurm's state (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...);
* ``power_consumption`` (older releases ``node_power_consumption``): the job's power
  samples, one every 20 s, in watts, summed over its nodes. The job's draw is their mean.

Read from Parquet (``job_table.parquet``, with pyarrow installed) or from a CSV export
of the same columns (plain or gzip; the samples as a bracketed list, ``[1.5, 2.0]``).
Sizes are nodes; the machine defaults to Marconi100's 980 compute nodes. A row without
power samples keeps -1 (unknown): the replay's power model then gives it a modelled draw.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bursar.sim.replay.table import UNKNOWN, Header, JobTable, QualityReport, TraceError

MARCONI100_NODES = 980
"""Marconi100's compute nodes (the capacity a PM100 replay defaults to)."""
REQUIRED = ("job_id", "submit_time", "start_time", "run_time", "job_state")
POWER_COLUMNS = ("power_consumption", "node_power_consumption")
SIZE_COLUMNS = ("num_nodes_alloc", "num_nodes_req")
_STATUS = {"COMPLETED": 1, "FAILED": 0, "TIMEOUT": 0, "NODE_FAIL": 0, "OUT_OF_MEMORY": 0}


def looks_like_pm100(header_line: str) -> bool:
    """Whether a CSV header line has PM100's job-table columns (for format detection)."""
    cols = {c.strip() for c in header_line.split(",")}
    return set(REQUIRED) <= cols and bool(cols & set(POWER_COLUMNS))


def _time(path: Path, row: int, column: str, v: Any) -> float:
    if isinstance(v, datetime):
        return v.timestamp()
    if isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    text = str(v).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TraceError(
            f"{path}:{row}: {column} is not a timestamp (ISO 8601 or epoch seconds): {text!r}"
        ) from None


def _int(path: Path, row: int, column: str, v: Any) -> int:
    if v is None or v == "":
        return UNKNOWN
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{row}: {column} is not a number: {v!r}") from None
    if not math.isfinite(f):
        raise TraceError(f"{path}:{row}: {column} is not finite: {v!r}")
    return int(f)


def _samples(path: Path, row: int, column: str, v: Any) -> float:
    """The mean of a job's power samples (W), -1 if it has none."""
    if v is None or (isinstance(v, str) and not v.strip()):
        return -1.0
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            raise TraceError(
                f"{path}:{row}: {column} is not a list of numbers like [1.5, 2.0]: {v[:60]!r}"
            ) from None
    try:
        xs = [float(x) for x in v]
    except (TypeError, ValueError):
        raise TraceError(f"{path}:{row}: {column} is not a list of numbers") from None
    if any(not math.isfinite(x) or x < 0 for x in xs):
        raise TraceError(f"{path}:{row}: {column} has a sample that is not a finite number >= 0")
    return sum(xs) / len(xs) if xs else -1.0


def _csv_rows(path: Path) -> tuple[Sequence[str], Iterator[tuple[int, Mapping[str, Any]]]]:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    binary = gzip.open(path, "rb") if gz else open(path, "rb")  # noqa: SIM115
    f = io.TextIOWrapper(binary, encoding="utf-8", newline="")
    reader = csv.DictReader(f)
    cols = list(reader.fieldnames or [])

    def rows() -> Iterator[tuple[int, Mapping[str, Any]]]:
        with f:
            for row in reader:
                yield reader.line_num, row

    return cols, rows()


def _parquet_rows(path: Path) -> tuple[Sequence[str], Iterator[tuple[int, Mapping[str, Any]]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError(
            f"{path}: reading PM100's Parquet job table needs pyarrow (pip install pyarrow), "
            "or export it to CSV with the same columns"
        ) from None
    pf = pq.ParquetFile(path)
    cols = list(pf.schema_arrow.names)

    def rows() -> Iterator[tuple[int, Mapping[str, Any]]]:
        # Row groups one at a time: the whole table (with its power samples) is never held.
        n = 0
        for batch in pf.iter_batches(columns=[c for c in cols if c in _WANTED]):
            for row in batch.to_pylist():
                n += 1
                yield n, row

    return cols, rows()


_WANTED = {*REQUIRED, "user_id", "group_id", "end_time", "time_limit"} | {
    *POWER_COLUMNS,
    *SIZE_COLUMNS,
}


def read_pm100(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    """Every job of a PM100 job table (no filtering); bad rows raise ``TraceError``
    naming the file and the row (a CSV's line, a Parquet file's row number)."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    parquet = p.name.lower().endswith(".parquet")
    try:
        cols, rows = _parquet_rows(p) if parquet else _csv_rows(p)
        missing = [c for c in REQUIRED if c not in cols]
        power_col = next((c for c in POWER_COLUMNS if c in cols), None)
        size_col = next((c for c in SIZE_COLUMNS if c in cols), None)
        if missing or power_col is None or size_col is None:
            need = [*missing]
            if power_col is None:
                need.append(" or ".join(POWER_COLUMNS))
            if size_col is None:
                need.append(" or ".join(SIZE_COLUMNS))
            raise TraceError(f"{p}: not a PM100 job table: no column {', '.join(need)}")
        t = JobTable.compact("nodes")
        power: list[float] = []
        q = QualityReport()
        no_power = 0
        first = math.inf
        for r, row in rows:
            submit = _time(p, r, "submit_time", row["submit_time"])
            start = _time(p, r, "start_time", row["start_time"])
            run = _int(p, r, "run_time", row["run_time"])
            limit = str(row.get("time_limit", "") or "").strip()
            t.id.append(_int(p, r, "job_id", row["job_id"]))
            t.submit.append(submit)
            t.wait.append(start - submit)
            t.run.append(run)
            t.procs.append(_int(p, r, size_col, row[size_col]))
            t.req_procs.append(_int(p, r, "num_nodes_req", row.get("num_nodes_req")))
            t.req_time.append(
                UNKNOWN if limit in ("", "INFINITE") else 60 * _int(p, r, "time_limit", limit)
            )
            state = str(row["job_state"]).split()
            t.status.append(
                5
                if state and state[0] == "CANCELLED"
                else _STATUS.get(state[0] if state else "", UNKNOWN)
            )
            t.user.append(_int(p, r, "user_id", row.get("user_id")))
            t.group.append(_int(p, r, "group_id", row.get("group_id")))
            w = _samples(p, r, power_col, row[power_col])
            no_power += w < 0
            power.append(w)
            first = min(first, submit)
    except (OSError, EOFError, UnicodeDecodeError, csv.Error, gzip.BadGzipFile) as e:
        raise TraceError(f"{p}: cannot read it as a PM100 job table: {e}") from None
    if not len(t):
        raise TraceError(f"{p}: no jobs")
    t.power = power
    q.records = len(t)
    if no_power:
        q.notes.append(f"{no_power} jobs have no power samples (modelled draw)")
    header = Header(
        format="pm100",
        fields={"Machine": "Marconi100", "Power": power_col},
        max_nodes=MARCONI100_NODES,
        unix_start=int(first) if math.isfinite(first) else None,
    )
    return header, t, q
