"""The optional accelerated build (``make accel``, ``bursar.sim.accel``): built with mypyc
into a folder of its own, it gives the pure-Python modules' schedules byte for byte; a
stale build is never loaded; without a compiler the build says what to install."""

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

from bursar.sim import accel

TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR") or Path(__file__).resolve().parents[3] / "shared" / "traces"
)

SCRIPT = """
import json, sys
from bursar.sim import accel
from bursar.sim.replay.run import replay_trace
r = replay_trace(sys.argv[1], "conservative")
print(json.dumps({"active": accel.active(), "digest": r.manifest["outputs"]["schedule_sha256"]}))
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
    env = {k: v for k, v in os.environ.items() if k not in ("BURSAR_PURE", "BURSAR_ACCEL_DIR")}
    env.update(env_extra)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(trace)],
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


def test_compiled_modules_keep_the_kth_sp2_schedule(built: Path) -> None:
    trace = TRACES / "pwa-kth-sp2" / "KTH-SP2-1996-2.1-cln.swf.gz"
    if not trace.is_file():
        pytest.skip(f"no trace at {trace} (set BURSAR_TRACES_DIR)")
    fast = _replay(trace, BURSAR_ACCEL_DIR=str(built))
    assert all(fast["active"].values()), fast
    # The schedule conservative backfill has always given this trace (as the pure one's
    # test in test_replay_policies.py).
    assert fast["digest"] == "2f55fb5307f839127f2903d7b2efd148a7b9cdf939519badf7841b2856749d3c"


def _fake_build(root: Path, sources: dict[str, str], python: str) -> Path:
    folder = root / "sim" / "replay" / accel.ACCEL_DIR
    folder.mkdir(parents=True)
    (folder / accel.MANIFEST).write_text(json.dumps({"python": python, "sources": sources}))
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
    with caplog.at_level(logging.WARNING, logger="bursar.sim.accel"):
        accel._warned.discard("bursar.sim.replay")
        assert not accel.use("bursar.sim.replay", path)
    assert path == [source_dir]
    assert "stale" in caplog.text and "make accel" in caplog.text

    # Built from this very source, for this Python: put first on the package's path.
    digest = accel._digest(Path(source_dir, "profile.py"))
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "fresh"))
    folder = _fake_build(tmp_path / "fresh", {"profile": digest}, tag)
    path = [source_dir]
    assert accel.use("bursar.sim.replay", path)
    assert path == [str(folder), source_dir]

    # For another Python, or with BURSAR_PURE: the source.
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "other"))
    _fake_build(tmp_path / "other", {"profile": digest}, "cpython-399")
    assert not accel.use("bursar.sim.replay", [source_dir])
    monkeypatch.setenv("BURSAR_ACCEL_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("BURSAR_PURE", "1")
    assert not accel.use("bursar.sim.replay", [source_dir])


def test_without_a_compiler_the_build_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")
    with pytest.raises(RuntimeError, match="no C compiler"):
        accel.build(tmp_path)
    assert not any(tmp_path.iterdir())
