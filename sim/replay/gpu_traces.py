"""Reading the GPU cluster traces (Alibaba PAI v2023 pod list, Microsoft Philly via RFold).

Both become the same canonical job table as SWF, with sizes in GPUs:

* Alibaba ``openb_pod_list_*.csv``: submit = creation_time, wait = scheduled_time -
  creation_time, run = deletion_time - scheduled_time, size = num_gpu. A pod sharing one
  GPU (gpu_milli < 1000) holds a whole GPU here: the replay places whole units; the
  quality report counts them. Pods without GPUs are dropped by the procs > 0 filter. The
  capacity defaults to the GPUs in ``openb_node_list_gpu_node.csv`` beside the pod list.
* Philly (RFold's ``philly_trace.csv``): arrival, size (GPUs), duration. It records no
  wait, user or status: those are absent, and the whole trace is one campaign.
"""

from __future__ import annotations

import csv
from pathlib import Path

from bursar.sim.replay.table import UNKNOWN, Header, JobTable, QualityReport, TraceError

ALIBABA_COLUMNS = ("num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time")
PHILLY_COLUMNS = ("job id", "arrival time (sec)", "size", "duration (sec)")


def _float(row: dict[str, str], key: str, path: Path, lineno: int) -> float:
    raw = row.get(key)
    if raw is None or raw.strip() == "":
        return float(UNKNOWN)
    try:
        return float(raw)
    except ValueError:
        raise TraceError(f"{path}:{lineno}: column {key!r} is {raw!r}, not a number") from None


def read_alibaba(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    path = Path(path)
    t = JobTable(unit="GPUs")
    q = QualityReport()
    shared = 0
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ALIBABA_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path}:1: not an Alibaba pod list: columns {', '.join(missing)} are missing"
            )
        for lineno, row in enumerate(reader, 2):
            created = _float(row, "creation_time", path, lineno)
            deleted = _float(row, "deletion_time", path, lineno)
            sched = _float(row, "scheduled_time", path, lineno)
            gpus = _float(row, "num_gpu", path, lineno)
            milli = _float(row, "gpu_milli", path, lineno)
            if gpus == 1 and 0 < milli < 1000:
                shared += 1
            t.id.append(lineno - 1)
            t.submit.append(created)
            t.wait.append(sched - created if sched >= 0 and created >= 0 else UNKNOWN)
            t.run.append(deleted - sched if deleted >= 0 and sched >= 0 else UNKNOWN)
            t.procs.append(gpus)
            t.req_procs.append(gpus)
            t.req_time.append(UNKNOWN)
            t.status.append(UNKNOWN)
            t.user.append(UNKNOWN)
            t.group.append(UNKNOWN)
    q.records = len(t)
    q.absent += ["req_time", "user", "group", "status"]
    if shared:
        q.notes.append(f"{shared} pods share one GPU (gpu_milli < 1000); each holds one GPU here")
    nodes = path.parent / "openb_node_list_gpu_node.csv"
    capacity = None
    if nodes.is_file():
        with open(nodes, newline="", encoding="utf-8") as f:
            capacity = int(sum(float(r.get("gpu") or 0) for r in csv.DictReader(f)))
    header = Header(format="alibaba", fields={"nodes": str(nodes.name)}, max_procs=capacity)
    return header, t, q


def read_philly(path: str | Path) -> tuple[Header, JobTable, QualityReport]:
    path = Path(path)
    t = JobTable(unit="GPUs")
    with open(path, newline="", encoding="utf-8") as f:
        first = f.readline().lstrip("#").strip()
        names = [c.strip() for c in first.split(",")]
        missing = [c for c in PHILLY_COLUMNS if c not in names]
        if missing:
            raise TraceError(
                f"{path}:1: not a Philly (RFold) trace: columns {', '.join(missing)} are missing"
            )
        reader = csv.DictReader(f, fieldnames=names)
        for lineno, row in enumerate(reader, 2):
            t.id.append(int(_float(row, "job id", path, lineno)))
            t.submit.append(_float(row, "arrival time (sec)", path, lineno))
            t.wait.append(UNKNOWN)
            t.run.append(_float(row, "duration (sec)", path, lineno))
            size = _float(row, "size", path, lineno)
            t.procs.append(size)
            t.req_procs.append(size)
            t.req_time.append(UNKNOWN)
            t.status.append(UNKNOWN)
            t.user.append(UNKNOWN)
            t.group.append(UNKNOWN)
    q = QualityReport(records=len(t))
    q.absent += ["req_time", "user", "group", "status"]
    # The Philly cluster's size is not in the file: the replay needs --capacity.
    return Header(format="philly", fields={}), t, q
