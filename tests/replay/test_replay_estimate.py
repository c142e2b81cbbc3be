"""Runtime estimates: Tsafrir's predictor learns only from jobs that ended before a
submission, a job outliving its estimate has it extended to its request (never killed),
and the replay refuses an estimate a policy cannot take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.cli.main import main
from bursar.sim.replay import estimate
from bursar.sim.replay.estimate import Estimated, Tsafrir, estimated
from bursar.sim.replay.kernel import replay
from bursar.sim.replay.mapping import ReplayConfig, Workload
from bursar.sim.replay.policies import make_policy
from bursar.sim.replay.run import replay_trace


def _w(rows: list[tuple[float, int, float, float, int]], capacity: int = 10) -> Workload:
    """Rows of (submit, size, request, runtime, user)."""
    return Workload(
        capacity,
        "processors",
        list(range(1, len(rows) + 1)),
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        [r[4] for r in rows],
        [f"user-{u}" for u in sorted({r[4] for r in rows})],
    )


def test_tsafrir_averages_the_last_two_runtimes_capped_at_the_request() -> None:
    w = _w([(0, 1, 100, 10, 0), (0, 1, 100, 30, 0), (0, 1, 100, 80, 0), (0, 1, 15, 1, 0)])
    t = Tsafrir(w)
    assert t.predict(0) == 100  # no history: the request
    t.observe(0, 10)
    assert t.predict(1) == 10  # one ended job: its runtime
    t.observe(1, 30)
    assert t.predict(2) == 20  # the average of the last two
    t.observe(2, 80)
    assert t.predict(2) == 55
    assert t.predict(3) == 15  # capped at the request


def test_an_estimate_uses_only_jobs_that_ended_by_the_submission() -> None:
    # User 0's first job runs 50 s; its second is submitted at 10, before the first
    # ends: it has no history yet and is estimated at its request. The third, submitted
    # after the first ended, is estimated at that runtime.
    w = _w([(0, 1, 100, 50, 0), (10, 1, 100, 5, 0), (60, 1, 100, 5, 0)])
    seen: dict[int, float] = {}
    policy = estimated(w, "tsafrir", lambda v: make_policy("easy", v, ReplayConfig()))
    assert isinstance(policy, Estimated)
    submit = policy.submit

    def record(j: int, now: float) -> bool | None:
        out = submit(j, now)
        seen[j] = policy.est[j]
        return out

    policy.submit = record  # type: ignore[method-assign]
    replay(w, policy, strict=True)
    assert seen == {0: 100, 1: 100, 2: 27.5}  # job 2: (5 + 50) / 2, job 1 ended at 15


@pytest.mark.parametrize("policy", ["easy", "conservative"])
def test_a_job_outliving_its_estimate_is_extended_to_its_request_never_killed(
    policy: str,
) -> None:
    # User 0's two short runs make job 3's estimate 10 s; it runs 100 s of its 100.
    # Job 4 (the whole machine) waits behind it. Job 5 (4 processors, 25 s) cannot
    # backfill while job 3 is thought to end at 30 (it would delay job 4); at 30 job 3
    # outlives its estimate, which is extended to its request (end 120), and job 5 now
    # ends well before that: it starts at 30. Under the request estimate it starts then
    # too; with the estimate taken to end at any moment it would wait for job 4.
    w = _w(
        [
            (0, 10, 100, 10, 0),
            (0, 10, 100, 10, 0),
            (20, 6, 100, 100, 0),
            (21, 10, 50, 50, 1),
            (22, 4, 25, 25, 2),
        ]
    )
    p = estimated(w, "tsafrir", lambda v: make_policy(policy, v, ReplayConfig()))
    s = replay(w, p, strict=True)
    assert s.killed == []
    assert all(s.end[j] == s.start[j] + w.hold[j] for j in range(len(w)))
    assert s.start.tolist() == [0, 10, 20, 120, 30]


def test_the_requested_estimate_is_the_policy_itself_and_leaves_the_manifest_alone(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text(
        "; MaxProcs: 4\n"
        + "".join(
            f"{i} {i * 5} 0 {20 + i} 2 -1 -1 2 100 -1 1 {i % 2} 1 -1 1 1 -1 -1\n"
            for i in range(1, 9)
        )
    )
    plain = replay_trace(trace, "easy")
    same = replay_trace(trace, "easy", estimate="requested")
    guess = replay_trace(trace, "easy", estimate="tsafrir")
    assert plain.manifest == same.manifest
    assert "estimate" not in plain.manifest["config"]
    assert guess.manifest["config"]["estimate"] == "tsafrir"
    assert guess.metrics["ran_past_request"] == plain.metrics["ran_past_request"]
    assert guess.metrics["killed"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fifo", "--estimate", "tsafrir"], "cannot"),
        (["--policy", "bursar", "--estimate", "tsafrir"], "cannot"),
        (["--policy", "easy", "--estimate", "oracle"], "'oracle' is not one of"),
    ],
)
def test_cli_refuses_an_estimate_a_policy_cannot_take(
    tmp_path: Path, args: list[str], message: str
) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text("; MaxProcs: 4\n1 0 0 10 2 -1 -1 2 100 -1 1 1 1 -1 1 1 -1 -1\n")
    res = CliRunner().invoke(
        main, ["replay", "--trace", str(trace), "--out", str(tmp_path / "o"), *args]
    )
    assert res.exit_code != 0
    assert message in res.output
    assert not (tmp_path / "o").exists()  # bad input changes nothing


def test_cli_replay_with_tsafrir_writes_its_estimate_in_the_manifest(tmp_path: Path) -> None:
    trace = tmp_path / "t.swf"
    trace.write_text("; MaxProcs: 4\n1 0 0 10 2 -1 -1 2 100 -1 1 1 1 -1 1 1 -1 -1\n")
    out = tmp_path / "o"
    args = ["replay", "--trace", str(trace), "--policy", "easy", "--estimate", "tsafrir"]
    res = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "easy · tsafrir" in res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["estimate"] == "tsafrir"


def test_a_quantile_model_is_fitted_in_time_order_and_capped_at_the_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("sklearn")
    monkeypatch.setattr(estimate, "RETRAIN", 40)
    # Two users: one whose jobs run a tenth of their request, one who asks just enough.
    rows = [(float(i * 50), 1 + i % 4, 1000.0, 100.0 + i % 7, 0) for i in range(0, 200, 2)]
    rows += [(float(i * 50), 2, 300.0, 290.0, 1) for i in range(1, 200, 2)]
    rows.sort()
    w = _w(rows, capacity=64)
    p = estimated(w, "p50", lambda v: make_policy("easy", v, ReplayConfig()))
    assert isinstance(p, Estimated)
    model = p.predictor
    assert isinstance(model, estimate.Quantile)
    seen: dict[int, tuple[float, int]] = {}
    submit = p.submit

    def record(j: int, now: float) -> bool | None:
        out = submit(j, now)
        seen[j] = (p.est[j], model.ended)
        return out

    p.submit = record  # type: ignore[method-assign]
    s = replay(w, p, strict=True)
    assert s.killed == []
    # Before the first fit (fewer than 40 jobs ended by the submission): the request.
    assert all(est == w.duration[j] for j, (est, ended) in seen.items() if ended < 40)
    later = [(j, est) for j, (est, ended) in seen.items() if ended >= 80]
    assert later and all(1.0 <= est <= w.duration[j] for j, est in later)
    # The model learned the first user's habit: far below the request.
    assert all(est < 300 for j, est in later if w.campaign[j] == 0)


def test_the_quantile_estimates_need_scikit_learn_and_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sklearn.linear_model", None)
    w = _w([(0, 1, 100, 10, 0)])
    with pytest.raises(
        ValueError, match=r"needs scikit-learn: pip install 'bursar-broker\[predict\]'"
    ):
        estimated(w, "p10", lambda v: make_policy("easy", v, ReplayConfig()))
