"""Trace ingestion: SWF plain and gzip, header fields, the default filter and its quality
report, the GPU traces, replay configs, and clear errors for bad input."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from bursar.broker.errors import ConfigError
from bursar.sim.replay.ingest import load_trace
from bursar.sim.replay.mapping import ReplayConfig, load_replay_config, to_workload
from bursar.sim.replay.swf import read_swf
from bursar.sim.replay.table import TraceError

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)

HEADER = """\
; Version: 2.2
; Computer: test machine
; Acknowledge: nobody
; UnixStartTime: 835823160
; MaxNodes: 338 (batch partition; 512 total)
; MaxProcs: 64
; Note: a remark: with a colon
"""
JOBS = """\
    1      0     5    100    4  90  -1    4   200  -1 1 3 1 -1 1 1 -1 -1
    2     10    -1     50    2  -1  -1    2    -1  -1 1 3 1 -1 1 1 -1 -1
    3     20     0     -1   -1  -1  -1   -1    -1  -1 5 4 2 -1 1 1 -1 -1
    4     30     2     40   -1  -1  -1    8   100  -1 1 4 2 -1 1 1 -1 -1
    5     40     1    500    2  -1  -1    2   100  -1 0 5 2 -1 1 1 -1 -1
    6     50     1     10  100  -1  -1  100    10  -1 1 6 3 -1 1 1 -1 -1
    7     60     1      0    0  -1  -1    0    10  -1 1 6 3 -1 1 1 -1 -1
"""


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"no traces at {TRACES} (set BURSAR_TRACES_DIR)")
    return TRACES


def _write(tmp_path: Path, text: str, name: str = "t.swf", gz: bool = False) -> Path:
    p = tmp_path / (name + (".gz" if gz else ""))
    if gz:
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


def test_header_fields(tmp_path: Path) -> None:
    header, table, quality = read_swf(_write(tmp_path, HEADER + JOBS))
    assert header.max_procs == 64
    assert header.max_nodes == 338  # the remark after the number is ignored
    assert header.unix_start == 835823160
    assert header.capacity == 64
    assert header.fields["Computer"] == "test machine"
    assert header.fields["Note"] == "a remark: with a colon"
    assert quality.records == 7 and len(table) == 7


def test_gzip_and_plain_read_the_same(tmp_path: Path) -> None:
    plain = load_trace(_write(tmp_path, HEADER + JOBS))
    zipped = load_trace(_write(tmp_path, HEADER + JOBS, name="z.swf", gz=True))
    assert plain.jobs == zipped.jobs
    assert plain.header == zipped.header


def test_default_filter_and_quality_report(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path, HEADER + JOBS))
    # Kept: 1, 4 (allocated unknown, requested 8), 5 (a failed job still ran), 6.
    assert list(t.jobs.id) == [1, 4, 5, 6]
    assert t.jobs.size(1) == 8
    q = t.quality.to_dict()
    assert q["records"] == 7 and q["kept"] == 4
    assert q["dropped"] == {
        "wait < 0 (unknown)": 1,
        "run < 0 (unknown)": 1,
        "procs <= 0 (allocated and requested unknown)": 1,
    }


def test_mapping_keeps_overruns_and_drops_jobs_larger_than_the_machine(tmp_path: Path) -> None:
    t = load_trace(_write(tmp_path, HEADER + JOBS))
    w = to_workload(t, 64, "user")
    assert list(w.job_id) == [1, 4, 5]  # job 6 needs 100 processors of 64
    assert list(w.duration) == [200, 100, 100]  # requested time
    assert list(w.hold) == [100, 40, 500]  # job 5 ran 500 s of its 100: it still ran them
    assert w.campaign_names == ["user-3", "user-4", "user-5"]
    assert t.quality.dropped["larger than the capacity (64)"] == 1
    assert t.quality.kept == 3
    assert "1 jobs ran past request (held to its recorded runtime)" in t.quality.notes
    assert to_workload(t, 64, "group").campaign_names == ["group-1", "group-2"]
    assert to_workload(t, 64, "one").campaign_names == ["all"]


def test_a_field_absent_from_the_whole_trace_is_not_filtered_on(tmp_path: Path) -> None:
    # The synthetic Lublin traces have no wait (-1 everywhere): nothing is dropped for it.
    text = "; MaxNodes: 8\n1 0 -1 10 2 -1 -1 -1 -1 -1 1 -1 -1 -1 0 -1 -1 -1\n"
    t = load_trace(_write(tmp_path, text))
    assert len(t.jobs) == 1
    assert t.quality.absent == ["wait"]
    assert t.header.capacity == 8  # MaxNodes when there is no MaxProcs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER + "1 0 0 10 2\n", "t.swf:8: expected 18 whitespace-separated numbers"),
        (HEADER + JOBS.replace(" 100    4", " 1x0    4"), "t.swf:8: not a number"),
        ("; MaxProcs: lots\n" + JOBS, "header field MaxProcs is 'lots'"),
        (HEADER, "no job lines"),
    ],
)
def test_bad_swf_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        load_trace(_write(tmp_path, text))


def test_missing_and_unknown_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "nope.swf")
    other = tmp_path / "jobs.txt"
    other.write_text("x")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        load_trace(other)
    broken = tmp_path / "broken.swf.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceError, match=r"broken\.swf\.gz: cannot read it as SWF"):
        load_trace(broken)


@pytest.mark.slow
def test_real_swf_traces_keep_the_documented_counts(traces: Path) -> None:
    ctc = load_trace(traces / "pwa-ctc-sp2" / "CTC-SP2-1996-3.1-cln.swf.gz")
    assert (len(ctc.jobs), ctc.header.capacity, ctc.header.unix_start) == (77222, 338, 835823160)
    sdsc = load_trace(traces / "pwa-sdsc-sp2" / "SDSC-SP2-1998-4.2-cln.swf.gz")
    assert len(sdsc.jobs) == 54044 and sdsc.header.capacity == 128
    assert sdsc.quality.dropped == {"run < 0 (unknown)": 5671}
    lublin = load_trace(traces / "lublin-synthetic" / "lublin_256.swf")
    assert len(lublin.jobs) == 10000 and lublin.header.capacity == 256


@pytest.mark.slow
def test_hpc2n_keeps_202870_jobs(traces: Path) -> None:
    t = load_trace(traces / "pwa-hpc2n" / "HPC2N-2002-2.2-cln.swf.gz")
    assert len(t.jobs) == 202870
    assert t.quality.dropped == {"wait < 0 (unknown)": 1}
    assert t.header.max_procs == 240


def test_gpu_traces(traces: Path) -> None:
    ali = load_trace(traces / "alibaba-gpu-v2023" / "openb_pod_list_default.csv")
    assert ali.jobs.unit == "GPUs"
    assert ali.header.capacity == 6212  # GPUs in openb_node_list_gpu_node.csv
    assert ali.quality.records == 8152
    assert ali.quality.kept + sum(ali.quality.dropped.values()) == 8152
    assert all(p > 0 for p in ali.jobs.procs)
    philly = load_trace(traces / "philly-derived-rfold" / "philly_trace.csv")
    assert len(philly.jobs) == 111549
    assert philly.header.capacity is None  # the replay asks for --capacity
    assert "wait" in philly.quality.absent


def test_bad_csv_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "openb_pod_list_x.csv"
    p.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time\n"
        "a,1,1,1,1000,,LS,Running,0,10,0\n"
        "b,1,1,one,1000,,LS,Running,0,10,0\n"
    )
    with pytest.raises(TraceError, match=r"openb_pod_list_x.csv:3: column 'num_gpu'"):
        load_trace(p)
    q = tmp_path / "philly_x.csv"
    q.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match=r"philly_x\.csv:1: not a Philly"):
        load_trace(q)


def test_replay_config(tmp_path: Path) -> None:
    p = tmp_path / "replay.toml"
    p.write_text(
        'campaigns = "group"\nhol_patience_s = 60\n'
        '[envelope]\nsustained = 16\nbucket = "unlimited"\n'
        '[campaign."group-2"]\nguarantee = 8\nclass = "interactive"\n'
    )
    c = load_replay_config(p)
    assert c.campaigns == "group" and c.hol_patience_s == 60
    assert c.default.sustained == 16 and c.default.bucket is None
    assert c.overrides["group-2"].guarantee == 8
    assert c.overrides["group-2"].sustained == 16  # inherits the default envelope
    assert c.overrides["group-2"].lease_class == "interactive"


@pytest.mark.parametrize(
    ("text", "key", "allowed"),
    [
        ('campaigns = "team"', "campaigns", "user, group, one"),
        ("[envelope]\nguarante = 1", "envelope.guarante", "allowed: bucket, burst"),
        ('[envelope]\nclass = "gold"', "envelope.class", "interactive, batch, opportunistic"),
        ("[envelope]\nburst = -1", "envelope.burst", ">= 0"),
        ("colour = 1", "colour", "allowed: campaign, campaigns"),
        ("renew_s = 0.5", "renew_s", "at least 1 s"),
        ('renew_s = "soon"', "renew_s", '"remaining" or a finite number of seconds'),
        ('renewals_push_reservations = "yes"', "renewals_push_reservations", "true, false"),
    ],
)
def test_replay_config_errors_name_file_key_and_allowed_values(
    tmp_path: Path, text: str, key: str, allowed: str
) -> None:
    p = tmp_path / "replay.toml"
    p.write_text(text + "\n")
    with pytest.raises(ConfigError) as e:
        load_replay_config(p)
    assert e.value.key == key
    assert str(p) in str(e.value) and allowed in str(e.value)


def test_replay_config_renew_s_is_the_rest_of_the_runtime_unless_given(tmp_path: Path) -> None:
    p = tmp_path / "replay.toml"
    p.write_text('campaigns = "user"\n')
    assert load_replay_config(p).renew_s is None
    p.write_text('renew_s = "remaining"\n')
    assert load_replay_config(p).renew_s is None
    p.write_text("renew_s = 60\n")
    config = load_replay_config(p)
    assert config.renew_s == 60.0 and config.to_dict()["renew_s"] == 60.0


def test_the_reservation_checks_config_gives_the_broker_easys_assumptions() -> None:
    path = Path(__file__).resolve().parent.parent.parent / "examples" / "replay-easy-check.toml"
    config = load_replay_config(path)
    assert config.renew_s == 1.0 and config.renewals_push_reservations
    assert config.campaigns == "user" and config.default == ReplayConfig().default


def test_replay_config_may_let_renewals_push_reservations(tmp_path: Path) -> None:
    p = tmp_path / "replay.toml"
    p.write_text('campaigns = "user"\n')
    off = load_replay_config(p)
    # Off, the config digests as configs from before the key existed.
    assert not off.renewals_push_reservations
    assert "renewals_push_reservations" not in off.to_dict()
    p.write_text("renewals_push_reservations = true\n")
    on = load_replay_config(p)
    assert on.renewals_push_reservations and on.digest() != off.digest()
