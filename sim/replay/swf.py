"""Reading the Standard Workload Format (plain or gzip) into the canonical job table.

Header lines start with ``;`` and carry ``Key: value`` pairs (MaxProcs, MaxNodes,
UnixStartTime, ...). Every other non-blank line holds 18 whitespace-separated numbers, -1
meaning unknown: 1 job id, 2 submit, 3 wait, 4 run, 5 allocated procs, 6 average CPU
time, 7 used memory, 8 requested procs, 9 requested time, 10 requested memory, 11 status,
12 user, 13 group, 14 executable, 15 queue, 16 partition, 17 preceding job, 18 think time.

The file streams through in blocks of whole lines (a million-job month is never held
whole as text) into the table's compact arrays (``JobTable.compact``): a job costs the
table its columns' bytes only, not a Python object per field.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bursar.sim.replay.table import Header, JobTable, QualityReport, TraceError

SWF_FIELDS = 18
_LEADING_INT = re.compile(r"^\s*(-?\d+)")
_BLOCK = 1 << 22
"""Bytes read and decoded at a time: the cost of a text stream's per-line decoding is
avoided, and a block's lines stay a few MB."""


def _read_text(path: Path) -> str:
    """The whole file as text, gunzipped if it is gzip (the accounting readers' way: one
    decompression and one decode cost far less than a line-by-line text stream)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def _header_int(fields: dict[str, str], key: str, path: Path) -> int | None:
    raw = fields.get(key)
    if raw is None:
        return None
    # "MaxNodes: 338 (batch partition; 512 total)" carries a remark after the number.
    m = _LEADING_INT.match(raw)
    if m is None:
        raise TraceError(f"{path}: header field {key} is {raw!r}, not an integer")
    return int(m.group(1))


def _open(path: Path) -> BinaryIO:
    """The file as a binary stream, gunzipped as it is read if it is gzip."""
    f = open(path, "rb")  # noqa: SIM115 (returned open; the caller's with closes it)
    if f.read(2) == b"\x1f\x8b":
        f.close()
        return gzip.open(path, "rb")  # type: ignore[return-value]
    f.seek(0)
    return f


def _blocks(f: BinaryIO) -> Iterator[bytes]:
    """Whole lines, about ``_BLOCK`` bytes at a time (the last may lack its newline)."""
    rest = b""
    while chunk := f.read(_BLOCK):
        buf = rest + chunk
        cut = buf.rfind(b"\n") + 1
        if cut:
            yield buf[:cut]
        rest = buf[cut:]
    if rest:
        yield rest


def _num(tok: str) -> float:
    try:
        return int(tok)
    except ValueError:
        return float(tok)


def read_swf(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    """Read every job line of an SWF file (no filtering); bad lines raise ``TraceError``."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    fields: dict[str, str] = {}
    t = JobTable.compact("processors")
    ids, sub, wait, run, procs = t.id, t.submit, t.wait, t.run, t.procs
    rprocs, rtime, status, user, group = t.req_procs, t.req_time, t.status, t.user, t.group
    lineno = 0
    try:
        with _open(path) as f:
            for block in _blocks(f):
                for line in block.decode("utf-8", errors="replace").splitlines():
                    lineno += 1
                    if line.startswith(";"):
                        key, sep, value = line[1:].partition(":")
                        if sep and key.strip() and " " not in key.strip():
                            fields.setdefault(key.strip(), value.strip())
                        continue
                    tok = line.split()
                    if not tok:
                        continue
                    if len(tok) != SWF_FIELDS:
                        raise TraceError(
                            f"{path}:{lineno}: expected {SWF_FIELDS} whitespace-separated "
                            f"numbers (an SWF job line), got {len(tok)}: {line.strip()[:80]!r}"
                        )
                    try:
                        # Integers almost everywhere: one try for the whole line, and only
                        # a line with a fractional field pays for the slower conversion.
                        try:
                            row = (
                                int(tok[0]),
                                int(tok[1]),
                                int(tok[2]),
                                int(tok[3]),
                                int(tok[4]),
                                int(tok[7]),
                                int(tok[8]),
                            )
                        except ValueError:
                            row = (int(tok[0]), *(_num(tok[k]) for k in (1, 2, 3, 4, 7, 8)))
                        status.append(int(tok[10]))
                        user.append(int(tok[11]))
                        group.append(int(tok[12]))
                        ids.append(row[0])
                    except (ValueError, OverflowError):
                        raise TraceError(
                            f"{path}:{lineno}: not a number in an SWF job line: "
                            f"{line.strip()[:80]!r}"
                        ) from None
                    sub.append(row[1])
                    wait.append(row[2])
                    run.append(row[3])
                    procs.append(row[4])
                    rprocs.append(row[5])
                    rtime.append(row[6])
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"{path}: cannot read it as SWF (plain or gzip): {e}") from None
    header = Header(
        format="swf",
        fields=fields,
        max_procs=_header_int(fields, "MaxProcs", path),
        max_nodes=_header_int(fields, "MaxNodes", path),
        unix_start=_header_int(fields, "UnixStartTime", path),
    )
    if not len(t):
        raise TraceError(f"{path}: no job lines (is this an SWF file?)")
    return header, t, QualityReport(records=len(t))
