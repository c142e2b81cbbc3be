"""Reading real schedulers' accounting: Slurm ``sacct --parsable2`` and PBS/Torque logs.

Both become the canonical job table (``table.JobTable``), with the wait the machine gave
each job kept so that the fidelity gate can compare a replay with it.

**Slurm** (``sacct --allusers --parsable2 --noconvert --format=...``): '|'-separated
fields under a header line naming them; extra columns in any order are ignored. Needed:
``JobID, Submit, Start, End, Timelimit, State``, a size (``AllocCPUS`` or ``AllocTRES``)
and a campaign (``User`` or ``Account``). Used when present: ``JobIDRaw`` (the job's id;
else the record's number in the file), ``Eligible`` (when the job could first start: a
held or dependent job is queued from then), ``AllocTRES``/``ReqTRES`` (``cpu=N``,
``gres/gpu=N``), ``ReqCPUS``, ``Account``. Job steps (``JobID`` with a '.') are skipped.
Times are local wall-clock (``YYYY-MM-DDTHH:MM:SS``, read as if UTC: only differences
matter), ``Unknown`` or ``None``. A job with no Start (cancelled or still pending) or no
End (still running) is dropped with a counted reason. So is a job with an empty AllocTRES:
it was never given resources, whatever its Start says (Slurm 22.05 records a job cancelled
while pending with Start = End = the cancel time, and its requested CPUs as AllocCPUS).
Sizes are CPUs (``sacct``) or GPUs (``sacct-gpu``: ``gres/gpu=N`` of AllocTRES, else of
ReqTRES).

**PBS/Torque** (``MM/DD/YYYY HH:MM:SS;TYPE;JOBID;key=value ...``): only ``E`` (end)
records are read. submit = ``etime`` (eligible) else ``qtime``, wait = ``start`` -
submit, run = ``end`` - ``start`` (else ``resources_used.walltime``), requested time =
``Resource_List.walltime``, size = the slots of ``exec_host``, requested size =
``Resource_List.ncpus`` else ``nodes=N:ppn=M`` (N x M), campaign = ``user`` / ``group``.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from bursar.sim.replay.swf import _read_text
from bursar.sim.replay.table import UNKNOWN, Header, JobTable, QualityReport, TraceError

__all__ = [
    "SACCT_COMMAND",
    "SACCT_REQUIRED",
    "parse_pbs",
    "parse_sacct",
    "parse_time_limit",
    "read_pbs",
    "read_sacct",
    "read_sacct_gpu",
]

SACCT_REQUIRED = ("JobID", "Submit", "Start", "End", "Timelimit", "State")
SACCT_COMMAND = (
    "sacct --allusers --parsable2 --noconvert --starttime START --endtime END "
    "--format=JobIDRaw,JobID,User,Account,Submit,Eligible,Start,End,Timelimit,"
    "AllocCPUS,AllocTRES,ReqTRES,State"
)
"""The command line the reader is written for (docs/trace-formats.md)."""

_UNLIMITED = ("UNLIMITED", "Partition_Limit", "INVALID", "")
_NO_TIME = ("Unknown", "None", "")
_PBS_RECORD = re.compile(r"^(\d\d/\d\d/\d{4} \d\d:\d\d:\d\d);([A-Za-z]);([^;]*);(.*)$")
_GPU_KEY = re.compile(r"^gres/gpu(:[^=]+)?$")
_STATUS = {"COMPLETED": 1, "FAILED": 0, "TIMEOUT": 0, "NODE_FAIL": 0, "OUT_OF_MEMORY": 0}


def parse_time_limit(text: str) -> int | None:
    """Seconds of a Slurm/PBS duration, or None for no limit (``UNLIMITED``).

    Slurm's forms: ``M`` (minutes), ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.
    Raises ``ValueError`` for anything else.
    """
    s = text.strip()
    if s in _UNLIMITED:
        return None
    days = 0
    if "-" in s:
        d, _, s = s.partition("-")
        if not d.isdigit():
            raise ValueError(text)
        days = int(d)
        parts = s.split(":")
        if not 1 <= len(parts) <= 3:
            raise ValueError(text)
        # After "D-" the first part is hours: D-H, D-H:M, D-H:M:S.
        h, m, sec = [*parts, "0", "0"][:3]
    else:
        parts = s.split(":")
        if len(parts) == 1:
            h, m, sec = "0", parts[0], "0"
        elif len(parts) == 2:
            h, m, sec = "0", parts[0], parts[1]
        elif len(parts) == 3:
            h, m, sec = parts
        else:
            raise ValueError(text)
    if not all(x.isdigit() for x in (h, m, sec)):
        raise ValueError(text)
    return ((days * 24 + int(h)) * 60 + int(m)) * 60 + int(sec)


def format_time_limit(seconds: int | None) -> str:
    """``D-HH:MM:SS`` (or ``HH:MM:SS`` under a day), as sacct prints a Timelimit."""
    if seconds is None:
        return "UNLIMITED"
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    hms = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{d}-{hms}" if d else hms


def _sacct_time(raw: str) -> float | None:
    s = raw.strip()
    if s in _NO_TIME:
        return None
    if len(s) != 19 or s[10] != "T":
        raise ValueError(raw)
    # fromisoformat is C code, several times faster than strptime on 10^5 lines.
    return datetime.fromisoformat(s).replace(tzinfo=UTC).timestamp()


def _tres(raw: str) -> dict[str, str]:
    """``cpu=4,mem=8G,node=1,gres/gpu=2`` as a dict."""
    out: dict[str, str] = {}
    for part in raw.split(","):
        k, sep, v = part.partition("=")
        if sep:
            out[k.strip()] = v.strip()
    return out


def _tres_gpus(tres: dict[str, str]) -> float:
    """GPUs in a TRES string: ``gres/gpu=N``, else the sum of the typed ``gres/gpu:T=N``."""
    if "gres/gpu" in tres:
        return float(tres["gres/gpu"])
    typed = [float(v) for k, v in tres.items() if _GPU_KEY.match(k) and k != "gres/gpu"]
    return sum(typed) if typed else 0.0


class _Names:
    """Interns names as the table's small integer ids."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def __call__(self, name: str | None) -> int:
        if not name:
            return UNKNOWN
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        return i


def _status(state: str) -> int:
    word = state.split()[0] if state.split() else ""
    if word == "CANCELLED":
        return 5
    return _STATUS.get(word, UNKNOWN)


def parse_sacct(
    lines: Iterable[str], source: str = "<sacct>", unit: str = "processors"
) -> tuple[Header, JobTable, QualityReport]:
    """Parse ``sacct --parsable2`` text; ``unit`` is ``processors`` (CPUs) or ``GPUs``.

    Every job record (steps skipped) is counted; those that cannot be replayed (no Start,
    no End, no GPUs when counting GPUs) are dropped here with their reason. A line that
    cannot be read raises ``TraceError`` naming ``source`` and the line.
    """
    if unit not in ("processors", "GPUs"):
        raise ValueError(f"unit {unit!r}; allowed: processors, GPUs")
    t = JobTable(unit=unit)
    q = QualityReport()
    dropped: Counter[str] = q.dropped
    users, groups = _Names(), _Names()
    cols: dict[str, int] | None = None
    raw_ids = has_alloc_tres = False
    eligible_later = unlimited = cancelled_instantly = 0
    records = 0
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("|")
        if cols is None:
            cols = {name.strip(): k for k, name in enumerate(fields)}
            missing = [c for c in SACCT_REQUIRED if c not in cols]
            if not ({"AllocCPUS", "AllocTRES"} & cols.keys()):
                missing.append("AllocCPUS or AllocTRES")
            if unit == "GPUs" and not ({"AllocTRES", "ReqTRES"} & cols.keys()):
                missing.append("AllocTRES or ReqTRES (for GPUs)")
            if not ({"User", "Account"} & cols.keys()):
                missing.append("User or Account")
            if missing:
                raise TraceError(
                    f"{source}:{lineno}: expected an sacct --parsable2 header line naming "
                    f"the columns; missing {', '.join(missing)} (got {line.strip()[:80]!r})"
                )
            raw_ids = "JobIDRaw" in cols
            has_alloc_tres = "AllocTRES" in cols
            continue
        if len(fields) != len(cols):
            raise TraceError(
                f"{source}:{lineno}: expected {len(cols)} '|'-separated fields (an sacct "
                f"--parsable2 line under the header), got {len(fields)}: {line.strip()[:80]!r}"
            )

        if "." in fields[cols["JobID"]]:
            continue  # a job step (123.batch, 123.0): its job's own record counts it
        get = {name: fields[k].strip() for name, k in cols.items()}.get
        records += 1
        state = get("State") or ""
        try:
            submit = _sacct_time(get("Submit") or "")
            eligible = _sacct_time(get("Eligible") or "")
            start = _sacct_time(get("Start") or "")
            end = _sacct_time(get("End") or "")
        except ValueError:
            raise TraceError(
                f"{source}:{lineno}: a time in Submit, Eligible, Start or End is not "
                f"YYYY-MM-DDTHH:MM:SS, Unknown or None: {line.strip()[:80]!r}"
            ) from None
        raw_limit = get("Timelimit") or ""
        try:
            limit = parse_time_limit(raw_limit)
        except ValueError:
            raise TraceError(
                f"{source}:{lineno}: Timelimit is {raw_limit!r}, not UNLIMITED, minutes, "
                "MM:SS, HH:MM:SS or D-HH:MM:SS"
            ) from None
        try:
            alloc = _tres(get("AllocTRES") or "")
            req = _tres(get("ReqTRES") or "")
            if unit == "GPUs":
                procs = _tres_gpus(alloc)
                req_procs = _tres_gpus(req)
            else:
                cpus = get("AllocCPUS")
                procs = float(cpus) if cpus else float(alloc.get("cpu", UNKNOWN))
                rc = get("ReqCPUS")
                req_procs = float(rc) if rc else float(req.get("cpu", UNKNOWN))
            ident = int(get("JobIDRaw") or "") if raw_ids else records
        except ValueError:
            raise TraceError(
                f"{source}:{lineno}: not a number in JobIDRaw, AllocCPUS, ReqCPUS or a "
                f"TRES count: {line.strip()[:80]!r}"
            ) from None
        if submit is None:
            dropped["no Submit time"] += 1
            continue
        word = state.split()[0] if state.split() else "no state"
        if start is None:
            if word == "CANCELLED":
                dropped["cancelled before it started (no Start)"] += 1
            elif word == "PENDING":
                dropped["still pending (no Start)"] += 1
            else:
                dropped[f"no Start ({word})"] += 1
            continue
        if end is None:
            dropped["still running (no End)"] += 1
            continue
        if has_alloc_tres and not alloc:
            # Never allocated: a Start here is when it left the queue, not when it ran.
            if word == "CANCELLED":
                dropped["cancelled before it started (no AllocTRES)"] += 1
            else:
                dropped[f"never allocated ({word}, no AllocTRES)"] += 1
            continue
        if unit == "GPUs" and procs <= 0 and req_procs <= 0:
            dropped["no GPUs (gres/gpu) allocated or requested"] += 1
            continue
        if not has_alloc_tres and word == "CANCELLED" and start == end:
            cancelled_instantly += 1
        queued = submit
        if eligible is not None and eligible > submit:
            # Held or waiting on a dependency: the scheduler could not start it before.
            queued = eligible
            eligible_later += 1
        if limit is None:
            unlimited += 1
        t.id.append(ident)
        t.submit.append(queued)
        t.wait.append(start - queued)
        t.run.append(end - start)
        t.procs.append(procs if procs > 0 else UNKNOWN)
        t.req_procs.append(req_procs if req_procs > 0 else UNKNOWN)
        t.req_time.append(float(limit) if limit is not None else UNKNOWN)
        t.status.append(_status(state))
        t.user.append(users(get("User")))
        t.group.append(groups(get("Account")))
    if cols is None:
        raise TraceError(f"{source}: empty (expected an sacct --parsable2 header line)")
    if not records:
        raise TraceError(f"{source}: no job lines under the sacct header")
    t.user_names, t.group_names = users.names, groups.names
    q.records = records
    if "User" not in cols:
        q.absent.append("user")
    if "Account" not in cols:
        q.absent.append("group")
    if not raw_ids:
        q.notes.append("job ids are record numbers (add JobIDRaw to --format for Slurm's)")
    if eligible_later:
        q.notes.append(f"{eligible_later} jobs queued from Eligible, later than Submit")
    if unlimited:
        q.notes.append(f"{unlimited} jobs with an UNLIMITED time limit (requested time unknown)")
    if cancelled_instantly:
        q.notes.append(
            f"{cancelled_instantly} CANCELLED jobs with Start = End kept: without an AllocTRES "
            "column a job cancelled while pending cannot be told from one that ran 0 s "
            "(add AllocTRES to --format)"
        )
    fmt = "sacct-gpu" if unit == "GPUs" else "sacct"
    return Header(format=fmt, fields={"columns": ",".join(cols)}), t, q


def _pbs_int(kv: dict[str, str], key: str, source: str, lineno: int) -> int | None:
    raw = kv.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise TraceError(
            f"{source}:{lineno}: {key} is {raw!r}, not an integer (seconds since the epoch)"
        ) from None


def _pbs_duration(text: str) -> int:
    """PBS's ``[[H:]M:]S``: unlike Slurm, a bare number is seconds."""
    s = text.strip()
    if s.isdigit():
        return int(s)
    limit = parse_time_limit(s)
    if limit is None or "-" in s:
        raise ValueError(text)
    return limit


def _pbs_slots(exec_host: str) -> int:
    """Slots of ``exec_host``: Torque's ``n1/0+n1/1`` (one per entry) or ``n1/0-3,5``
    (ranges and lists), PBS Pro's ``n1/0*4+n2/0*4`` (the count after ``*``)."""
    total = 0
    for part in exec_host.split("+"):
        if not part:
            continue
        host, star, count = part.partition("*")
        if star:
            total += int(count)
            continue
        _, _, slots = host.partition("/")
        for item in slots.split(",") if slots else ["0"]:
            lo, dash, hi = item.partition("-")
            total += int(hi) - int(lo) + 1 if dash else 1
    return total


def _pbs_nodes(spec: str) -> int:
    """Processors of ``nodes=2:ppn=4+1:ppn=2`` (a host name counts as one node)."""
    total = 0
    for part in spec.split("+"):
        head, *props = part.split(":")
        nodes = int(head) if head.isdigit() else 1
        ppn = 1
        for p in props:
            if p.startswith("ppn="):
                ppn = int(p[4:])
        total += nodes * ppn
    return total


def parse_pbs(
    lines: Iterable[str], source: str = "<pbs>"
) -> tuple[Header, JobTable, QualityReport]:
    """Parse PBS/Torque accounting records; only ``E`` records become jobs."""
    t = JobTable(unit="processors")
    q = QualityReport()
    users, groups = _Names(), _Names()
    records = eligible_later = 0
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        m = _PBS_RECORD.match(line)
        if m is None:
            raise TraceError(
                f"{source}:{lineno}: expected 'MM/DD/YYYY HH:MM:SS;TYPE;JOBID;key=value ...' "
                f"(a PBS accounting record), got {line.strip()[:80]!r}"
            )
        if m.group(2) != "E":
            continue
        records += 1
        kv: dict[str, str] = {}
        for tok in m.group(4).split():
            k, sep, v = tok.partition("=")
            if sep:
                kv[k] = v
        qtime = _pbs_int(kv, "qtime", source, lineno)
        etime = _pbs_int(kv, "etime", source, lineno)
        start = _pbs_int(kv, "start", source, lineno)
        end = _pbs_int(kv, "end", source, lineno)
        try:
            wall = kv.get("Resource_List.walltime")
            limit = _pbs_duration(wall) if wall is not None else None
            used = kv.get("resources_used.walltime")
            used_s = _pbs_duration(used) if used is not None else None
        except ValueError:
            raise TraceError(
                f"{source}:{lineno}: a walltime is not HH:MM:SS (or seconds): {line.strip()[:80]!r}"
            ) from None
        try:
            ncpus = kv.get("Resource_List.ncpus")
            nodes = kv.get("Resource_List.nodes")
            if ncpus:
                req = float(ncpus)
            elif nodes:
                req = float(_pbs_nodes(nodes))
            else:
                req = float(UNKNOWN)
            host = kv.get("exec_host")
            procs = float(_pbs_slots(host)) if host else float(UNKNOWN)
        except ValueError:
            raise TraceError(
                f"{source}:{lineno}: Resource_List.ncpus, Resource_List.nodes or exec_host "
                f"is not a count: {line.strip()[:80]!r}"
            ) from None
        if qtime is None:
            q.dropped["no qtime"] += 1
            continue
        if not start:
            # Torque writes start=0 for a job deleted before it ran.
            q.dropped["never started (no start)"] += 1
            continue
        if end is not None and end >= start:
            run: float = end - start
        elif used_s is not None:
            run = used_s
        else:
            q.dropped["no end and no resources_used.walltime"] += 1
            continue
        queued = qtime
        if etime is not None and etime > qtime:
            queued = etime
            eligible_later += 1
        t.id.append(records)
        t.submit.append(float(queued))
        t.wait.append(float(start - queued))
        t.run.append(float(run))
        t.procs.append(procs)
        t.req_procs.append(req)
        t.req_time.append(float(limit) if limit is not None else UNKNOWN)
        status = _pbs_int(kv, "Exit_status", source, lineno)
        t.status.append(UNKNOWN if status is None else 1 if status == 0 else 0)
        t.user.append(users(kv.get("user")))
        t.group.append(groups(kv.get("group")))
    if not records:
        raise TraceError(f"{source}: no E (job end) records (is this a PBS accounting log?)")
    t.user_names, t.group_names = users.names, groups.names
    q.records = records
    q.notes.append("job ids are E-record numbers")
    if eligible_later:
        q.notes.append(f"{eligible_later} jobs queued from etime, later than qtime")
    return Header(format="pbs", fields={}), t, q


def _lines(path: Path, what: str) -> list[str]:
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    try:
        return _read_text(path).splitlines()
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(f"{path}: cannot read it as {what} (plain or gzip): {e}") from None


def read_sacct(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    """An ``sacct --parsable2`` file (plain or gzip), sizes in CPUs."""
    p = Path(path)
    return parse_sacct(_lines(p, "sacct output"), str(p))


def read_sacct_gpu(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    """An ``sacct --parsable2`` file (plain or gzip), sizes in GPUs."""
    p = Path(path)
    return parse_sacct(_lines(p, "sacct output"), str(p), unit="GPUs")


def read_pbs(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    """A PBS/Torque accounting log (plain or gzip)."""
    p = Path(path)
    return parse_pbs(_lines(p, "a PBS accounting log"), str(p))


def sniff(head: str) -> str | None:
    """``sacct`` or ``pbs`` when the first non-blank line says so, else None."""
    first = next((ln for ln in head.splitlines() if ln.strip()), "")
    if "|" in first:
        names = {c.strip() for c in first.split("|")}
        if {"JobID", "State"} <= names:
            return "sacct"
    if _PBS_RECORD.match(first):
        return "pbs"
    return None
