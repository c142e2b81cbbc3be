"""Real traces under every policy with strict invariants, determinism of metrics and
manifests, and the command line (bursar replay, bursar matrix)."""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.cli.main import main
from bursar.sim.replay.policies import POLICIES
from bursar.sim.replay.run import RunResult, replay_trace

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)
KTH = "pwa-kth-sp2/KTH-SP2-1996-2.1-cln.swf.gz"
LUBLIN = "lublin-synthetic/lublin_256.swf"
LARGE = (
    "pwa-ctc-sp2/CTC-SP2-1996-3.1-cln.swf.gz",
    "pwa-sdsc-sp2/SDSC-SP2-1998-4.2-cln.swf.gz",
    "pwa-hpc2n/HPC2N-2002-2.2-cln.swf.gz",
)
LEAN = [p for p in POLICIES if not p.startswith("bursar")]
BURSAR_PREFIX = 3000
"""The bursar policy runs the full broker engine per decision (2-4k jobs/s here): the
suite replays the small traces fully and this many jobs of each large one (HPC2N in full
takes about a minute); `make matrix` replays every trace fully."""


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"no traces at {TRACES} (set BURSAR_TRACES_DIR)")
    return TRACES


@cache
def _run(path: Path, policy: str, limit: int | None = None) -> RunResult:
    """One strict replay per (trace, policy) for the whole module: several tests read it."""
    return replay_trace(path, policy, strict=True, limit=limit)


def _check(m: dict, jobs: int) -> None:
    assert m["jobs"] == jobs
    assert m["strict"] is True
    assert 0 < m["utilization"] <= 1
    assert m["mean_wait_s"] >= 0 and m["p95_wait_s"] >= m["p50_wait_s"] >= 0
    assert m["max_wait_s"] >= m["p95_wait_s"]
    assert m["mean_bsld"] >= 1 and m["p95_bsld"] >= 1
    assert sum(c["jobs"] for c in m["campaigns"].values()) == jobs
    assert abs(sum(c["share"] for c in m["campaigns"].values()) - 1) < 1e-9


@pytest.mark.parametrize("trace", [KTH, LUBLIN])
@pytest.mark.parametrize("policy", LEAN)
def test_small_traces_under_every_lean_policy(traces: Path, trace: str, policy: str) -> None:
    r = _run(traces / trace, policy)
    _check(r.metrics, len(r.workload))
    # Every policy runs the same jobs: the work done (and so the span's lower bound) is equal.
    assert r.metrics["jobs"] == (28475 if trace == KTH else 10000)


@pytest.mark.slow
@pytest.mark.parametrize("trace", [KTH, LUBLIN])
def test_small_traces_under_the_bursar_policy(traces: Path, trace: str) -> None:
    r = replay_trace(traces / trace, "bursar", strict=True)
    _check(r.metrics, 28475 if trace == KTH else 10000)


def test_policies_rank_as_expected_on_kth(traces: Path) -> None:
    # Backfilling beats strict FIFO on waiting by a wide margin on a real trace; all
    # policies do the same work, so utilisation differs only through the makespan.
    m = {p: _run(traces / KTH, p).metrics for p in ("fifo", "easy", "conservative")}
    assert m["easy"]["mean_wait_s"] < m["fifo"]["mean_wait_s"] / 5
    assert m["conservative"]["mean_wait_s"] < m["fifo"]["mean_wait_s"] / 5
    assert m["easy"]["utilization"] >= m["fifo"]["utilization"]


def test_jobs_past_their_request_hold_to_their_runtime_on_a_real_trace(traces: Path) -> None:
    # KTH has jobs that ran past their requested time: every policy holds each job for
    # its recorded runtime (nothing is cut), and the quality report counts them.
    # Under the broker a job whose renewal is refused (it would push a reservation later)
    # is killed at its lease's expiry, before its recorded end; every other job holds to it.
    runs = [_run(traces / KTH, p) for p in LEAN] + [_run(traces / KTH, "bursar", 2000)]
    for k, r in enumerate(runs):
        w, s, m = r.workload, r.schedule, r.metrics
        killed = set(s.killed)
        assert all(s.end[j] == s.start[j] + w.hold[j] for j in range(len(w)) if j not in killed)
        assert all(s.end[j] < s.start[j] + w.hold[j] for j in killed)
        past = sum(1 for j in range(len(w)) if w.hold[j] > w.duration[j])
        assert past > 0 and m["ran_past_request"] == past
        assert m["killed"] == len(killed) and (m["killed_unit_seconds"] > 0) == bool(killed)
        if k < len(LEAN):
            assert not killed
    note = "475 jobs ran past request (held to its recorded runtime)"
    assert note in runs[0].metrics["quality"]["notes"]


def test_same_input_same_metrics_and_manifest(traces: Path) -> None:
    a = _run(traces / LUBLIN, "conservative")
    b = replay_trace(traces / LUBLIN, "conservative")
    assert a.metrics == b.metrics
    assert a.manifest == b.manifest
    assert a.schedule.start == b.schedule.start and a.schedule.end == b.schedule.end
    c = _run(traces / LUBLIN, "easy")
    assert c.manifest["input"] == a.manifest["input"]
    assert c.manifest["outputs"] != a.manifest["outputs"]
    d = replay_trace(traces / LUBLIN, "conservative", tau_s=60)
    assert d.manifest["config_sha256"] != a.manifest["config_sha256"]


def test_bursar_policy_is_deterministic(traces: Path) -> None:
    a = replay_trace(traces / KTH, "bursar", limit=500)
    b = replay_trace(traces / KTH, "bursar", limit=500)
    assert a.manifest == b.manifest


@pytest.mark.slow
@pytest.mark.parametrize("trace", LARGE)
@pytest.mark.parametrize("policy", LEAN)
def test_large_traces_under_every_lean_policy(traces: Path, trace: str, policy: str) -> None:
    r = replay_trace(traces / trace, policy, strict=True)
    expected = {LARGE[0]: 77222, LARGE[1]: 54044, LARGE[2]: 202870}[trace]
    _check(r.metrics, expected)


@pytest.mark.slow
@pytest.mark.parametrize("trace", LARGE)
def test_large_traces_under_the_bursar_policy(traces: Path, trace: str) -> None:
    r = replay_trace(traces / trace, "bursar", strict=True, limit=BURSAR_PREFIX)
    _check(r.metrics, BURSAR_PREFIX)


def test_cli_replay_writes_metrics_and_manifest(traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = CliRunner().invoke(
        main,
        [
            "replay",
            "--trace",
            str(traces / LUBLIN),
            "--policy",
            "easy",
            "--out",
            str(out),
            "--bsld-tau",
            "60",
        ],
    )
    assert res.exit_code == 0, res.output
    m = json.loads((out / "metrics.json").read_text())
    for key in ("jobs", "mean_wait_s", "p95_wait_s", "mean_bsld", "p95_bsld", "utilization"):
        assert key in m
    assert m["makespan_s"] > 0 and m["bsld_tau_s"] == 60 and m["capacity"] == 256
    man = m["manifest"]
    assert man["policy"] == "easy" and man["seed"] == 0
    assert man == json.loads((out / "manifest.json").read_text())
    assert len((out / "schedule.csv").read_text().splitlines()) == 10001


def test_cli_replay_capacity_override_and_errors(traces: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(
        main,
        [
            "replay",
            "--trace",
            str(traces / LUBLIN),
            "--policy",
            "fifo",
            "--capacity",
            "512",
            "--out",
            str(tmp_path / "a"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["capacity"] == 512
    bad = tmp_path / "bad.swf"
    bad.write_text("; MaxProcs: 4\n1 2 3\n")
    res = runner.invoke(main, ["replay", "--trace", str(bad), "--policy", "fifo"])
    assert res.exit_code != 0
    assert "bad.swf:2: expected 18 whitespace-separated numbers" in res.output
    res = runner.invoke(main, ["replay", "--trace", str(bad), "--policy", "lottery"])
    assert res.exit_code == 2 and "fifo" in res.output
    philly = traces / "philly-derived-rfold" / "philly_trace.csv"
    res = runner.invoke(main, ["replay", "--trace", str(philly), "--policy", "fifo"])
    assert res.exit_code != 0 and "pass --capacity N" in res.output


def test_cli_matrix(traces: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main,
        [
            "matrix",
            "--trace",
            str(traces / LUBLIN),
            "--trace",
            str(traces / KTH),
            "--policy",
            "fifo",
            "--policy",
            "easy",
            "--policy",
            "bursar",
            "--bursar-limit",
            "300",
            "--out",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 0, res.output
    md = (tmp_path / "replay-matrix.md").read_text()
    assert "## lublin_256" in md and "## KTH-SP2-1996-2.1" in md
    assert "| bursar (first 300 jobs) |" in md
    assert "<table>" in (tmp_path / "replay-matrix.html").read_text()
    assert (tmp_path / "replay-matrix.png").stat().st_size > 1000
    cells = json.loads((tmp_path / "replay-matrix.json").read_text())
    assert len(cells) == 6


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["easy", "bursar"])
def test_gpu_traces_replay(traces: Path, policy: str) -> None:
    ali = replay_trace(traces / "alibaba-gpu-v2023" / "openb_pod_list_default.csv", policy)
    assert ali.metrics["unit"] == "GPUs" and ali.metrics["capacity"] == 6212
    _check(ali.metrics, ali.metrics["quality"]["kept"])
    philly = traces / "philly-derived-rfold" / "philly_trace.csv"
    r = replay_trace(philly, policy, capacity=2490, limit=None if policy == "easy" else 5000)
    _check(r.metrics, 111549 if policy == "easy" else 5000)
