"""PM100's job table: read from a small file written in its schema (the dataset's column
names), detected by the replay's ingestion, and replayed with each job's measured draw."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import pytest

from bursar.sim.power.model import QUANTILES, NodePower
from bursar.sim.replay.ingest import detect_format, load_trace
from bursar.sim.replay.pm100 import MARCONI100_NODES, read_pm100
from bursar.sim.replay.power import PowerSpec, facility
from bursar.sim.replay.run import replay_trace
from bursar.sim.replay.table import TraceError

COLUMNS = [
    "job_id", "user_id", "group_id", "submit_time", "start_time", "end_time", "run_time",
    "time_limit", "num_nodes_req", "num_nodes_alloc", "num_cores_alloc", "num_gpus_alloc",
    "job_state", "partition", "power_consumption",
]  # fmt: skip
ROWS = [
    # job 11: 2 nodes, 1,200 W measured on average (samples every 20 s, summed over nodes).
    [11, 7, 1, "2020-05-01T10:00:00+00:00", "2020-05-01T10:00:30+00:00",
     "2020-05-01T11:00:30+00:00", 3600, 120, 2, 2, 64, 8, "COMPLETED", "p1", "[1100.0, 1300.0]"],
    [12, 8, 1, "2020-05-01T10:01:00+00:00", "2020-05-01T10:02:00+00:00",
     "2020-05-01T10:12:00+00:00", 600, "INFINITE", 1, 1, 32, 4, "TIMEOUT", "p1", "[700]"],
    # No samples: the power model gives it a modelled draw.
    [13, 7, 1, "2020-05-01T10:05:00+00:00", "2020-05-01T10:05:00+00:00",
     "2020-05-01T10:35:00+00:00", 1800, 30, 4, 4, 128, 16, "CANCELLED by 7", "p2", ""],
]  # fmt: skip


def write(tmp_path: Path, rows: list[list[object]], name: str = "jobs.csv.gz") -> Path:
    p = tmp_path / name
    with gzip.open(p, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        w.writerows(rows)
    return p


def test_the_job_table_reads_into_the_replays_columns_with_measured_power(
    tmp_path: Path,
) -> None:
    header, t, q = read_pm100(write(tmp_path, ROWS))
    assert header.format == "pm100"
    assert header.capacity == MARCONI100_NODES
    assert t.unit == "nodes"
    assert list(t.id) == [11, 12, 13]
    assert list(t.wait) == [30.0, 60.0, 0.0]
    assert list(t.run) == [3600, 600, 1800]
    assert list(t.procs) == [2, 1, 4]
    assert list(t.req_time) == [7200, -1, 1800]  # minutes to seconds; INFINITE unknown
    assert list(t.status) == [1, 0, 5]
    assert list(t.user) == [7, 8, 7]
    assert t.power == [1200.0, 700.0, -1.0]
    assert q.records == 3
    assert q.notes == ["1 jobs have no power samples (modelled draw)"]


def test_ingestion_detects_the_format_from_its_columns(tmp_path: Path) -> None:
    p = write(tmp_path, ROWS, name="export.csv.gz")
    assert detect_format(p) == "pm100"
    trace = load_trace(p)
    assert list(trace.jobs.power or []) == [1200.0, 700.0, -1.0]
    assert len(trace.jobs) == 3


def test_a_replay_uses_the_measured_draw(tmp_path: Path) -> None:
    node = NodePower("m", 300.0, 2000.0, tuple(300.0 + 10 * i for i in range(QUANTILES + 1)), "t")
    r = replay_trace(write(tmp_path, ROWS), "easy", capacity=8, power=PowerSpec(node))
    fp = facility(r.workload, PowerSpec(node))
    assert fp.idle_w == 8 * 300
    assert fp.extra_w[0] == 1200 - 2 * 300  # measured
    assert fp.extra_w[1] == 700 - 300
    assert fp.extra_w[2] > 0  # modelled: four loaded nodes above their idle
    assert r.metrics["power"]["stranded"] == 0


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [[*ROWS[0][:3], "yesterday", *ROWS[0][4:]]],
            r"jobs.csv.gz:2: submit_time is not a timestamp",
        ),
        ([[*ROWS[0][:-1], "[1, x]"]], r"jobs.csv.gz:2: power_consumption is not a list of numbers"),
        ([[*ROWS[0][:-1], "[-5]"]], r"jobs.csv.gz:2: power_consumption has a sample"),
        ([[*ROWS[0][:6], "long", *ROWS[0][7:]]], r"jobs.csv.gz:2: run_time is not a number"),
    ],
)
def test_a_bad_row_names_the_file_and_line(
    tmp_path: Path, rows: list[list[object]], message: str
) -> None:
    with pytest.raises(TraceError, match=message):
        read_pm100(write(tmp_path, rows))


def test_a_table_without_power_is_not_pm100(tmp_path: Path) -> None:
    p = tmp_path / "jobs.csv"
    p.write_text(
        "job_id,submit_time,start_time,run_time,job_state,num_nodes_alloc\n1,0,0,1,COMPLETED,1\n"
    )
    with pytest.raises(TraceError, match="not a PM100 job table: no column power_consumption"):
        read_pm100(p)


def test_the_parquet_table_reads_as_its_csv_export(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (not a declared dependency)")
    from datetime import datetime

    import pyarrow.parquet as pq

    cols = {c: [r[k] for r in ROWS] for k, c in enumerate(COLUMNS)}
    for c in ("submit_time", "start_time", "end_time"):
        cols[c] = [datetime.fromisoformat(v) for v in cols[c]]
    cols["time_limit"] = [str(v) for v in cols["time_limit"]]
    cols["power_consumption"] = [[1100.0, 1300.0], [700.0], []]
    p = tmp_path / "job_table.parquet"
    pq.write_table(pa.table(cols), p)
    assert detect_format(p) == "pm100"
    _, t, _ = read_pm100(p)
    _, c, _ = read_pm100(write(tmp_path, ROWS))
    assert list(t.submit) == list(c.submit)
    assert t.power == c.power
