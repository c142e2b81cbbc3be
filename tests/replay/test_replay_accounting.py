"""Accounting ingestion: Slurm ``sacct --parsable2`` and PBS/Torque logs, read into the job
table with their recorded waits, replayed through ``bursar replay`` and graded by
``bursar fidelity``; clear errors for bad lines; the time-limit parser's round trip."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bursar.cli.main import main
from bursar.sim.replay.accounting import (
    format_time_limit,
    parse_pbs,
    parse_sacct,
    parse_time_limit,
)
from bursar.sim.replay.ingest import detect_format, load_trace
from bursar.sim.replay.table import TraceError

# Hand-written as ``sacct --allusers --parsable2 --noconvert`` prints it (no cluster
# here), with extra columns (JobName, Partition, Elapsed, NNodes) in sacct's own order: steps (.batch,
# .extern, .0), an array (1004_1, 1004_2 and a pending 1014_[1-5]), a job cancelled before
# it started, one pending, one still running, one cancelled after it started, UNLIMITED
# and every Timelimit form, a held job (Eligible after Submit), typed GPUs.
SACCT = """\
JobID|JobIDRaw|JobName|User|Account|Partition|Submit|Eligible|Start|End|Elapsed|Timelimit|AllocCPUS|AllocTRES|ReqTRES|NNodes|State
1001|1001|prep|alice|physics|cpu|2026-11-30T08:00:00|2026-11-30T08:00:00|2026-11-30T08:00:10|2026-11-30T08:10:10|00:10:00|01:00:00|4|billing=4,cpu=4,mem=8000M,node=1|billing=4,cpu=4,mem=8000M,node=1|1|COMPLETED
1001.batch|1001.batch|batch||physics||2026-11-30T08:00:10|2026-11-30T08:00:10|2026-11-30T08:00:10|2026-11-30T08:10:10|00:10:00||4|cpu=4,mem=8000M,node=1||1|COMPLETED
1001.extern|1001.extern|extern||physics||2026-11-30T08:00:10|2026-11-30T08:00:10|2026-11-30T08:00:10|2026-11-30T08:10:10|00:10:00||4|billing=4,cpu=4,mem=8000M,node=1||1|COMPLETED
1002|1002|train|bob|chem|gpu|2026-11-30T08:05:00|2026-11-30T08:05:00|2026-11-30T08:06:00|2026-11-30T09:06:00|01:00:00|2-00:00:00|8|billing=8,cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64000M,node=1|billing=8,cpu=8,gres/gpu=2,mem=64000M,node=1|1|COMPLETED
1002.batch|1002.batch|batch||chem||2026-11-30T08:06:00|2026-11-30T08:06:00|2026-11-30T08:06:00|2026-11-30T09:06:00|01:00:00||8|cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64000M,node=1||1|COMPLETED
1002.0|1002.0|python||chem||2026-11-30T08:06:05|2026-11-30T08:06:05|2026-11-30T08:06:05|2026-11-30T09:05:55|00:59:50||8|cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64000M,node=1||1|COMPLETED
1003|1003|oops|alice|physics|cpu|2026-11-30T08:08:00|2026-11-30T08:08:00|None|2026-11-30T08:20:00|00:00:00|01:00:00|0||billing=2,cpu=2,mem=4000M,node=1|1|CANCELLED by 1000
1004_1|1005|sweep|alice|physics|cpu|2026-11-30T08:10:00|2026-11-30T08:10:00|2026-11-30T08:12:00|2026-11-30T08:42:00|00:30:00|30:00|2|billing=2,cpu=2,mem=4000M,node=1|billing=2,cpu=2,mem=4000M,node=1|1|COMPLETED
1004_1.batch|1005.batch|batch||physics||2026-11-30T08:12:00|2026-11-30T08:12:00|2026-11-30T08:12:00|2026-11-30T08:42:00|00:30:00||2|cpu=2,mem=4000M,node=1||1|COMPLETED
1004_2|1006|sweep|alice|physics|cpu|2026-11-30T08:10:00|2026-11-30T08:10:00|2026-11-30T08:15:00|2026-11-30T08:45:00|00:30:00|30:00|2|billing=2,cpu=2,mem=4000M,node=1|billing=2,cpu=2,mem=4000M,node=1|1|TIMEOUT
1007|1007|assemble|carol|bio|long|2026-11-30T08:20:00|2026-11-30T08:20:00|2026-11-30T08:20:00|2026-11-30T10:20:00|02:00:00|UNLIMITED|16|billing=16,cpu=16,mem=128000M,node=1|billing=16,cpu=16,mem=128000M,node=1|1|FAILED
1007.extern|1007.extern|extern||bio||2026-11-30T08:20:00|2026-11-30T08:20:00|2026-11-30T08:20:00|2026-11-30T10:20:00|02:00:00||16|billing=16,cpu=16,mem=128000M,node=1||1|COMPLETED
1008|1008|eval|bob|chem|gpu|2026-11-30T08:30:00|2026-11-30T09:06:00|2026-11-30T09:07:00|2026-11-30T09:37:00|00:30:00|60|8|billing=8,cpu=8,gres/gpu=1,mem=32000M,node=1|billing=8,cpu=8,gres/gpu=1,mem=32000M,node=1|1|COMPLETED
1009|1009|wait|dave|physics|cpu|2026-11-30T09:50:00|2026-11-30T09:50:00|Unknown|Unknown|00:00:00|04:00:00|0||billing=32,cpu=32,mem=64000M,node=2|2|PENDING
1010|1010|long|carol|bio|long|2026-11-30T09:55:00|2026-11-30T09:55:00|2026-11-30T10:00:00|Unknown|00:50:00|1-00:00:00|8|billing=8,cpu=8,mem=16000M,node=1|billing=8,cpu=8,mem=16000M,node=1|1|RUNNING
1011|1011|quick|alice|physics|cpu|2026-11-30T08:50:00|2026-11-30T08:50:00|2026-11-30T09:00:00|2026-11-30T09:05:00|00:05:00|1-00:00:00|4|billing=4,cpu=4,mem=8000M,node=1|billing=4,cpu=4,mem=8000M,node=1|1|CANCELLED by 1000
1012|1012|tiny|erin|chem|cpu|2026-11-30T09:30:00|2026-11-30T09:30:00|2026-11-30T09:30:30|2026-11-30T09:31:30|00:01:00|00:05:00|1|billing=1,cpu=1,mem=500000M,node=1|billing=1,cpu=1,mem=2000M,node=1|1|OUT_OF_MEMORY
1013|1013|finetune|bob|chem|gpu|2026-11-30T09:40:00|2026-11-30T09:40:00|2026-11-30T09:50:00|2026-11-30T10:50:00|01:00:00|02:00:00|8|billing=8,cpu=8,gres/gpu:h100=4,mem=64000M,node=1|billing=8,cpu=8,gres/gpu=4,mem=64000M,node=1|1|COMPLETED
1014_[1-5]|1014|later|erin|chem|cpu|2026-11-30T10:00:00|2026-11-30T10:00:00|Unknown|Unknown|00:00:00|10|0||billing=1,cpu=1,mem=2000M,node=1|1|PENDING
"""

# Hand-written as a Torque server's accounting log prints it, for the same morning: Q, S, D and E records; an array
# (203[1], 203[2]), a job deleted before it started (E without start), nodes=N:ppn=M,
# nodes=host:ppn=1, ncpus with PBS Pro's exec_host host/0*N, a held job (etime after
# qtime), a bare-seconds walltime and a job that ran past its walltime (209).
PBS = """\
11/30/2026 08:00:00;Q;200.head;queue=batch
11/30/2026 08:00:05;S;200.head;user=alice group=physics queue=batch qtime=1796025600 etime=1796025600 start=1796025605 exec_host=n01/0+n01/1+n01/2+n01/3 Resource_List.nodes=1:ppn=4 Resource_List.walltime=01:00:00
11/30/2026 08:05:00;Q;201.head;queue=batch
11/30/2026 08:06:00;S;201.head;user=bob group=chem queue=batch qtime=1796025900 etime=1796025900 start=1796025960 exec_host=n02/0*8 Resource_List.ncpus=8 Resource_List.walltime=02:00:00
11/30/2026 08:10:00;Q;203[1].head;queue=batch
11/30/2026 08:10:00;Q;203[2].head;queue=batch
11/30/2026 08:10:00;Q;202.head;queue=batch
11/30/2026 08:12:00;S;203[1].head;user=carol group=bio queue=batch qtime=1796026200 etime=1796026200 start=1796026320 exec_host=n03/0+n03/1+n04/0+n04/1 Resource_List.nodes=2:ppn=2 Resource_List.walltime=00:15:00
11/30/2026 08:13:00;S;203[2].head;user=carol group=bio queue=batch qtime=1796026200 etime=1796026200 start=1796026380 exec_host=n05/0+n05/1+n06/0+n06/1 Resource_List.nodes=2:ppn=2 Resource_List.walltime=00:15:00
11/30/2026 08:15:00;Q;204.head;queue=batch
11/30/2026 08:15:00;S;204.head;user=dave group=physics queue=batch qtime=1796026500 etime=1796026500 start=1796026500 exec_host=n05/2 Resource_List.nodes=n05:ppn=1 Resource_List.walltime=300
11/30/2026 08:16:00;E;204.head;user=dave group=physics jobname=run queue=batch ctime=1796026500 qtime=1796026500 etime=1796026500 start=1796026500 owner=dave@login1 exec_host=n05/2 Resource_List.nodes=n05:ppn=1 Resource_List.walltime=300 session=4900 end=1796026560 Exit_status=0 resources_used.cput=00:01:00 resources_used.mem=10240kb resources_used.walltime=00:01:00
11/30/2026 08:16:40;Q;205.head;queue=batch
11/30/2026 08:20:00;Q;206.head;queue=batch
11/30/2026 08:20:00;D;202.head;requestor=alice@login1
11/30/2026 08:20:00;E;202.head;user=alice group=physics jobname=run queue=batch ctime=1796026200 qtime=1796026200 etime=1796026200 owner=alice@login1 Resource_List.ncpus=4 Resource_List.walltime=01:00:00 end=1796026800 Exit_status=271
11/30/2026 08:22:00;E;203[1].head;user=carol group=bio jobname=run queue=batch ctime=1796026200 qtime=1796026200 etime=1796026200 start=1796026320 owner=carol@login1 exec_host=n03/0+n03/1+n04/0+n04/1 Resource_List.nodes=2:ppn=2 Resource_List.walltime=00:15:00 session=4720 end=1796026920 Exit_status=0 resources_used.cput=00:10:00 resources_used.mem=10240kb resources_used.walltime=00:10:00
11/30/2026 08:25:00;S;206.head;user=bob group=chem queue=batch qtime=1796026800 etime=1796026800 start=1796027100 exec_host=n08/0*16 Resource_List.ncpus=16 Resource_List.walltime=04:00:00
11/30/2026 08:25:00;Q;207.head;queue=batch
11/30/2026 08:25:30;S;207.head;user=alice group=physics queue=batch qtime=1796027100 etime=1796027100 start=1796027130 exec_host=n01/5 Resource_List.ncpus=1 Resource_List.walltime=00:10:00
11/30/2026 08:27:30;E;207.head;user=alice group=physics jobname=run queue=batch ctime=1796027100 qtime=1796027100 etime=1796027100 start=1796027130 owner=alice@login1 exec_host=n01/5 Resource_List.ncpus=1 Resource_List.walltime=00:10:00 session=4530 end=1796027250 Exit_status=0 resources_used.cput=00:02:00 resources_used.mem=10240kb resources_used.walltime=00:02:00
11/30/2026 08:28:00;E;203[2].head;user=carol group=bio jobname=run queue=batch ctime=1796026200 qtime=1796026200 etime=1796026200 start=1796026380 owner=carol@login1 exec_host=n05/0+n05/1+n06/0+n06/1 Resource_List.nodes=2:ppn=2 Resource_List.walltime=00:15:00 session=4780 end=1796027280 Exit_status=-11 resources_used.cput=00:15:00 resources_used.mem=10240kb resources_used.walltime=00:15:00
11/30/2026 08:30:00;Q;208.head;queue=batch
11/30/2026 08:30:05;E;200.head;user=alice group=physics jobname=run queue=batch ctime=1796025600 qtime=1796025600 etime=1796025600 start=1796025605 owner=alice@login1 exec_host=n01/0+n01/1+n01/2+n01/3 Resource_List.nodes=1:ppn=4 Resource_List.walltime=01:00:00 session=45 end=1796027405 Exit_status=0 resources_used.cput=00:30:00 resources_used.mem=10240kb resources_used.walltime=00:30:00
11/30/2026 08:35:00;S;205.head;user=erin group=chem queue=batch qtime=1796026600 etime=1796027600 start=1796027700 exec_host=n07/0*2 Resource_List.ncpus=2 Resource_List.walltime=00:30:00
11/30/2026 08:40:00;S;208.head;user=carol group=bio queue=batch qtime=1796027400 etime=1796027400 start=1796028000 exec_host=n04/0*4 Resource_List.ncpus=4 Resource_List.walltime=01:00:00
11/30/2026 08:40:00;Q;209.head;queue=batch
11/30/2026 08:40:10;S;209.head;user=dave group=physics queue=batch qtime=1796028000 etime=1796028000 start=1796028010 exec_host=n02/0*2 Resource_List.ncpus=2 Resource_List.walltime=00:15:00
11/30/2026 08:50:00;Q;210.head;queue=batch
11/30/2026 08:50:00;S;210.head;user=erin group=chem queue=batch qtime=1796028600 etime=1796028600 start=1796028600 exec_host=n07/3 Resource_List.ncpus=1 Resource_List.walltime=00:01:00
11/30/2026 08:50:30;E;210.head;user=erin group=chem jobname=run queue=batch ctime=1796028600 qtime=1796028600 etime=1796028600 start=1796028600 owner=erin@login1 exec_host=n07/3 Resource_List.ncpus=1 Resource_List.walltime=00:01:00 session=40 end=1796028630 Exit_status=0 resources_used.cput=00:00:30 resources_used.mem=10240kb resources_used.walltime=00:00:30
11/30/2026 08:55:00;E;205.head;user=erin group=chem jobname=run queue=batch ctime=1796026600 qtime=1796026600 etime=1796027600 start=1796027700 owner=erin@login1 exec_host=n07/0*2 Resource_List.ncpus=2 Resource_List.walltime=00:30:00 session=4100 end=1796028900 Exit_status=0 resources_used.cput=00:20:00 resources_used.mem=10240kb resources_used.walltime=00:20:00
11/30/2026 09:00:10;E;209.head;user=dave group=physics jobname=run queue=batch ctime=1796028000 qtime=1796028000 etime=1796028000 start=1796028010 owner=dave@login1 exec_host=n02/0*2 Resource_List.ncpus=2 Resource_List.walltime=00:15:00 session=4410 end=1796029210 Exit_status=0 resources_used.cput=00:20:00 resources_used.mem=10240kb resources_used.walltime=00:20:00
11/30/2026 09:06:00;E;201.head;user=bob group=chem jobname=run queue=batch ctime=1796025900 qtime=1796025900 etime=1796025900 start=1796025960 owner=bob@login1 exec_host=n02/0*8 Resource_List.ncpus=8 Resource_List.walltime=02:00:00 session=4360 end=1796029560 Exit_status=0 resources_used.cput=01:00:00 resources_used.mem=10240kb resources_used.walltime=01:00:00
11/30/2026 09:10:00;E;208.head;user=carol group=bio jobname=run queue=batch ctime=1796027400 qtime=1796027400 etime=1796027400 start=1796028000 owner=carol@login1 exec_host=n04/0*4 Resource_List.ncpus=4 Resource_List.walltime=01:00:00 session=4400 end=1796029800 Exit_status=1 resources_used.cput=00:30:00 resources_used.mem=10240kb resources_used.walltime=00:30:00
11/30/2026 10:25:00;E;206.head;user=bob group=chem jobname=run queue=batch ctime=1796026800 qtime=1796026800 etime=1796026800 start=1796027100 owner=bob@login1 exec_host=n08/0*16 Resource_List.ncpus=16 Resource_List.walltime=04:00:00 session=4500 end=1796034300 Exit_status=0 resources_used.cput=02:00:00 resources_used.mem=10240kb resources_used.walltime=02:00:00
"""

EPOCH = 1796025600  # 2026-11-30T08:00:00Z


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _cli(*args: str) -> str:
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def test_sacct_jobs_waits_and_drops() -> None:
    header, t, q = parse_sacct(SACCT.splitlines())
    assert header.format == "sacct"
    # 13 job records (steps skipped); 4 could never be replayed, each with its reason.
    assert q.records == 13
    assert dict(q.dropped) == {
        "cancelled before it started (no Start)": 1,
        "still pending (no Start)": 2,
        "still running (no End)": 1,
    }
    assert t.id == [1001, 1002, 1005, 1006, 1007, 1008, 1011, 1012, 1013]
    # Start - Submit, except 1008: held on a dependency, queued from its Eligible (60 s).
    assert t.wait == [10, 60, 120, 300, 0, 60, 600, 30, 600]
    assert t.run == [600, 3600, 1800, 1800, 7200, 1800, 300, 60, 3600]
    assert t.procs == [4, 8, 2, 2, 16, 8, 4, 1, 8]
    # 01:00:00, 2-00:00:00, 30:00 (MM:SS) twice, UNLIMITED, 60 (minutes), 1-00:00:00, ...
    assert t.req_time == [3600, 172800, 1800, 1800, -1, 3600, 86400, 300, 7200]
    assert [t.user_names[u] for u in t.user] == [
        "alice",
        "bob",
        "alice",
        "alice",
        "carol",
        "bob",
        "alice",
        "erin",
        "bob",
    ]
    assert t.group_names == ["physics", "chem", "bio"]


def test_sacct_gpus_from_alloc_tres() -> None:
    _, t, q = parse_sacct(SACCT.splitlines(), unit="GPUs")
    assert t.unit == "GPUs"
    # gres/gpu=2 (beside its typed twin, not added to it), gres/gpu=1, typed gres/gpu:h100=4.
    assert (t.id, t.procs) == ([1002, 1008, 1013], [2, 1, 4])
    assert q.dropped["no GPUs (gres/gpu) allocated or requested"] == 6


def test_sacct_columns_in_any_order_and_minimal_set() -> None:
    rows = [ln.split("|") for ln in SACCT.splitlines()]
    names = rows[0]
    keep = ["State", "Timelimit", "End", "AllocCPUS", "Start", "User", "Submit", "JobID"]
    idx = [names.index(c) for c in keep]
    text = ["|".join(r[k] for k in idx) for r in rows]
    _, t, q = parse_sacct(text)
    _, full, _ = parse_sacct(SACCT.splitlines())
    assert q.records == 13 and len(t) == 9
    assert t.procs == full.procs and t.run == full.run
    # Without Eligible the held job's wait counts from its Submit; without JobIDRaw the
    # ids are record numbers; without Account there is no group.
    assert t.wait[5] == 37 * 60
    assert t.id == [1, 2, 4, 5, 6, 7, 10, 11, 12]
    assert "group" in q.absent


def test_pbs_end_records() -> None:
    header, t, q = parse_pbs(PBS.splitlines())
    assert header.format == "pbs"
    assert q.records == 12
    assert dict(q.dropped) == {"never started (no start)": 1}
    # In E-record order: 204, 203[1], 207, 203[2], 200, 210, 205, 209, 201, 208, 206.
    assert t.wait == [0, 120, 30, 180, 5, 0, 100, 10, 60, 600, 300]
    assert t.run == [60, 600, 120, 900, 1800, 30, 1200, 1200, 3600, 1800, 7200]
    assert t.procs == [1, 4, 1, 4, 4, 1, 2, 2, 8, 4, 16]
    assert t.req_procs == [1, 4, 1, 4, 4, 1, 2, 2, 8, 4, 16]
    # walltime=300 is seconds in PBS (a bare number is minutes in Slurm).
    assert t.req_time[0] == 300
    assert t.status[3] == 0  # Exit_status=-11: killed at its walltime
    assert [t.user_names[u] for u in t.user][:3] == ["dave", "carol", "alice"]


def test_formats_are_told_from_the_first_line(tmp_path: Path) -> None:
    assert detect_format(_write(tmp_path, "jobs.txt", SACCT)) == "sacct"
    assert detect_format(_write(tmp_path, "20261130", PBS)) == "pbs"
    with pytest.raises(TraceError, match="pass --format"):
        detect_format(_write(tmp_path, "other.txt", "a,b,c\n1,2,3\n"))


@pytest.mark.parametrize(
    ("fmt", "text", "lineno", "expected"),
    [
        ("sacct", SACCT.replace("|1|TIMEOUT", "|TIMEOUT"), 11, "expected 17 '|'-separated"),
        ("sacct", SACCT.replace("|30:00|2|", "|1:2:3:4|2|", 1), 9, "Timelimit is '1:2:3:4'"),
        ("sacct", SACCT.replace("2026-11-30T08:05:00", "30/11/2026", 1), 5, "not YYYY-MM-DD"),
        ("sacct", SACCT.replace("|8|billing=8", "|eight|billing=8", 1), 5, "not a number"),
        (
            "pbs",
            PBS.replace("11/30/2026 08:16:00;E;", "08:16:00 E ", 1),
            12,
            "expected 'MM/DD/YYYY",
        ),
        ("pbs", PBS.replace("end=1796034300", "end=soon", 1), 36, "end is 'soon'"),
    ],
)
def test_a_bad_line_names_the_file_the_line_and_what_was_expected(
    tmp_path: Path, fmt: str, text: str, lineno: int, expected: str
) -> None:
    p = _write(tmp_path, "acct.log", text)
    with pytest.raises(TraceError) as e:
        load_trace(p, fmt)
    assert str(e.value).startswith(f"{p}:{lineno}: ")
    assert expected in str(e.value)


def test_a_header_without_the_needed_columns_is_refused(tmp_path: Path) -> None:
    p = _write(tmp_path, "acct.txt", "JobID|User|State\n1|alice|COMPLETED\n")
    with pytest.raises(TraceError, match=r"acct.txt:1: .*missing Submit, Start, End, Timelimit"):
        load_trace(p, "sacct")


def test_replay_and_fidelity_of_sacct(tmp_path: Path) -> None:
    trace = _write(tmp_path, "cluster.sacct", SACCT)
    out = tmp_path / "run"
    _cli("replay", "--trace", str(trace), "--policy", "fifo", "--capacity", "64", "--out", str(out))
    m = json.loads((out / "metrics.json").read_text())
    assert m["jobs"] == 9
    assert m["quality"]["dropped"]["cancelled before it started (no Start)"] == 1
    # 64 CPUs never fill (47 at most at once): every job starts at its submit. By hand:
    # 198,060 CPU-seconds over 64 CPUs x 9,600 s (first submit to 1013's end).
    assert m["mean_wait_s"] == 0
    assert m["makespan_s"] == 9600
    assert m["utilization"] == pytest.approx(198060 / (64 * 9600))
    csv = (out / "schedule.csv").read_text().splitlines()
    assert csv[1].startswith("1001,user-alice,0,0,600,4")
    f = json.loads(
        _cli("fidelity", "--trace", str(trace), "--policy", "fifo", "--capacity", "64", "--json")
    )
    # The recorded waits (10+60+120+300+0+60+600+30+600) / 9.
    assert f["measures"]["mean_wait_obs"] == pytest.approx(1780 / 9)


def test_replay_of_pbs(tmp_path: Path) -> None:
    trace = _write(tmp_path, "20261130", PBS)
    out = tmp_path / "run"
    _cli(
        "replay",
        "--trace",
        str(trace),
        "--policy",
        "fifo",
        "--capacity",
        "64",
        "--out",
        str(out),
        "--format",
        "pbs",
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["jobs"] == 11
    # 169,410 CPU-seconds over 64 CPUs x 8,400 s (first qtime to 206's end).
    assert m["utilization"] == pytest.approx(169410 / (64 * 8400))
    assert m["ran_past_request"] == 1
    assert m["quality"]["dropped"] == {"never started (no start)": 1}


@given(st.integers(min_value=0, max_value=400 * 86400))
def test_time_limit_round_trip(seconds: int) -> None:
    assert parse_time_limit(format_time_limit(seconds)) == seconds


@given(
    st.integers(0, 365),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
)
def test_every_slurm_time_form(d: int, h: int, m: int, s: int) -> None:
    assert parse_time_limit(f"{d}-{h:02d}:{m:02d}:{s:02d}") == ((d * 24 + h) * 60 + m) * 60 + s
    assert parse_time_limit(f"{d}-{h}:{m}") == ((d * 24 + h) * 60 + m) * 60
    assert parse_time_limit(f"{d}-{h}") == (d * 24 + h) * 3600
    assert parse_time_limit(f"{h:02d}:{m:02d}:{s:02d}") == (h * 60 + m) * 60 + s
    assert parse_time_limit(f"{m:02d}:{s:02d}") == m * 60 + s
    assert parse_time_limit(str(m)) == m * 60


def test_unlimited_and_bad_time_limits() -> None:
    assert parse_time_limit("UNLIMITED") is None
    assert format_time_limit(None) == "UNLIMITED"
    for bad in ("1:2:3:4", "x-01:00:00", "1-2:3:4:5", "01:xx", "-5"):
        with pytest.raises(ValueError):
            parse_time_limit(bad)


def test_whatif_on_sacct_gpus(tmp_path: Path) -> None:
    trace = _write(tmp_path, "cluster.txt", SACCT)
    out = tmp_path / "whatif"
    _cli(
        "whatif",
        "--trace",
        str(trace),
        "--format",
        "sacct-gpu",
        "--capacity",
        "8",
        "--candidate",
        "capacity=4",
        "--policy",
        "fifo",
        "--out",
        str(out),
    )
    d = json.loads((out / "whatif.json").read_text())
    base = d["baseline"]
    assert (base["jobs"], base["unit"]) == (3, "GPUs")
    # 1002 (2 GPUs x 3,600 s), 1008 (1 x 1,800), 1013 (4 x 3,600) all fit 8 GPUs at once:
    # 23,400 GPU-seconds over 8 x 9,300 s (1002's submit to 1013's end).
    assert base["utilization"] == pytest.approx(23400 / (8 * 9300))
    assert "recorded" in d["fidelity"]


_JOB = st.tuples(
    st.integers(0, 10**6),  # submit, seconds from the start
    st.integers(0, 10**5),  # wait
    st.integers(0, 10**5),  # run
    st.integers(1, 512),  # CPUs
    st.one_of(st.none(), st.integers(1, 30 * 86400)),  # time limit; None = UNLIMITED
    st.sampled_from(["alice", "bob", "carol"]),
    st.booleans(),  # started (else cancelled before it started)
)


def _stamp(t: int) -> str:
    return datetime.fromtimestamp(EPOCH + t, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@given(st.lists(_JOB, min_size=1, max_size=30))
def test_sacct_reads_back_what_it_printed(jobs: list[tuple]) -> None:
    lines = ["JobID|User|Submit|Start|End|Timelimit|AllocCPUS|State"]
    for k, (sub, wait, run, cpus, limit, user, started) in enumerate(jobs, 1):
        if not started:
            lines.append(
                f"{k}|{user}|{_stamp(sub)}|None|{_stamp(sub + wait)}|"
                f"{format_time_limit(limit)}|0|CANCELLED by 0"
            )
            continue
        start, end = _stamp(sub + wait), _stamp(sub + wait + run)
        lines.append(
            f"{k}|{user}|{_stamp(sub)}|{start}|{end}|{format_time_limit(limit)}|{cpus}|COMPLETED"
        )
        lines.append(f"{k}.batch||{_stamp(sub)}|{start}|{end}||{cpus}|COMPLETED")
    _, t, q = parse_sacct(lines)
    ran = [j for j in jobs if j[6]]
    assert q.records == len(jobs)
    assert q.dropped["cancelled before it started (no Start)"] == len(jobs) - len(ran)
    assert t.wait == [j[1] for j in ran]
    assert t.run == [j[2] for j in ran]
    assert t.procs == [j[3] for j in ran]
    assert t.req_time == [-1 if j[4] is None else j[4] for j in ran]
    assert [t.user_names[u] for u in t.user] == [j[5] for j in ran]
    if ran:
        assert [s - t.submit[0] for s in t.submit] == [j[0] - ran[0][0] for j in ran]


@given(st.lists(_JOB, min_size=1, max_size=30))
def test_pbs_reads_back_what_it_logged(jobs: list[tuple]) -> None:
    lines = []
    for k, (sub, wait, run, cpus, limit, user, started) in enumerate(jobs, 1):
        day = datetime.fromtimestamp(EPOCH + sub, UTC).strftime("%m/%d/%Y %H:%M:%S")
        q = EPOCH + sub
        lines.append(f"{day};Q;{k}.head;queue=batch")
        # PBS writes hours past a day as hours (36:00:00), never Slurm's D-HH:MM:SS.
        hms = f"{limit // 3600}:{limit % 3600 // 60:02d}:{limit % 60:02d}" if limit else ""
        wall = f" Resource_List.walltime={hms}" if limit else ""
        when = f" start={q + wait} end={q + wait + run}" if started else f" end={q + wait}"
        lines.append(
            f"{day};E;{k}.head;user={user} group=g qtime={q} etime={q}{when}"
            f" exec_host=n1/0*{cpus} Resource_List.ncpus={cpus}{wall} Exit_status=0"
        )
    _, t, q = parse_pbs(lines)
    ran = [j for j in jobs if j[6]]
    assert q.records == len(jobs)
    assert q.dropped["never started (no start)"] == len(jobs) - len(ran)
    assert (t.wait, t.run) == ([j[1] for j in ran], [j[2] for j in ran])
    assert t.procs == t.req_procs == [j[3] for j in ran]
    assert t.req_time == [-1 if j[4] is None else j[4] for j in ran]
    assert [t.user_names[u] for u in t.user] == [j[5] for j in ran]


@pytest.mark.parametrize(("name", "text"), [("jobs.sacct", SACCT), ("20261130", PBS)])
def test_every_record_is_kept_or_dropped_for_a_reason(tmp_path: Path, name: str, text: str) -> None:
    q = load_trace(_write(tmp_path, name, text)).quality
    assert q.records == q.kept + sum(q.dropped.values())


# As the accounting test cluster's sacct (Slurm 22.05) printed them, with the documented
# --format: a job that ran, one cancelled while it pended for resources (Start = End = the
# cancel, AllocCPUS its request, AllocTRES empty), and a held job cancelled (Eligible
# Unknown, Timelimit Partition_Limit; sacct prints it only when selecting by --state, since
# it was never eligible).
SACCT_2205 = """\
JobIDRaw|JobID|User|Account|Submit|Eligible|Start|End|Timelimit|AllocCPUS|AllocTRES|ReqTRES|State
9|9|root|physics|2026-12-02T15:58:18|2026-12-02T15:58:18|2026-12-02T15:58:18|2026-12-02T15:58:26|00:01:00|128|billing=128,cpu=128,gres/gpu=32,node=4|billing=4,cpu=4,mem=512000M,node=4|COMPLETED
9.batch|9.batch||physics|2026-12-02T15:58:18|2026-12-02T15:58:18|2026-12-02T15:58:18|2026-12-02T15:58:26||32|cpu=32,gres/gpu=8,mem=0,node=1||COMPLETED
10|10|root|chem|2026-12-02T15:58:18|2026-12-02T15:58:18|2026-12-02T15:58:20|2026-12-02T15:58:20|00:01:00|4||billing=4,cpu=4,mem=512000M,node=4|CANCELLED by 0
5|5|root|root|2026-12-02T15:57:18|Unknown|2026-12-02T15:57:19|2026-12-02T15:57:19|Partition_Limit|1||billing=1,cpu=1,mem=128000M,node=1|CANCELLED by 0
"""


@pytest.mark.parametrize("unit", ["processors", "GPUs"])
def test_a_job_cancelled_while_pending_is_dropped_though_it_has_a_start(unit: str) -> None:
    _, t, q = parse_sacct(SACCT_2205.splitlines(), unit=unit)
    assert q.records == 3
    # Not kept as a 0 s job that waited until its cancel, nor (GPUs) as one without GPUs.
    assert dict(q.dropped) == {"cancelled before it started (no AllocTRES)": 2}
    assert (t.id, t.wait, t.run) == ([9], [0], [8])
    assert t.procs == ([128] if unit == "processors" else [32])


def test_a_job_never_allocated_in_another_state_is_dropped_with_it() -> None:
    text = SACCT_2205.replace("|CANCELLED by 0\n5|", "|NODE_FAIL\n5|")
    _, t, q = parse_sacct(text.splitlines())
    assert dict(q.dropped) == {
        "never allocated (NODE_FAIL, no AllocTRES)": 1,
        "cancelled before it started (no AllocTRES)": 1,
    }
    assert t.id == [9]


def test_without_alloc_tres_a_cancel_at_start_is_kept_and_noted() -> None:
    # The same records without AllocTRES (and so without the way to tell): kept, and said so.
    lines = [
        "|".join(f for k, f in enumerate(ln.split("|")) if k != 10)
        for ln in SACCT_2205.splitlines()
    ]
    assert "AllocTRES" not in lines[0]
    _, t, q = parse_sacct(lines)
    assert t.id == [9, 10, 5] and not q.dropped
    assert t.run == [8, 0, 0]
    assert any(
        n.startswith("2 CANCELLED jobs with Start = End kept") and "add AllocTRES" in n
        for n in q.notes
    )
