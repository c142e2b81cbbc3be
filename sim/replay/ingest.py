"""One entry point for every trace format: detect it, read it, filter it, report on it."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from bursar.sim.replay.accounting import read_pbs, read_sacct, read_sacct_gpu, sniff
from bursar.sim.replay.gpu_traces import read_alibaba, read_philly
from bursar.sim.replay.pm100 import looks_like_pm100, read_pm100
from bursar.sim.replay.swf import read_swf
from bursar.sim.replay.table import Trace, TraceError, default_filter

FORMATS = ("swf", "alibaba", "philly", "sacct", "sacct-gpu", "pbs", "pm100")
_SNIFF_BYTES = 4096


def detect_format(path: Path) -> str:
    """The format from the file name, else from the content (sacct's header line naming
    JobID and State; a PBS accounting record; PM100's job-table columns in a CSV header).
    ``sacct-gpu`` is never guessed."""
    name = path.name.lower()
    if name.endswith((".swf", ".swf.gz")):
        return "swf"
    if "pod_list" in name:
        return "alibaba"
    if "philly" in name:
        return "philly"
    if "pm100" in name or name.endswith(".parquet"):
        return "pm100"
    try:
        with open(path, "rb") as f:
            head = f.read(2)
        # Only the head: a large file read in full here would be read again by its reader.
        with (gzip.open if head == b"\x1f\x8b" else open)(path, "rb") as f:
            head_text = f.read(_SNIFF_BYTES).decode("utf-8", errors="replace")
        guessed = sniff(head_text)
        if guessed is None and looks_like_pm100(head_text.split("\n", 1)[0]):
            guessed = "pm100"
    except (OSError, EOFError, zlib.error):
        guessed = None
    if guessed is not None:
        return guessed
    raise TraceError(
        f"{path}: cannot tell the trace format from the name or the first line; "
        f"pass --format (one of {', '.join(FORMATS)})"
    )


def load_trace(path: str | Path, fmt: str | None = None) -> Trace:
    """Read ``path`` and apply the default filter (wait >= 0, run >= 0, procs > 0)."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    fmt = fmt or detect_format(p)
    readers = {
        "swf": read_swf,
        "alibaba": read_alibaba,
        "philly": read_philly,
        "sacct": read_sacct,
        "sacct-gpu": read_sacct_gpu,
        "pbs": read_pbs,
        "pm100": read_pm100,
    }
    if fmt not in readers:
        raise TraceError(f"{p}: unknown trace format {fmt!r}; allowed: {', '.join(FORMATS)}")
    header, table, quality = readers[fmt](p)
    jobs = default_filter(table, quality)
    return Trace(path=str(p), header=header, jobs=jobs, quality=quality)
