"""The optional accelerated build (``make accel``, ``bursar.broker.accel``): built with mypyc
into a folder of its own, it gives the pure-Python modules' schedules byte for byte, and the
elastic allocator's decisions (the published run hashes); a stale build is never loaded;
without a compiler the build says what to install."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing_system_part

from bursar.broker import accel, compiled

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR") or Path(__file__).resolve().parents[3] / "shared" / "traces"
)

SCRIPT = """
import json, sys
from bursar.broker import compiled
from bursar.sim.replay.run import replay_trace
r = replay_trace(sys.argv[1], "conservative")
print(json.dumps({"active": compiled.active(), "digest": r.manifest["outputs"]["schedule_sha256"]}))
"""


ELASTIC_SCRIPT = """
import json, sys
from pathlib import Path
from bursar.broker import compiled
from bursar.sim.elastic.runner import CLUSTERS, run
from bursar.sim.elastic.trace import load_curves, load_jobs
itp = Path(sys.argv[1])
curves = load_curves(itp / "throughputs_A100")
hashes = []
for c in json.loads(sys.argv[2]):
    jobs = load_jobs(itp / f"{c['trace']}.csv.gz")[: c["jobs"]]
    r = run(jobs, curves, c["policy"], CLUSTERS[c["trace"]], trace_name=c["trace"],
            lease_term_s=c["term"], speed_model=c["speed_model"], check="end")
    hashes.append(r.sha256)
print(json.dumps({"active": compiled.active(), "hashes": hashes}))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("accel")
    try:
        accel.build(out)
    except RuntimeError as exc:
        if str(exc).startswith("mypyc failed"):
            # A type error in a compiled module or in what it imports is a defect of the
            # source, not a part missing from this machine: it must not pass as a skip.
            pytest.fail(f"the accelerated build is broken: {exc}")
        missing_system_part(f"no accelerated build here: {exc}")
    return out


def _replay(trace: Path, **env_extra: str) -> dict:
    return _python(SCRIPT, [str(trace)], env_extra)


def _python(script: str, args: list[str], env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("BURSAR_PURE", "BURSAR_ACCEL_DIR")}
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _random_swf(path: Path, n: int, seed: int) -> Path:
    # About 90% load on 64 processors, so that a queue forms and drains, with jobs ending
    # early and some running past their requested time (blocked reservations): every
    # path of the compression pass.
    rng = random.Random(seed)
    lines = ["; MaxProcs: 64", "; UnixStartTime: 0"]
    t = 0
    for i in range(1, n + 1):
        t += rng.randint(0, 1700)
        procs = rng.choice((1, 2, 4, 8, 16, 32, 64))
        req = rng.randint(60, 7200)
        run = max(1, int(req * rng.choice((0.1, 0.5, 0.9, 1.0, 1.3))))
        fields = [i, t, 0, run, procs, -1, -1, procs, req, -1, 1, rng.randint(1, 20), 1, -1]
        lines.append(" ".join(str(x) for x in [*fields, 1, 1, -1, -1]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_compiled_modules_schedule_a_random_trace_as_the_pure_ones(
    built: Path, tmp_path: Path
) -> None:
    trace = _random_swf(tmp_path / "random.swf", 3000, seed=7)
    fast = _replay(trace, BURSAR_ACCEL_DIR=str(built))
    pure = _replay(trace, BURSAR_PURE="1")
    assert fast["active"] and all(fast["active"].values()), fast
    assert not any(pure["active"].values()), pure
    assert fast["digest"] == pure["digest"]


POWER_SCRIPT = """
import hashlib, json, random
from bursar.broker import compiled
from bursar.sim.replay.kernel import replay
from bursar.sim.replay.mapping import FacilityPower, Workload
from bursar.sim.replay.policies.powercap import power_policy
# 64 processors under a 2 kW cap, jobs of 10-600 W ending early or on time: reservations
# in both profiles, compressed as jobs end early.
rng = random.Random(11)
w = Workload(64, "processors", [], [], [], [], [], [], ["all"])
watts = []
t = 0.0
for i in range(600):
    t += rng.randint(0, 600)
    hold = float(rng.randint(60, 7200))
    w.job_id.append(i + 1)
    w.submit.append(t)
    w.size.append(rng.choice((1, 2, 4, 8, 16, 32, 64)))
    w.duration.append(hold * rng.choice((0.1, 0.5, 1.0)))
    w.hold.append(hold)
    w.campaign.append(0)
    watts.append(rng.uniform(10.0, 600.0))
w.power = FacilityPower(2000.0, 0.0, watts)
s = replay(w, power_policy("conservative")(w), strict=True)
digest = hashlib.sha256(repr((list(s.start), s.refused)).encode()).hexdigest()
print(json.dumps({"active": compiled.active(), "digest": digest}))
"""


def test_compiled_modules_replay_under_a_power_cap_as_the_pure_ones(built: Path) -> None:
    # Conservative backfill under a cap keeps a second profile, in watts (floats), beside
    # the compiled profile of whole processors.
    fast = _python(POWER_SCRIPT, [], {"BURSAR_ACCEL_DIR": str(built)})
    pure = _python(POWER_SCRIPT, [], {"BURSAR_PURE": "1"})
    assert fast["active"]["bursar.sim.replay.profile"], fast
    assert fast["digest"] == pure["digest"]


def test_compiled_modules_keep_the_kth_sp2_schedule(built: Path) -> None:
    trace = TRACES / "pwa-kth-sp2" / "KTH-SP2-1996-2.1-cln.swf.gz"
    if not trace.is_file():
        pytest.skip(f"no trace at {trace} (set BURSAR_TRACES_DIR)")
    fast = _replay(trace, BURSAR_ACCEL_DIR=str(built))
    assert all(fast["active"].values()), fast
    # The schedule conservative backfill has always given this trace (as the pure one's
    # test in test_replay_policies.py).
    assert fast["digest"] == "2f55fb5307f839127f2903d7b2efd148a7b9cdf939519badf7841b2856749d3c"


def test_the_compiled_elastic_allocator_makes_the_published_decisions(built: Path) -> None:
    # The published runs the reproducibility test re-runs (195job under every policy, the
    # interpolated model, 2,000 jobs of a cluster file): the compiled allocator must give
    # each one's hash, every event with its decisions, as the pure one does.
    itp = TRACES / "elasticflow-itp"
    if not (itp / "195job.csv.gz").is_file():
        pytest.skip(f"no ElasticFlow traces at {itp} (set BURSAR_TRACES_DIR)")
    docs = Path(__file__).resolve().parents[2] / "docs"
    cases = []
    for name in (
        "elastic-deadlines.json",
        "elastic-deadlines.interpolated.json",
        "elastic-deadlines.subset.json",
    ):
        body = json.loads((docs / name).read_text())
        term = body["conditions"]["lease_term_s"]
        for r in body["runs"]:
            if r["trace"] == "195job" or name.endswith("subset.json"):
                cases.append({**r, "term": term})
    assert {c["trace"] for c in cases} == {"195job", "cluster05"}
    fast = _python(ELASTIC_SCRIPT, [str(itp), json.dumps(cases)], {"BURSAR_ACCEL_DIR": str(built)})
    assert fast["active"]["bursar.broker.elastic"]
    for c, got in zip(cases, fast["hashes"], strict=True):
        assert got == c["sha256"], f"{c['trace']} under {c['policy']} ({c['speed_model']})"


SNAPSHOT_SCRIPT = """
import hashlib, json, sys
from pathlib import Path
from bursar.broker import compiled, safe_pickle, snapshot
from bursar.sim.elastic import runner
from bursar.sim.elastic.trace import load_curves, load_jobs
itp = Path(sys.argv[1])
c = json.loads(sys.argv[2])
apply = runner._Run.apply
copies = []
pickles = hashlib.sha256()

def restored_every_50(self, event, job=None):
    # The broker snapshots its engine by pickling it; from every 50th event on, the run
    # goes on with the engine read back from its snapshot.
    if self.seq % 50 == 0 and self.engine.elastic.by_lease:
        state = snapshot.capture(self.engine)
        pickles.update(state)
        self.engine = safe_pickle.loads(state)
        copies.append(self.seq)
    return apply(self, event, job)

runner._Run.apply = restored_every_50
jobs = load_jobs(itp / f"{c['trace']}.csv.gz")[: c["jobs"]]
r = runner.run(jobs, load_curves(itp / "throughputs_A100"), c["policy"],
               runner.CLUSTERS[c["trace"]], trace_name=c["trace"], lease_term_s=c["term"],
               speed_model=c["speed_model"], check="end")
print(json.dumps({"active": compiled.active(), "sha256": r.sha256, "copies": len(copies),
                  "pickles": pickles.hexdigest()}))
"""


def test_the_compiled_allocator_s_state_is_snapshotted_as_the_pure_one_s(built: Path) -> None:
    # The broker pickles its engine for snapshots (and a standby's copy): the elastic
    # allocator's state must pickle and read back under the compiled build too, a run that
    # goes on from the copies makes the published decisions, and the snapshots are the
    # same bytes as pure Python's (so either build reads the other's, and older ones).
    itp = TRACES / "elasticflow-itp"
    if not (itp / "195job.csv.gz").is_file():
        pytest.skip(f"no ElasticFlow traces at {itp} (set BURSAR_TRACES_DIR)")
    body = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "elastic-deadlines.json").read_text()
    )
    (row,) = [r for r in body["runs"] if r["trace"] == "195job" and r["policy"] == "dmug"]
    case = {**row, "term": body["conditions"]["lease_term_s"]}
    args = [str(itp), json.dumps(case)]
    # One hash seed for both: a pickled set's order follows its strings' hashes.
    fast = _python(SNAPSHOT_SCRIPT, args, {"BURSAR_ACCEL_DIR": str(built), "PYTHONHASHSEED": "0"})
    pure = _python(SNAPSHOT_SCRIPT, args, {"BURSAR_PURE": "1", "PYTHONHASHSEED": "0"})
    assert fast["active"]["bursar.broker.elastic"] and not pure["active"]["bursar.broker.elastic"]
    assert fast["copies"] == pure["copies"] > 10
    assert fast["sha256"] == pure["sha256"] == row["sha256"]
    assert fast["pickles"] == pure["pickles"]


def _fake_build(root: Path, sources: dict[str, str], python: str) -> Path:
    folder = root / "sim" / "replay" / compiled.ACCEL_DIR
    folder.mkdir(parents=True)
    (folder / compiled.MANIFEST).write_text(json.dumps({"python": python, "sources": sources}))
    return folder


def test_a_build_from_other_sources_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import bursar.sim.replay as replay

    source_dir = replay.__path__[-1]
    tag = sys.implementation.cache_tag
    monkeypatch.delenv("BURSAR_PURE", raising=False)
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "stale"))
    _fake_build(tmp_path / "stale", {"profile": "0" * 64}, tag)
    path = [source_dir]
    with caplog.at_level(logging.WARNING, logger="bursar.broker.compiled"):
        compiled._warned.discard("bursar.sim.replay")
        assert not compiled.use("bursar.sim.replay", path)
    assert path == [source_dir]
    assert "stale" in caplog.text and "make accel" in caplog.text

    # Built from this very source, for this Python: put first on the package's path.
    digest = compiled.digest(Path(source_dir, "profile.py"))
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "fresh"))
    folder = _fake_build(tmp_path / "fresh", {"profile": digest}, tag)
    path = [source_dir]
    assert compiled.use("bursar.sim.replay", path)
    assert path == [str(folder), source_dir]

    # For another Python, or with BURSAR_PURE: the source.
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "other"))
    _fake_build(tmp_path / "other", {"profile": digest}, "cpython-399")
    assert not compiled.use("bursar.sim.replay", [source_dir])
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("BURSAR_PURE", "1")
    assert not compiled.use("bursar.sim.replay", [source_dir])


def test_without_a_compiler_the_build_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(RuntimeError, match="no C compiler"):
        accel.build(tmp_path)
    assert not any(tmp_path.iterdir())
