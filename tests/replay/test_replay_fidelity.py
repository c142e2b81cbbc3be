"""The replay's fidelity gate (hand-made traces whose grade is known, KTH-SP2, the
command), the console quality report, ``bursar replay --format``, and the ljf and
fairshare policies on schedules worked out by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bursar.cli.main import main
from bursar.sim.replay.fidelity import (
    BASELINES,
    GRADES,
    THRESHOLDS,
    Measures,
    fidelity,
    grade,
    ks_distance,
    pearson,
    spearman,
)
from bursar.sim.replay.ingest import load_trace
from bursar.sim.replay.kernel import replay
from bursar.sim.replay.mapping import ReplayConfig, Workload, to_workload
from bursar.sim.replay.policies import make_policy
from bursar.sim.replay.policies.fairshare import FairShare
from bursar.sim.replay.run import replay_trace
from bursar.sim.replay.table import TraceError

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)
KTH = "pwa-kth-sp2/KTH-SP2-1996-2.1-cln.swf.gz"
LUBLIN = "lublin-synthetic/lublin_256.swf"


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"no traces at {TRACES} (set BURSAR_TRACES_DIR)")
    return TRACES


def swf(path: Path, rows: list[tuple[int, ...]], max_procs: int = 10) -> Path:
    """An SWF file: rows of (submit, wait, run, procs, requested time[, user])."""
    lines = [f"; MaxProcs: {max_procs}", "; UnixStartTime: 0"]
    for i, row in enumerate(rows, 1):
        submit, wait, run, procs, req = row[:5]
        user = row[5] if len(row) > 5 else 1
        lines.append(
            f"{i} {submit} {wait} {run} {procs} -1 -1 {procs} {req} -1 1 {user} 1 -1 1 1 -1 -1"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


# A whole-machine job at a time, so FIFO, EASY and conservative all run them in submit
# order back to back; the waits recorded are exactly that schedule's.
FIFO_RECORD = [
    (0, 0, 100, 10, 100),
    (10, 90, 50, 10, 50),
    (20, 130, 30, 10, 30),
    (30, 150, 40, 6, 40),
    (500, 0, 20, 4, 20),
    (510, 10, 10, 10, 10),
]


def test_a_replay_identical_to_the_record_grades_high(tmp_path: Path) -> None:
    p = swf(tmp_path / "fifo.swf", FIFO_RECORD)
    for policy in BASELINES:
        f = fidelity(p, policy)
        m = f.measures
        assert f.grade == "high", policy
        assert m.ks_wait == 0 and m.mean_wait_rel == 0 and m.util_gap == 0
        assert m.ks_wait_past_latency == 0
        assert m.wait_pearson == pytest.approx(1) and m.queue_spearman == pytest.approx(1)
        assert m.bsld_obs == m.bsld_rep and m.p95_wait_obs == m.p95_wait_rep
        assert f.chosen_by == "given"


def test_a_record_far_from_any_replay_grades_low_and_the_default_tries_every_baseline(
    tmp_path: Path,
) -> None:
    # The machine kept small jobs waiting for hours on an empty machine (an outage): no
    # baseline reproduces that, and every one grades low.
    rows = [(t, 20000 - t, 60, 1, 60) for t in range(0, 2000, 100)]
    f = fidelity(swf(tmp_path / "outage.swf", rows))
    assert f.grade == "low"
    assert set(f.candidates) == set(BASELINES)
    # Every replay starts each job at once: all tie, and the first baseline is chosen.
    assert f.policy == "fifo" and f.measures.mean_wait_rep == 0
    assert f.measures.ks_wait == 1.0 and f.measures.mean_wait_rel == 1.0
    assert f.measures.ks_wait_past_latency == 1.0


def test_the_latency_measure_ignores_waits_under_a_minute(tmp_path: Path) -> None:
    # The machine started every job 30 s after its arrival on an empty machine: the KS
    # distance of the waits is 1, and 0 once waits under a minute count as a minute.
    rows = [(t, 30, 60, 1, 60) for t in range(0, 2000, 100)]
    m = fidelity(swf(tmp_path / "cycle.swf", rows), "fifo").measures
    assert m.ks_wait == 1.0 and m.ks_wait_past_latency == 0.0


def test_the_default_baseline_is_the_best_grade(tmp_path: Path) -> None:
    # Job 3 (4 procs) backfilled beside the head in the record: EASY and conservative
    # reproduce it, FIFO (which holds job 3 behind job 2) does not.
    rows = [(0, 0, 100, 6, 100), (1, 99, 10, 10, 10), (2, 0, 50, 4, 50)]
    f = fidelity(swf(tmp_path / "backfill.swf", rows))
    assert fidelity(swf(tmp_path / "b2.swf", rows), "fifo").measures.ks_wait > 0
    assert f.policy == "easy" and f.grade == "high"
    assert f.candidates["easy"]["ks_wait"] == 0


def test_a_trace_without_recorded_waits_is_refused(traces: Path) -> None:
    with pytest.raises(TraceError, match="records no waits"):
        fidelity(traces / LUBLIN, "fifo")
    res = CliRunner().invoke(main, ["fidelity", "--trace", str(traces / LUBLIN)])
    assert res.exit_code == 1 and "records no waits" in res.output


def test_a_loaded_trace_keeps_its_quality_report(tmp_path: Path) -> None:
    tr = load_trace(swf(tmp_path / "big.swf", [*FIFO_RECORD, (600, 0, 5, 50, 5)]))
    before = tr.quality.to_dict()
    f = fidelity(tr, "fifo")
    assert tr.quality.to_dict() == before and f.measures.jobs == len(FIFO_RECORD)


def test_limit_keeps_the_first_jobs(tmp_path: Path) -> None:
    f = fidelity(swf(tmp_path / "fifo.swf", FIFO_RECORD), "easy", limit=3)
    assert f.measures.jobs == 3 and f.grade == "high"


def _measures(ks: float, rel: float, gap: float, rho: float) -> Measures:
    bs = {"p50": 1.0}
    return Measures(1, 0, 0, rel, 0, 0, 0, 0, gap, ks, ks, bs, bs, 1, 1, rho, rho)


@given(
    st.floats(0, 1),
    st.floats(0, 3),
    st.floats(0, 1),
    st.floats(-1, 1),
)
def test_grade_follows_the_thresholds(ks: float, rel: float, gap: float, rho: float) -> None:
    t = THRESHOLDS
    g = grade(_measures(ks, rel, gap, rho))
    high = (
        ks <= t.high_ks and rel <= t.high_mean_wait_rel and gap <= t.high_util_gap
        and rho >= t.high_queue_spearman
    )  # fmt: skip
    medium = (
        ks <= t.medium_ks and rel <= t.medium_mean_wait_rel and gap <= t.medium_util_gap
        and rho >= t.medium_queue_spearman
    )  # fmt: skip
    assert g == ("high" if high else "medium" if medium else "low")
    # Worse on any one measure never grades better.
    worse = grade(_measures(min(1.0, ks + 0.1), rel, gap, rho))
    assert GRADES.index(worse) >= GRADES.index(g)


samples = st.lists(st.integers(0, 50).map(float), min_size=1, max_size=40)


def _ks_by_definition(a: list[float], b: list[float]) -> float:
    return max(
        abs(sum(x <= v for x in a) / len(a) - sum(x <= v for x in b) / len(b)) for v in a + b
    )


@given(samples, samples)
def test_ks_distance_is_the_largest_cdf_gap(a: list[float], b: list[float]) -> None:
    d = ks_distance(a, b)
    assert d == pytest.approx(_ks_by_definition(a, b))
    assert 0 <= d <= 1 and d == ks_distance(b, a)
    assert ks_distance(a, list(reversed(a))) == 0


@given(samples)
def test_spearman_is_one_under_any_increasing_map(xs: list[float]) -> None:
    ys = [x**3 + 7 for x in xs]
    assert spearman(xs, ys) == pytest.approx(1)
    if len(set(xs)) > 1:
        assert spearman(xs, [-y for y in ys]) == pytest.approx(-1)
        assert pearson(xs, [2 * x + 1 for x in xs]) == pytest.approx(1)


def test_correlation_of_a_constant_series() -> None:
    assert pearson([3, 3, 3], [3, 3, 3]) == 1.0
    assert spearman([3, 3, 3], [1, 2, 3]) == 0.0


def test_fidelity_on_kth_sp2(traces: Path) -> None:
    f = fidelity(traces / KTH)
    assert f.policy in BASELINES and f.grade in GRADES
    assert f.measures.jobs == 28475
    rank = {g: k for k, g in enumerate(GRADES)}
    best = min((rank[c["grade"]], c["ks_wait"]) for c in f.candidates.values())
    assert (rank[f.grade], f.measures.ks_wait) == best
    # The record and every replay do the same work: utilisation differs by the span only.
    assert 0 < f.measures.util_obs <= 1 and 0 < f.measures.util_rep <= 1
    d = json.loads(f.to_json())
    assert d["grade"] == f.grade and d["thresholds"]["high_ks"] == THRESHOLDS.high_ks
    assert f"**{f.grade}**" in f.markdown()


def test_cli_fidelity_table_and_json(traces: Path) -> None:
    runner = CliRunner()
    args = ["fidelity", "--trace", str(traces / KTH), "--policy", "easy", "--limit", "2000"]
    res = runner.invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "KS distance of waits" in res.output and "grade:" in res.output
    res = runner.invoke(main, [*args, "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["policy"] == "easy" and d["measures"]["jobs"] == 2000
    assert d["grade"] == fidelity(traces / KTH, "easy", limit=2000).grade


def test_cli_replay_prints_the_quality_report(tmp_path: Path) -> None:
    p = swf(tmp_path / "t.swf", [*FIFO_RECORD, (600, 0, 5, 50, 5), (700, -1, 5, 2, 5)])
    res = CliRunner().invoke(
        main, ["replay", "--trace", str(p), "--policy", "fifo", "--out", str(tmp_path / "o")]
    )
    assert res.exit_code == 0, res.output
    out = res.output
    assert "trace quality" in out and "records" in out and "8" in out
    assert "wait < 0 (unknown)" in out and "larger than the capacity (10)" in out


def test_cli_replay_format(tmp_path: Path) -> None:
    p = swf(tmp_path / "jobs.dat", FIFO_RECORD)
    runner = CliRunner()
    base = ["replay", "--trace", str(p), "--policy", "fifo", "--out", str(tmp_path / "o")]
    res = runner.invoke(main, base)
    assert (
        res.exit_code == 1
        and "pass --format (one of swf, alibaba, philly, sacct, sacct-gpu, pbs, pm100)"
        in res.output
    )
    res = runner.invoke(main, [*base, "--format", "swf"])
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["jobs"] == len(FIFO_RECORD) and m["manifest"]["config"]["format"] == "swf"
    res = runner.invoke(main, [*base, "--format", "parquet"])
    assert res.exit_code == 2
    res = runner.invoke(main, ["fidelity", "--trace", str(p), "--format", "swf", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["grade"] == "high"


def _w(rows: list[tuple[float, int, float, int]], cap: int = 10) -> Workload:
    """A workload from (submit, size, runtime = request, campaign) rows."""
    n = len(rows)
    return Workload(
        cap,
        "processors",
        list(range(1, n + 1)),
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        [f"user-{c}" for c in range(max(r[3] for r in rows) + 1)],
    )


def test_ljf_starts_the_largest_waiting_job_first() -> None:
    # At 10 the machine frees: LJF starts job 3 (8 procs) and job 2 (4 procs, 100 s) must
    # wait for it (it would not fit beside it); EASY starts job 2 in submit order, and
    # job 3 then waits for job 2's end at 110.
    w = _w([(0, 10, 10, 0), (1, 4, 100, 0), (2, 8, 5, 0)])
    assert replay(w, make_policy("ljf", w, ReplayConfig()), strict=True).start.tolist() == [
        0,
        15,
        10,
    ]
    assert replay(w, make_policy("easy", w, ReplayConfig()), strict=True).start.tolist() == [
        0,
        10,
        110,
    ]


def test_fairshare_serves_the_account_with_less_usage_first() -> None:
    # User 0 used the whole machine for 100 s; at 100 its job 2 and user 1's job 3 wait:
    # fair share starts user 1's first, EASY the earlier-submitted one.
    w = _w([(0, 10, 100, 0), (50, 10, 10, 0), (60, 10, 10, 1)])
    fs = replay(w, make_policy("fairshare", w, ReplayConfig()), strict=True)
    assert fs.start.tolist() == [0, 110, 100]
    assert replay(w, make_policy("easy", w, ReplayConfig()), strict=True).start.tolist() == [
        0,
        100,
        110,
    ]


def test_fairshare_usage_decays_with_the_half_life() -> None:
    # User 1 used 10,000 processor-seconds up to 1000, user 0 then 1,000 up to 1100. A
    # week's half-life still holds user 1's history against it; a 10 s half-life has
    # forgotten it (10,000 / 2**10 < 1,000), and user 1's job goes first.
    rows = [(0, 10, 1000, 1), (1000, 10, 100, 0), (1050, 10, 10, 0), (1060, 10, 10, 1)]
    w = _w(rows)
    week = replay(w, FairShare(w, ReplayConfig()), strict=True)
    assert week.start[2:].tolist() == [1100, 1110]
    short = replay(w, FairShare(w, ReplayConfig(), half_life_s=10), strict=True)
    assert short.start[2:].tolist() == [1110, 1100]
    with pytest.raises(ValueError, match="half-life"):
        FairShare(w, ReplayConfig(), half_life_s=0)


@pytest.mark.parametrize("policy", ["ljf", "fairshare"])
def test_new_policies_pass_strict_invariants_on_kth(traces: Path, policy: str) -> None:
    tr = load_trace(traces / KTH)
    w = to_workload(tr, tr.header.capacity or 0)
    s = replay(w, make_policy(policy, w, ReplayConfig()), strict=True)
    assert len(s.start) == 28475 and not s.killed


random_jobs = st.lists(
    st.tuples(
        st.integers(0, 30), st.integers(1, 10), st.integers(1, 40), st.integers(0, 3),
        st.sampled_from([0.5, 1.0, 1.5]),
    ),
    min_size=1,
    max_size=30,
)  # fmt: skip


def _random(rows: list[tuple[int, int, int, int, float]], accounts: bool) -> Workload:
    """(gap to the previous submit, size, request, account, runtime / request) rows."""
    t = 0.0
    w = _w([(0, 1, 1, 0)])
    for col in ("job_id", "submit", "size", "duration", "hold", "campaign"):
        getattr(w, col).clear()
    for i, (gap, size, req, acct, frac) in enumerate(rows):
        t += gap
        w.job_id.append(i + 1)
        w.submit.append(t)
        w.size.append(size)
        w.duration.append(float(req))
        w.hold.append(float(round(req * frac)))
        w.campaign.append(acct if accounts else 0)
    w.campaign_names = [f"user-{c}" for c in range(4)]
    return w


@given(random_jobs)
def test_fairshare_with_one_account_is_easy(rows: list[tuple[int, int, int, int, float]]) -> None:
    # Equal usage everywhere leaves submit order: the schedule must be EASY's exactly.
    w = _random(rows, accounts=False)
    easy = replay(w, make_policy("easy", w, ReplayConfig()), strict=True)
    fs = replay(w, make_policy("fairshare", w, ReplayConfig()), strict=True)
    assert fs.start == easy.start


@given(random_jobs, st.sampled_from([1.0, 60.0, 7 * 86400.0]))
def test_ljf_and_fairshare_keep_the_invariants_with_many_accounts(
    rows: list[tuple[int, int, int, int, float]], half_life: float
) -> None:
    w = _random(rows, accounts=True)
    for policy in (make_policy("ljf", w, ReplayConfig()), FairShare(w, None, half_life)):
        s = replay(w, policy, strict=True)
        assert s.end.tolist() == [s.start[j] + w.hold[j] for j in range(len(w))]


def test_fairshare_over_one_campaign_is_easy_on_kth(traces: Path) -> None:
    one = ReplayConfig(campaigns="one")
    a, b = (replay_trace(traces / KTH, p, config=one) for p in ("easy", "fairshare"))
    assert a.manifest["outputs"]["schedule_sha256"] == b.manifest["outputs"]["schedule_sha256"]
