"""bursar traces synth: a generated workload, deterministic per seed (the same file hash),
whose knobs do what they say, that replays like any SWF, and whose bad options write
nothing."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from bursar.cli.main import main
from bursar.sim.replay.ingest import load_trace
from bursar.sim.replay.synth import SynthParams, generate


def _synth(out: Path, *args: str) -> str:
    res = CliRunner().invoke(main, ["traces", "synth", "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    return hashlib.sha256(out.read_bytes()).hexdigest()


def test_the_same_seed_writes_the_same_file_and_another_seed_another(tmp_path: Path) -> None:
    knobs = ("--jobs", "3000", "--burst", "3600,7200,4", "--tail-alpha", "1.5")
    a = _synth(tmp_path / "a.swf.gz", *knobs, "--seed", "5")
    b = _synth(tmp_path / "b.swf.gz", *knobs, "--seed", "5")
    c = _synth(tmp_path / "c.swf.gz", *knobs, "--seed", "6")
    assert a == b != c
    plain = _synth(tmp_path / "d.swf", *knobs, "--seed", "5")
    assert plain == _synth(tmp_path / "e.swf", *knobs, "--seed", "5")


def test_the_file_replays_and_its_header_says_how_it_was_made(tmp_path: Path) -> None:
    out = tmp_path / "w.swf"
    _synth(out, "--jobs", "500", "--capacity", "64", "--seed", "2")
    t = load_trace(out)
    assert t.header.capacity == 64 and len(t.jobs) == 500
    assert "wait" in t.quality.absent  # a generated workload records no waits
    assert "seed=2" in t.header.fields["Parameters"]
    assert all(1 <= s <= 64 for s in t.jobs.procs)
    assert all(r >= run for r, run in zip(t.jobs.req_time, t.jobs.run, strict=True))


def _offered(jobs: list[tuple[int, int, int, int, int, int]], capacity: int) -> float:
    span = jobs[-1][1] - jobs[0][1]
    return sum(run * size for _, _, run, size, _, _ in jobs) / (capacity * span)


@pytest.mark.parametrize("load", [0.3, 0.9])
def test_load_is_the_offered_load(load: float) -> None:
    p = SynthParams(jobs=20_000, load=load, seed=4)
    assert _offered(generate(p), p.capacity) == pytest.approx(load, rel=0.15)


def test_a_burst_packs_arrivals_into_its_window() -> None:
    base = SynthParams(jobs=5000, seed=8)
    jobs = generate(base)
    window = (jobs[1000][1], 6 * 3600.0)
    burst = generate(SynthParams(jobs=5000, seed=8, burst=(*window, 5.0)))

    def inside(js: list[tuple[int, int, int, int, int, int]]) -> int:
        return sum(1 for j in js if window[0] <= j[1] < window[0] + window[1])

    assert inside(burst) > 3 * inside(jobs)


def test_user_skew_lets_one_user_dominate() -> None:
    def top_share(skew: float) -> float:
        users = Counter(j[5] for j in generate(SynthParams(jobs=5000, user_skew=skew)))
        return users.most_common(1)[0][1] / 5000

    assert top_share(0.0) < 0.05
    assert top_share(2.0) > 0.5


def test_a_smaller_tail_alpha_has_more_very_long_jobs() -> None:
    def long_share(alpha: float) -> float:
        jobs = generate(SynthParams(jobs=5000, tail_alpha=alpha, max_runtime_s=10**7))
        return sum(1 for j in jobs if j[2] > 3600) / len(jobs)

    # Pareto from 10 s: P(runtime > 1 h) = (10 / 3600) ** alpha.
    assert long_share(0.5) == pytest.approx((10 / 3600) ** 0.5, rel=0.2)
    assert long_share(0.5) > 10 * long_share(1.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--load", "0"], "load must be in (0, 10]"),
        (["--burst", "1,2"], "expected START,LENGTH,FACTOR"),
        (["--burst", "0,-5,2"], "LENGTH > 0"),
        (["--min-runtime", "100", "--max-runtime", "10"], "min_runtime_s < max_runtime_s"),
        (["--tail-alpha", "0"], "tail_alpha must be in (0, 10]"),
    ],
)
def test_bad_options_are_refused_and_write_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "w.swf"
    res = CliRunner().invoke(main, ["traces", "synth", "--out", str(out), *args])
    assert res.exit_code != 0 and message in res.output
    assert not out.exists()
