"""The ElasticFlow evaluation: the trace reader (on the real files and on bad ones), a quick
run through the CLI with the table's invariants and its determinism, a hand-made trace
whose answer is known, and the runner's invariants on random small traces."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bursar.broker import elastic
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.cli.main import main
from bursar.sim.elastic.runner import (
    SPEED_MODELS,
    VARIANTS,
    Cluster,
    engine_resizes,
    intent_for,
    run,
)
from bursar.sim.elastic.trace import TraceError, load_curves, load_jobs, time_on

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)
ITP = TRACES / "elasticflow-itp"

HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration"


@pytest.fixture(scope="module")
def itp() -> Path:
    if not (ITP / "195job.csv.gz").is_file():
        pytest.skip(f"no ElasticFlow traces at {ITP} (set BURSAR_TRACES_DIR)")
    return ITP


def _linear(tmp: Path, points: str = "1,2,4,8") -> Path:
    """A throughput folder with one model, ``lin``, that scales linearly (1 it/s a GPU)."""
    d = tmp / "throughputs"
    d.mkdir()
    counts = points.split(",")
    (d / "lin.csv").write_text(
        f"global_batch_size,{points}\n64," + ",".join(f"{float(g)}" for g in counts) + "\n"
    )
    return d


def _jobs(tmp: Path, rows: list[str]) -> Path:
    p = tmp / "jobs.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    return p


# ------------------------------------------------------------------ the reader


def test_reader_on_the_real_files(itp: Path) -> None:
    curves = load_curves(itp / "throughputs_A100")
    jobs = load_jobs(itp / "195job.csv.gz")
    # The file has 195 job lines (its last line has no newline).
    assert len(jobs) == 195
    first = jobs[0]
    assert (first.job_id, first.submit, first.iterations, first.model) == (
        "bdd640fb-0667-1ad1-1c80-317fa3b1799d",
        3715485.0,
        3249.0,
        "deepspeech2",
    )
    assert (first.deadline, first.batch_size, first.num_gpu, first.line) == (3716178.0, 32, 1, 2)
    assert all(a.submit <= b.submit for a, b in itertools.pairwise(jobs))
    for j in jobs:
        curve = curves.for_job(j, "195job")
        gpus = [g for g, _ in curve]
        assert gpus == sorted(set(gpus)) and gpus[0] == 1
        assert all(t > 0 for _, t in curve)
    # deepspeech2 at batch 32 is measured up to 32 GPUs: 64 is blank in the file.
    c = curves.curve("deepspeech2", 32)
    assert c is not None and c[-1][0] == 32
    assert time_on(c, 3249.0, 1) == pytest.approx(3249.0 / c[0][1])
    assert math.isinf(time_on(c, 3249.0, 64))
    big = load_jobs(itp / "cluster05.csv.gz")
    assert len(big) == 3629 and max(j.num_gpu for j in big) <= 8
    for j in big:
        curves.for_job(j, "cluster05")


def test_a_bad_line_names_the_file_and_the_line(tmp_path: Path) -> None:
    p = _jobs(tmp_path, ["a,0,100,lin,50,64,1,10", "b,5,lots,lin,60,64,1,10"])
    with pytest.raises(TraceError, match=r"jobs\.csv:3: num_iteration is not a number"):
        load_jobs(p)
    p = _jobs(tmp_path, ["a,10,100,lin,5,64,1,10"])
    with pytest.raises(TraceError, match=r"jobs\.csv:2: deadline 5 is not after"):
        load_jobs(p)
    p = _jobs(tmp_path, ["a,0,100,lin,50,64,1"])
    with pytest.raises(TraceError, match=r"jobs\.csv:2: 7 fields, the header has 8"):
        load_jobs(p)
    bad = tmp_path / "t"
    bad.mkdir()
    (bad / "m.csv").write_text("global_batch_size,1,2\n64,1.0,fast\n")
    with pytest.raises(TraceError, match=r"m\.csv:2: throughput on 2 GPUs is not a number"):
        load_curves(bad)


def test_a_job_without_a_curve_names_its_line(tmp_path: Path) -> None:
    curves = load_curves(_linear(tmp_path))
    jobs = load_jobs(_jobs(tmp_path, ["a,0,100,lin,500,64,1,10", "b,1,100,lin,500,128,1,10"]))
    with pytest.raises(TraceError, match=r"jobs\.csv:3: job b: no throughput for model 'lin' at"):
        run(jobs, curves, "dmug", Cluster(1, 8), trace_name=str(tmp_path / "jobs.csv"))


# ------------------------------------------------------------------ the CLI


def _quick(out: Path) -> dict:
    r = CliRunner().invoke(main, ["sim", "elastic", "--quick", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads((out / "elastic.json").read_text())


def test_quick_run_through_the_cli(itp: Path, tmp_path: Path) -> None:
    a = _quick(tmp_path / "a")
    runs = a["runs"]
    assert {r["trace"] for r in runs} == {"195job", "cluster05"}
    assert {r["policy"] for r in runs} == {v.name for v in VARIANTS}
    for r in runs:
        assert r["met"] + r["late"] + r["refused"] + r["rejected"] + r["killed"] == r["jobs"]
        for k in ("met_share", "value_share", "utilisation", "met_gpu_share"):
            assert 0.0 <= r[k] <= 1.0, (r["policy"], k, r[k])
        # Every event was checked, and every lease's size against its range.
        assert r["events"] > 0 and r["invariant_checks"] >= 1  # sampled, and at the end
        assert r["killed"] == 0 and r["speed_model"] == "measured"
        assert r["lease_range_checks"] > 0
        assert r["max_gpus_held_by_a_lease"] <= 64
    by = {(r["trace"], r["policy"]): r for r in runs}
    for t in ("195job", "cluster05"):
        # No degrade modes in the traces: the ablation makes the same decisions.
        assert by[t, "dmug-no-degrade"]["sha256"] == by[t, "dmug"]["sha256"]
        assert by[t, "dmug-no-elastic"]["max_gpus_held_by_a_lease"] == 1.0
    assert (tmp_path / "a" / "elastic.png").stat().st_size > 0
    md = (tmp_path / "a" / "elastic.md").read_text()
    assert md.startswith("| trace | cluster | policy |") and "dmug-no-risk" in md
    # Same inputs, same numbers and hashes.
    b = _quick(tmp_path / "b")
    strip = [{k: v for k, v in r.items() if k != "wall_s"} for r in runs]
    assert strip == [{k: v for k, v in r.items() if k != "wall_s"} for r in b["runs"]]


def test_cli_refuses_a_missing_trace(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["sim", "elastic", "--trace", str(tmp_path / "nope.csv")])
    assert r.exit_code != 0 and "no trace at" in r.output


# ------------------------------------------------------------------ a known answer


ELASTIC = engine_resizes()


@pytest.mark.skipif(not ELASTIC, reason="this build's engine has no elastic pass yet")
def test_two_jobs_one_tight_deadline(tmp_path: Path) -> None:
    """8 GPUs, work that scales linearly. ``tight`` needs 1000 iterations in 300 s (4 GPUs
    or more), ``loose`` 1000 in 3000 s (1 GPU is enough). On the trace's fixed sizes (1
    GPU each) only loose meets its deadline; elastic under dmug grows tight and meets
    both; with max = min, tight is refused at admission."""
    curves = load_curves(_linear(tmp_path))
    jobs = load_jobs(
        _jobs(tmp_path, ["tight,0,1000,lin,300,64,1,1000", "loose,0,1000,lin,3000,64,1,1000"])
    )
    cluster = Cluster(1, 8)
    state = {
        v: {o["job_id"]: o["state"] for o in run(jobs, curves, v, cluster).outcomes}
        for v in ("dmug", "fixed", "dmug-no-elastic")
    }
    assert state["fixed"] == {"tight": "late", "loose": "met"}
    assert state["dmug"] == {"tight": "met", "loose": "met"}
    assert state["dmug-no-elastic"] == {"tight": "refused", "loose": "met"}
    r = run(jobs, curves, "dmug", cluster)
    assert r.metrics["met_share"] == 1.0 and r.metrics["resized"] > 0
    assert 4 <= r.outcomes[0]["peak_gpus"] <= 8


# ------------------------------------------------------------------ invariants


@st.composite
def _traces(draw: st.DrawFn) -> list[str]:
    rows = []
    t = 0
    for k in range(draw(st.integers(1, 6))):
        t += draw(st.integers(0, 200))
        work = draw(st.integers(1, 4000))
        slack = draw(st.integers(1, 3000))
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        rows.append(f"j{k},{t},{work},lin,{t + slack},64,{gpus},1")
    return rows


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_traces(), variant=st.sampled_from([v.name for v in VARIANTS]),
       nodes=st.integers(1, 2), term=st.sampled_from([60.0, 3600.0]),
       model=st.sampled_from(SPEED_MODELS), points=st.sampled_from(["1,2,4,8", "1,2,3,8"]))  # fmt: skip
def test_runs_keep_their_invariants(
    tmp_path_factory: pytest.TempPathFactory, rows: list[str], variant: str, nodes: int,
    term: float, model: str, points: str,
) -> None:  # fmt: skip
    """Any small trace, any policy: the run ends with every job in exactly one end state
    (the runner checks the engine's invariants, the lease ranges and the holdings at every
    event and raises otherwise); a job counted as met finished by its deadline, and no
    job held more than its max."""
    tmp = tmp_path_factory.mktemp("t")
    curves = load_curves(_linear(tmp, points))
    jobs = load_jobs(_jobs(tmp, rows))
    cluster = Cluster(nodes, 4)
    r = run(jobs, curves, variant, cluster, lease_term_s=term, speed_model=model, check="every")
    by_id = {j.job_id: j for j in jobs}
    for o in r.outcomes:
        assert o["state"] in ("met", "late", "refused", "rejected", "killed")
        j = by_id[o["job_id"]]
        it = intent_for(j, curves.for_job(j, "t"), cluster, speed_model=model)
        if variant == "fixed":
            assert o["peak_gpus"] <= min(j.num_gpu, cluster.gpus)
        elif o["peak_gpus"] > 0:
            # Within [min, max] and on a size the intent allows (the runner also checks
            # every size it follows, and raises otherwise).
            assert it.min["gpu"] <= o["peak_gpus"] <= it.max["gpu"]
            assert elastic.size_ok(it, o["peak_gpus"])
        if o["state"] == "met":
            assert o["finish"] <= j.deadline
    assert r.metrics["met"] == sum(o["state"] == "met" for o in r.outcomes)
    # Every event checked (after the last, once more), every renewal granted: no job killed.
    assert r.metrics["invariant_checks"] == r.metrics["events"] + 1
    assert r.metrics["killed"] == r.metrics["renew_refused"] == 0


def test_a_journaled_run_audits_clean(tmp_path: Path) -> None:
    """With a state dir every event is journaled: ``bursar journal audit`` re-derives each
    decision, and the run's hash is the journal's canonical form after its first line
    (the specs), so two policies that decide alike hash alike."""
    curves = load_curves(_linear(tmp_path))
    jobs = load_jobs(
        _jobs(
            tmp_path,
            ["a,0,1000,lin,300,64,1,1", "b,10,900,lin,2000,64,2,1", "c,20,50,lin,30,64,1,1"],
        )
    )
    state = tmp_path / "state"
    r = run(jobs, curves, "dmug", Cluster(1, 8), lease_term_s=120.0, state_dir=state)
    assert r.journal_sha256 is not None
    audit = CliRunner().invoke(main, ["journal", "audit", "--state-dir", str(state)])
    assert audit.exit_code == 0, audit.output
    with Journal.open(state / JOURNAL_FILENAME) as j:
        lines = list(j.canonical_lines())
        assert j.sha256() == r.journal_sha256
    assert hashlib.sha256("".join(lines[1:]).encode()).hexdigest() == r.sha256
    with pytest.raises(ValueError, match="exists"):
        run(jobs, curves, "dmug", Cluster(1, 8), state_dir=state)


def test_cli_options_choose_the_policies_and_the_cluster(itp: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    args = ["sim", "elastic", "--quick", "--trace", "195job", "--policy", "fixed", "--policy",
            "dmug", "--nodes", "2", "--gpus-per-node", "4", "--out", str(out)]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    body = json.loads((out / "elastic.json").read_text())
    assert [(x["policy"], x["cluster"]) for x in body["runs"]] == [
        ("dmug", "2x4"),
        ("fixed", "2x4"),
    ]
    assert body["conditions"]["traces"]["195job"] == {
        "file": "195job.csv.gz", "jobs": 30, "cluster": "2x4", "gpus": 8,
    }  # fmt: skip
    # A job asking for more than the cluster is held at the cluster's size.
    assert all(x["max_gpus_held_by_a_lease"] <= 8 for x in body["runs"])


# ------------------------------------------------------------------ sizes and streaming


def _own_trace(tmp: Path) -> Path:
    """A trace of two jobs under a name ElasticFlow gives no cluster for, with its
    linear throughput folder beside it (where the CLI looks: throughputs_A100/)."""
    d = tmp / "traces"
    d.mkdir()
    _linear(d).rename(d / "throughputs_A100")
    return _jobs(d, ["a,0,1000,lin,3000,64,1,10", "b,0,1000,lin,300,64,1,10"])


def test_a_trace_of_unknown_size_needs_one_given(tmp_path: Path) -> None:
    trace = _own_trace(tmp_path)
    out = tmp_path / "o"
    base = ["sim", "elastic", "--trace", str(trace), "--policy", "dmug", "--out", str(out)]
    r = CliRunner().invoke(main, base)
    assert r.exit_code == 2 and not out.exists()
    assert "no cluster size for trace 'jobs'" in r.output
    assert "--cluster jobs=NODESxGPUS" in r.output and "--nodes N" in r.output

    r = CliRunner().invoke(main, [*base, "--cluster", "jobs=1x8"])
    assert r.exit_code == 0, r.output
    body = json.loads((out / "elastic.json").read_text())
    assert body["complete"] and body["conditions"]["traces"]["jobs"]["cluster"] == "1x8"
    assert [x["cluster"] for x in body["runs"]] == ["1x8"]

    # --cluster beats --nodes for its trace; bad forms and traces not run are refused.
    r = CliRunner().invoke(main, [*base, "--cluster", "jobs=2x4", "--nodes", "9"])
    assert json.loads((out / "elastic.json").read_text())["runs"][0]["cluster"] == "2x4"
    for bad, said in (
        ("jobs=8", "not NODESxGPUS"),
        ("jobs=0x8", "at least 1"),
        ("195job=16x8", "not a trace of this run"),
        ("64x8", "not TRACE=NODESxGPUS"),
    ):
        r = CliRunner().invoke(main, [*base, "--cluster", bad])
        assert r.exit_code == 2 and said in r.output, (bad, r.output)


def test_each_run_is_written_as_it_finishes(itp: Path, tmp_path: Path) -> None:
    """Stop the comparison after its first run (as a time limit would): that run's row is
    in elastic.jsonl, elastic.json (marked incomplete) and elastic.md already."""
    out = tmp_path / "o"
    lines = out / "elastic.jsonl"
    cmd = [sys.executable, "-m", "bursar.cli.main", "sim", "elastic", "--trace", "195job",
           "--out", str(out)]  # fmt: skip
    env = {**os.environ, "BURSAR_TRACES_DIR": str(TRACES)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (lines.is_file() and lines.read_text().count("\n") >= 1):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no run finished in 2 minutes"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    first = json.loads(lines.read_text().splitlines()[0])
    assert first["trace"] == "195job" and first["policy"] == VARIANTS[0].name
    assert first["jobs"] == 195 and len(first["sha256"]) == 64
    body = json.loads((out / "elastic.json").read_text())
    assert body["complete"] is False and 1 <= len(body["runs"]) < len(VARIANTS)
    assert body["runs"][0] == first
    assert "| 195job | 16x8 | dmug |" in (out / "elastic.md").read_text()
    assert not (out / "elastic.png").exists()  # drawn once every run is in
