"""Readers of the power measurements: Marconi100's node power per node per day, and
Zeus's GPU power and epoch time at each power limit. Both stream their CSV (plain or
gzip) row by row; a bad row raises ``TraceError`` naming the file and the line."""

from __future__ import annotations

import csv
import gzip
import io
import math
from array import array
from collections.abc import Iterator
from pathlib import Path

from bursar.sim.power.model import GpuProfile, NodePower, ZeusRow, gpu_profiles, node_power
from bursar.sim.replay.table import TraceError

M100_COLUMNS = ("node", "day", "total_power_mean", "total_power_max")
"""The columns of the Marconi100 node-day table this reader needs (it has more)."""
ZEUS_COLUMNS = (
    "dataset",
    "network",
    "batch_size",
    "optimizer",
    "power_limit",
    "time_per_epoch",
    "average_power",
)
M100_SOURCE = (
    "Marconi100 node-day power (M100 ExaData, BMC total_power; Borghesi et al., "
    "Scientific Data 10, 288, 2023)"
)


def _rows(path: Path, need: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line, row) for each data row; the header must have every column in ``need``."""
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        binary = gzip.open(path, "rb") if gz else open(path, "rb")  # noqa: SIM115
        with io.TextIOWrapper(binary, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in need if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(
                    f"{path}:1: missing column(s) {', '.join(missing)} (need {', '.join(need)})"
                )
            for row in reader:
                yield reader.line_num, row
    except (OSError, EOFError, UnicodeDecodeError, csv.Error) as e:
        raise TraceError(f"{path}: cannot read it as CSV (plain or gzip): {e}") from None


def _float(path: Path, line: int, column: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise TraceError(f"{path}:{line}: {column} is not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise TraceError(f"{path}:{line}: {column} must be a finite number >= 0: {text!r}")
    return v


def read_m100_node_power(path: str | Path, name: str = "marconi100") -> NodePower:
    """The node type's idle, peak and loaded draw from the node-day table (``node, day,
    ..., total_power_mean, total_power_max, ...``). A day with no power sample (empty
    fields) is skipped; zero readings (sensor faults) are left out by ``node_power``."""
    p = Path(path)
    means = array("d")
    maxima = array("d")
    for line, row in _rows(p, M100_COLUMNS):
        m, x = row["total_power_mean"], row["total_power_max"]
        if not m or not x:
            continue
        means.append(_float(p, line, "total_power_mean", m))
        maxima.append(_float(p, line, "total_power_max", x))
    try:
        return node_power(name, means, maxima, f"{M100_SOURCE}: {p.name}")
    except ValueError as e:
        raise TraceError(f"{p}: {e}") from None


def read_zeus(path: str | Path) -> list[ZeusRow]:
    """Every row of a Zeus ``summary_power_<gpu>.csv`` (plain or gzip)."""
    p = Path(path)
    out = []
    for line, row in _rows(p, ZEUS_COLUMNS):
        try:
            bs, limit = int(row["batch_size"]), int(row["power_limit"])
        except ValueError:
            raise TraceError(
                f"{p}:{line}: batch_size and power_limit must be integers: "
                f"{row['batch_size']!r}, {row['power_limit']!r}"
            ) from None
        tpe = _float(p, line, "time_per_epoch", row["time_per_epoch"])
        if tpe == 0:
            raise TraceError(f"{p}:{line}: time_per_epoch must be > 0")
        out.append(
            ZeusRow(
                row["dataset"],
                row["network"],
                bs,
                row["optimizer"],
                limit,
                tpe,
                _float(p, line, "average_power", row["average_power"]),
            )
        )
    if not out:
        raise TraceError(f"{p}: no rows")
    return out


def zeus_gpu(path: str | Path) -> str:
    """The GPU a Zeus power file profiles, from its name (``summary_power_v100.csv.gz``)."""
    stem = Path(path).name.split(".")[0]
    if not stem.startswith("summary_power_"):
        raise TraceError(f"{path}: not a Zeus power file (summary_power_<gpu>.csv[.gz])")
    return stem.removeprefix("summary_power_")


def read_zeus_profiles(path: str | Path) -> dict[str, GpuProfile]:
    """Per network, its ``GpuProfile`` on the file's GPU."""
    return gpu_profiles(read_zeus(path), zeus_gpu(path))
