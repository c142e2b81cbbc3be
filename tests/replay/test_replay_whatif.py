"""``bursar whatif`` on a hand-made trace: a candidate that improves mean wait but starves
a campaign is rejected with its narrative, one that backfills is accepted, a guarantee
the policy does not honour is counted as violated; the Pareto front as an invariant."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bursar.cli.main import main
from bursar.sim.replay.mapping import Workload
from bursar.sim.replay.whatif import (
    compare,
    guarantee_violations,
    pareto_front,
    parse_candidate,
    run_whatif,
)


def swf(path: Path, rows: list[tuple[int, int, int, int, int]]) -> Path:
    """Rows of (submit, run, procs, requested time, user) on a 10-processor machine."""
    lines = ["; MaxProcs: 10", "; UnixStartTime: 0"]
    for i, (submit, run, procs, req, user) in enumerate(rows, 1):
        lines.append(f"{i} {submit} 0 {run} {procs} -1 -1 {procs} {req} -1 1 {user} 1 -1 1 1 -1 -1")
    path.write_text("\n".join(lines) + "\n")
    return path


def trace(tmp_path: Path) -> Path:
    # user-1 holds 6 processors, then user-2 asks for the whole machine; user-1 keeps a
    # stream of 4-processor jobs overlapping (every 500 s, 1000 s each), so the machine is
    # never empty while the stream lasts; user-3's short jobs fit the holes before the
    # wide job can start.
    rows = [(0, 1000, 6, 1000, 1), (10, 100, 10, 100, 2)]
    rows += [(20 + 500 * k, 1000, 4, 1000, 1) for k in range(30)]
    rows += [(30 + 60 * k, 50, 2, 60, 3) for k in range(10)]
    return swf(tmp_path / "mix.swf", rows)


def configs(tmp_path: Path) -> tuple[Path, Path, Path]:
    base = tmp_path / "base.toml"
    base.write_text("starvation_s = 3600\n")
    # The broker never ages a request: nothing reserves room for the wide job.
    patient = tmp_path / "patient.toml"
    patient.write_text("starvation_s = 3600\nhol_patience_s = 10000000\n")
    guarantee = tmp_path / "guarantee.toml"
    guarantee.write_text('starvation_s = 3600\n[campaign."user-3"]\nguarantee = 2\n')
    return base, patient, guarantee


def test_a_starving_candidate_is_rejected_and_backfill_is_accepted(tmp_path: Path) -> None:
    base_cfg, patient, _ = configs(tmp_path)
    cands = [parse_candidate("policy=easy"), parse_candidate(f"policy=bursar,config={patient}")]
    base, arms = run_whatif(trace(tmp_path), base_cfg, cands, policy="fifo")
    rep = compare(base, arms)
    easy, starving = rep["candidates"]

    assert starving["label"] == "policy=bursar,config=patient.toml"
    assert starving["mean_wait_s"] < rep["baseline"]["mean_wait_s"]
    assert starving["verdict"] == "rejected"
    assert starving["starved_by_campaign"] == {"user-2": 1}
    assert rep["baseline"]["starved"] == 0
    blocked = [c["name"] for c in starving["constraints"] if not c["held"]]
    assert blocked == ["no campaign starved more than under the baseline"]
    assert starving["narrative"][0].startswith("starves 1 job of user-2 more than the baseline")

    assert easy["verdict"] == "accepted", easy["narrative"]
    assert easy["narrative"] == []
    assert easy["p95_bsld"] < rep["baseline"]["p95_bsld"]
    assert easy["delta"]["p95_bsld"] == easy["p95_bsld"] - rep["baseline"]["p95_bsld"]
    assert "policy=easy" in rep["pareto_front"]


def test_a_guarantee_the_policy_ignores_is_violated(tmp_path: Path) -> None:
    base_cfg, _, guarantee = configs(tmp_path)
    base, arms = run_whatif(
        trace(tmp_path), base_cfg, [parse_candidate(str(guarantee))], policy="fifo"
    )
    (cand,) = compare(base, arms)["candidates"]
    # FIFO holds user-3's short jobs behind the wide one whatever its guarantee says.
    assert cand["guarantee_violations"] > 0
    assert set(cand["violations_by_campaign"]) == {"user-3"}
    assert cand["verdict"] == "rejected"
    assert cand["narrative"][0].startswith(f"violates guarantees {cand['guarantee_violations']}")


def test_a_candidate_that_refuses_jobs_the_baseline_ran_is_rejected(tmp_path: Path) -> None:
    base_cfg, _, guarantee = configs(tmp_path)
    cand = parse_candidate(f"config={guarantee}")
    base, arms = run_whatif(trace(tmp_path), base_cfg, [cand], policy="bursar")
    rep = compare(base, arms)
    (row,) = rep["candidates"]
    # user-3's guarantee is held for it, so user-2's job of the whole machine can never
    # fit beside it: the broker refuses that job at its submission (the baseline ran it).
    assert rep["baseline"]["refused"] == 0
    assert row["refused"] == 1 and row["refused_by_campaign"] == {"user-2": 1}
    assert row["verdict"] == "rejected"
    blocked = [c["name"] for c in row["constraints"] if not c["held"]]
    assert "no campaign refused more jobs than under the baseline" in blocked
    assert any(n.startswith("refuses 1 jobs the baseline ran") for n in row["narrative"])
    assert row["delta"]["refused"] == 1


def test_guarantee_counts_only_requests_within_the_unmet_guarantee() -> None:
    # Campaign "a" (guarantee 4): job 0 (size 4) fits; job 1 (size 2) arrives while job 0
    # is outstanding, so it is past the guarantee and its wait does not count; job 2
    # arrives after job 0 ended and waited 100 s: a violation past a 30 s bound.
    w = Workload(
        10,
        "processors",
        [1, 2, 3, 4],
        [0.0, 5.0, 50.0, 60.0],
        [4, 2, 2, 3],
        [10.0] * 4,
        [10.0] * 4,
        [0, 0, 0, 1],
        ["a", "b"],
    )
    start = [0.0, 500.0, 150.0, 900.0]
    end = [10.0, 510.0, 160.0, 910.0]
    assert guarantee_violations(w, start, end, {"a": 4.0}, 30.0) == {"a": 1}
    assert guarantee_violations(w, start, end, {"a": 4.0}, 100.0) == {}
    assert guarantee_violations(w, start, end, {"a": 4.0, "b": 3.0}, 30.0) == {"a": 1, "b": 1}


def test_whatif_command_writes_the_report_and_every_manifest(tmp_path: Path) -> None:
    base_cfg, patient, guarantee = configs(tmp_path)
    out = tmp_path / "out"
    res = CliRunner().invoke(
        main,
        [
            "whatif",
            "--trace",
            str(trace(tmp_path)),
            "--config",
            str(base_cfg),
            "--policy",
            "fifo",
            "--candidate",
            "policy=easy",
            "--candidate",
            "capacity=20",
            "--candidate",
            f"policy=bursar,config={patient}",
            "--candidate",
            f"policy=bursar,config={guarantee}",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    rep = json.loads((out / "whatif.json").read_text())
    verdicts = {c["label"]: c["verdict"] for c in rep["candidates"]}
    assert verdicts["policy=easy"] == "accepted"
    # Twice the processors: every job starts on arrival, but half the machine idles.
    cap = next(c for c in rep["candidates"] if c["label"] == "capacity=20")
    assert cap["capacity"] == 20 and cap["verdict"] == "rejected"
    assert any("points lower, past the 0.5-point tolerance" in x for x in cap["narrative"])
    md = (out / "whatif.md").read_text()
    assert "starves 1 job of user-2 more than the baseline" in md
    assert "What the replay does not model" in md and "users do not adapt" in md
    assert "Fidelity of the baseline (`fifo` against the recorded schedule): **" in md
    assert rep["fidelity_detail"]["grade"] in ("high", "medium", "low")
    page = (out / "whatif.html").read_text()
    assert "data:image/png;base64," in page
    assert "| p95 bounded slowdown |" in md and "| refused at submission |" in md
    assert "refuses 1 jobs the baseline ran" in md
    assert verdicts["policy=bursar,config=guarantee.toml"] == "rejected"
    # Every run has its manifest.
    manifests = sorted(p.parent.name for p in (out / "runs").glob("*/manifest.json"))
    assert len(manifests) == 5 and set(rep["manifests"]) == {"baseline", *verdicts}


def test_a_run_that_did_not_finish_is_rejected_with_its_error(tmp_path: Path) -> None:
    base_cfg, _, _ = configs(tmp_path)
    base, (easy,) = run_whatif(
        trace(tmp_path), base_cfg, [parse_candidate("policy=easy")], policy="fifo"
    )
    broken = dataclasses.replace(easy, label="broken", result=None, error="InvariantViolation: x")
    rep = compare(base, [easy, broken])
    row = next(c for c in rep["candidates"] if c["label"] == "broken")
    assert row["verdict"] == "rejected" and row["error"] == "InvariantViolation: x"
    assert row["narrative"] == ["the replay did not finish: InvariantViolation: x"]
    assert "broken" not in rep["pareto_front"] and "broken" not in rep["manifests"]


def test_a_bad_candidate_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["whatif", "--trace", str(trace(tmp_path)), "--candidate", "policy=nope"]
    )
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.output


points = st.tuples(
    st.integers(1, 5).map(float), st.integers(0, 5).map(float), st.integers(0, 5).map(float)
)


@given(st.lists(points, min_size=1, max_size=8))
def test_pareto_front_is_exactly_the_undominated(pts: list[tuple[float, float, float]]) -> None:
    rows = [
        {"label": str(i), "p95_bsld": b, "mean_wait_s": w, "utilization": u}
        for i, (b, w, u) in enumerate(pts)
    ]
    front = set(pareto_front(rows))
    assert front

    def dominates(a: dict, b: dict) -> bool:
        ka = (a["p95_bsld"], a["mean_wait_s"], -a["utilization"])
        kb = (b["p95_bsld"], b["mean_wait_s"], -b["utilization"])
        return all(x <= y for x, y in zip(ka, kb, strict=True)) and ka != kb

    for r in rows:
        beaten = any(dominates(o, r) for o in rows)
        assert (r["label"] in front) == (not beaten)
