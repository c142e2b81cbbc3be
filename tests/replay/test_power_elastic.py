"""Deadlines under a facility power cap (sim/elastic/power.py): a job that would wait for
watts at its GPUs' highest power limit runs at a lower one (slower, per Zeus) and meets
its deadline; the cap holds; the sweep on the real 195-job trace."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bursar.sim.elastic.power import generic_profile, main, simulate, sweep
from bursar.sim.elastic.trace import Curves, Job, load_curves, load_jobs
from bursar.sim.power.model import GpuProfile
from bursar.sim.power.readers import read_zeus_profiles
from bursar.sim.replay.table import TraceError

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
EF = TRACES / "elasticflow-itp"
ZEUS = TRACES / "zeus-gpu-power" / "summary_power_v100.csv.gz"

# At 250 W a GPU draws 200 W; at 100 W it draws 100 W and runs 1.5 times as long.
PROFILES = {"resnet50": GpuProfile("resnet50", "v100", (100, 250), (100.0, 200.0), (1.5, 1.0))}
CURVES = Curves(Path("."), {"resnet50": {32: ((1, 1.0), (2, 2.0))}, "gpt2": {32: ((1, 1.0),)}})


def job(n: int, submit: float, deadline: float, model: str = "resnet50") -> Job:
    return Job(f"j{n}", submit, 100.0, model, deadline, 32, 1, 100.0, n + 1)


# Job 0 takes one GPU at 200 W until 100. Job 1 (100 s of work at 250 W, due at 191) finds
# 100 W free under a 300 W cap: at 250 W it must wait, and after job 0 ends 91 s are
# left, too few on one GPU, and two at 250 W draw 400 W. At 100 W it fits now: 150 s.
JOBS = [job(0, 0.0, 1000.0), job(1, 1.0, 191.0)]


def test_a_job_blocked_by_watts_meets_its_deadline_at_a_lower_power_limit() -> None:
    wait = simulate(JOBS, CURVES, PROFILES, 4, 300.0, "wait")
    throttle = simulate(JOBS, CURVES, PROFILES, 4, 300.0, "throttle")
    assert (wait.met, wait.dropped, wait.throttled) == (1, 1, 0)
    assert (throttle.met, throttle.dropped, throttle.throttled) == (2, 0, 1)
    assert throttle.peak_kw * 1e3 == 300.0  # at the cap, never above it
    # Job 0: 200 W for 100 s; job 1: 100 W for 150 s.
    assert throttle.energy_kwh == pytest.approx((200 * 100 + 100 * 150) / 3.6e6)


def test_without_a_cap_nothing_is_throttled() -> None:
    o = simulate(JOBS, CURVES, PROFILES, 4, math.inf, "throttle")
    assert (o.met, o.throttled, o.peak_kw) == (2, 0, 0.4)


def test_a_model_without_zeus_measurements_takes_the_median_profile() -> None:
    g = generic_profile(PROFILES)
    assert (g.network, g.limits, g.watts) == ("generic", (100, 250), (100.0, 200.0))
    o = simulate([job(0, 0.0, 1000.0, model="gpt2")], CURVES, PROFILES, 4, 150.0, "throttle")
    assert (o.met, o.throttled) == (1, 1)
    with pytest.raises(TraceError, match="no Zeus profile"):
        generic_profile({})


def test_the_sweep_never_meets_more_than_uncapped_and_names_its_caps() -> None:
    rep = sweep(JOBS, CURVES, PROFILES, 4, fractions=(1.0, 0.75))
    assert rep["uncapped"]["met"] == 2
    assert [r["cap_kw"] for r in rep["rows"]] == [0.4, 0.3]
    assert rep["rows"][1]["wait"]["met"] == 1
    assert rep["rows"][1]["throttle"]["met"] == 2
    with pytest.raises(ValueError, match="unknown mode"):
        simulate(JOBS, CURVES, PROFILES, 4, 1.0, "sleep")


@pytest.mark.skipif(
    not (EF / "195job.csv.gz").is_file() or not ZEUS.is_file(),
    reason=f"the ElasticFlow 195-job trace or the Zeus V100 profiles are not under {TRACES}",
)
def test_the_195_job_trace_under_half_its_peak(tmp_path: Path) -> None:
    jobs = load_jobs(EF / "195job.csv.gz")
    rep = sweep(jobs, load_curves(EF / "throughputs_A100"), read_zeus_profiles(ZEUS), 128)
    assert rep["uncapped"]["met"] == 169
    half = next(r for r in rep["rows"] if r["fraction"] == 0.5)
    assert (half["wait"]["met"], half["throttle"]["met"]) == (139, 144)
    for r in rep["rows"]:
        for mode in ("wait", "throttle"):
            assert r[mode]["peak_kw"] <= r["cap_kw"] + 1e-9
    rc = main(
        [str(EF / "195job.csv.gz"), "--gpus", "128", "--zeus", str(ZEUS), "--out", str(tmp_path)]
    )
    assert rc == 0
    assert "| 13.5 | 50% | 139 | 144 |" in (tmp_path / "elastic-power.md").read_text()
