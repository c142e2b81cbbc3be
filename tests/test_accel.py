"""The compiled engine (scripts/build_accel.py, mypyc) against the pure one: the same
seeded workload through both gives byte-identical journals, the same snapshot state and
the same replay digests; a snapshot of either loads in the other; a stale build is
refused.

Each build runs in its own process (the choice is made once per process, from
``BURSAR_ACCEL``): this file is also the workload script those processes run. The build
is made once for the session (about a minute on 2 cores), or reused where
``build/accel`` is already fresh. Skipped where mypyc or a C compiler is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[1].parent / "shared" / "traces"
)
KTH = "pwa-kth-sp2/KTH-SP2-1996-2.1-cln.swf.gz"
EVENTS = 3000


# ---------------------------------------------------------------------- the workload


def workload(seed: int, n_events: int) -> list[object]:
    """A seeded mix over a 64-node pool (bench_engine's, smaller): campaigns of every
    class, shaped and plain requests, releases, renewals, cancels, meters, ticks and a
    node lost and back. Lease ids are the engine's own (L1, L2, ...), so the workload can
    name them without running the engine."""
    from bursar.broker import events as ev
    from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
    from bursar.broker.shape import Shape

    rng = random.Random(seed)
    classes = (LeaseClass.INTERACTIVE, LeaseClass.BATCH, LeaseClass.OPPORTUNISTIC)
    out: list[object] = []
    names = [f"c{i:02d}" for i in range(40)]
    for i, name in enumerate(names):
        env = {
            "gpu": DimEnvelope(2.0 if i % 4 == 0 else 0.0, 6.0, 64.0, 50_000.0),
            "cpu": DimEnvelope(0.0, 48.0, 512.0, None),
            "mem_gb": DimEnvelope(0.0, 400.0, 4096.0, None),
            "fs_bw": DimEnvelope(0.0, 100.0, 400.0, 10_000.0),
        }
        out.append(ev.CreateCampaign(0.0, CampaignSpec(name, env, classes[i % 3], i % 10 == 9)))
    t, requests = 1.0, 0
    for _ in range(n_events):
        t += rng.choice((0.01, 0.5, 3.0))
        r = rng.random()
        some = f"L{rng.randint(1, requests)}" if requests else "L1"
        e: object
        if r < 0.22:
            e = ev.Release(t, some)
        elif r < 0.32:
            e = ev.Renew(t, some, rng.choice((300.0, 600.0)))
        elif r < 0.37:
            e = ev.CancelRequest(t, some)
        elif r < 0.42:
            e = ev.Meter(t, rng.choice(names), "fs_bw", rng.choice((50.0, 300.0)))
        elif r < 0.47:
            t += rng.choice((5.0, 60.0, 600.0))
            e = ev.Tick(t)
        elif r < 0.475:
            e = ev.NodeLost(t, f"n{rng.randint(0, 63):04d}")
        elif r < 0.48:
            e = ev.NodeReady(t, f"n{rng.randint(0, 63):04d}")
        else:
            requests += 1
            shape = None
            size: dict[str, float] = {"gpu": rng.choice((1, 2, 4, 8, 12))}
            if rng.random() < 0.2:
                shape = Shape(nodes=2, per_node={"gpu": 4})
                size = {}
            elif rng.random() < 0.2:
                size["cpu"] = rng.choice((4, 16.5))
            e = ev.RequestLease(
                t,
                rng.choice(names),
                size,
                rng.uniform(60, 3600),
                blocking=rng.random() < 0.8,
                shape=shape,
            )
        out.append(e)
    return out


def run_journal(out: Path, seed: int = 7, n_events: int = EVENTS) -> dict[str, object]:
    """Apply the workload through the engine into a journal at ``out/journal.sqlite``;
    write the final engine's snapshot bytes to ``out/state.pickle``."""
    from bursar.broker import accel, snapshot
    from bursar.broker.engine import Engine
    from bursar.broker.errors import RequestError
    from bursar.broker.journal import Journal
    from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

    pool = PoolSpec(
        groups=(
            NodeGroup(count=48, resources={"gpu": 8, "cpu": 64, "mem_gb": 512}, warm=40),
            NodeGroup(count=16, resources={"gpu": 4, "cpu": 32, "mem_gb": 256}, warm=0),
        ),
        boot_latency_s=60.0,
    )
    policy = PolicySpec(grace_s=30.0, warm_headroom={"gpu": 8})
    eng = Engine(pool, policy)
    refused = 0
    with Journal.open(out / "journal.sqlite", pool, policy) as j:
        for e in workload(seed, n_events):
            try:
                outcome = eng.apply(e)  # type: ignore[arg-type]
            except RequestError:
                refused += 1
                continue
            j.append(e, outcome)  # type: ignore[arg-type]
    state = snapshot.capture(eng)
    (out / "state.pickle").write_bytes(state)
    return {
        "accel": sorted(accel.active()),
        "refused": refused,
        "fingerprint": snapshot.fingerprint(eng),
    }


def load_state(path: Path) -> dict[str, object]:
    """Load snapshot bytes another process wrote; its fingerprint as this build sees it."""
    from bursar.broker import accel, safe_pickle, snapshot

    eng = safe_pickle.loads(path.read_bytes())
    return {"accel": sorted(accel.active()), "fingerprint": snapshot.fingerprint(eng)}


def run_replay(trace: Path, policy: str, limit: int) -> dict[str, object]:
    from bursar.broker import accel
    from bursar.sim.replay.run import replay_trace

    r = replay_trace(trace, policy, strict=True, limit=limit)
    return {"accel": sorted(accel.active()), "manifest": r.manifest, "metrics": r.metrics}


def serve() -> None:
    """One line per workload on stdin (``seed n_events dir``), one line of JSON back: the
    hash of the journal's entries as stored and the final state's fingerprint."""
    from bursar.broker.journal import Journal

    for line in sys.stdin:
        seed, n, folder = line.split()
        out = Path(folder)
        out.mkdir(parents=True)
        result = run_journal(out, int(seed), int(n))
        with Journal.open(out / "journal.sqlite") as j:
            h = hashlib.sha256()
            for _, e, d in j.raw_entries(0):
                h.update(f"{e}\n{d}\n".encode())
        result["entries_sha256"] = h.hexdigest()
        print(json.dumps(result, sort_keys=True), flush=True)


def _child_main(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "serve":
        serve()
        return
    if mode == "journal":
        result = run_journal(Path(args[0]))
    elif mode == "load":
        result = load_state(Path(args[0]))
    else:
        result = run_replay(Path(args[0]), args[1], int(args[2]))
    print(json.dumps(result, sort_keys=True, default=str))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
    raise SystemExit(0)


# ---------------------------------------------------------------------- the tests

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bursar.broker import accel  # noqa: E402
from bursar.broker.journal import Journal  # noqa: E402


def _no_toolchain() -> str | None:
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install -e '.[accel]')"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers"
    return None


pytestmark = pytest.mark.skipif(_no_toolchain() is not None, reason=str(_no_toolchain()))


@pytest.fixture(scope="session")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh compiled build: ``build/accel`` if it is fresh, else one made for the run."""
    try:
        accel.check(accel.DEFAULT_DIR)
        return accel.DEFAULT_DIR
    except accel.StaleBuild:
        pass
    out = tmp_path_factory.mktemp("accel")
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_accel.py"), "--out", str(out)],
        check=True,
        timeout=900,
    )
    return out


def _env(build: Path | None, mode: str) -> dict[str, str]:
    env = dict(os.environ)
    env["BURSAR_ACCEL"] = mode
    if build is not None:
        env["BURSAR_ACCEL_DIR"] = str(build)
    return env


def _child(build: Path, compiled: bool, *args: str) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        env=_env(build, "require" if compiled else "0"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert bool(result["accel"]) is compiled
    if compiled:
        assert "bursar.broker.engine" in result["accel"], "the engine itself was not compiled"
    return result


def _entries(path: Path) -> list[tuple[str, str]]:
    with Journal.open(path) as j:
        return [(e, d) for _, e, d in j.raw_entries(0)]


def test_pure_and_compiled_journals_and_snapshots_are_byte_identical(
    build_dir: Path, tmp_path: Path
) -> None:
    pure, comp = tmp_path / "pure", tmp_path / "compiled"
    pure.mkdir()
    comp.mkdir()
    a = _child(build_dir, False, "journal", str(pure))
    b = _child(build_dir, True, "journal", str(comp))
    ea, eb = _entries(pure / "journal.sqlite"), _entries(comp / "journal.sqlite")
    assert len(ea) > EVENTS // 2
    for n, (x, y) in enumerate(zip(ea, eb, strict=True), 1):
        assert x == y, f"entry {n} differs:\npure:     {x}\ncompiled: {y}"
    assert a["refused"] == b["refused"]
    assert a["fingerprint"] == b["fingerprint"]
    # The snapshot bytes themselves may differ (sets pickle in the process's hash-seed
    # order, two pure runs too; the compiled code shares strings differently): the state
    # they hold is what must agree. A snapshot of either build loads in the other to it.
    assert (
        _child(build_dir, True, "load", str(pure / "state.pickle"))["fingerprint"]
        == (a["fingerprint"])
    )
    assert (
        _child(build_dir, False, "load", str(comp / "state.pickle"))["fingerprint"]
        == (b["fingerprint"])
    )


class _Worker:
    """A child process of one build, answering workloads one at a time."""

    def __init__(self, build: Path, compiled: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "serve"],
            env=_env(build, "require" if compiled else "0"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, seed: int, n: int, folder: Path) -> dict[str, object]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{seed} {n} {folder}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the worker died (its stderr is above)"
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def workers(build_dir: Path) -> Iterator[tuple[_Worker, _Worker]]:
    pair = (_Worker(build_dir, False), _Worker(build_dir, True))
    yield pair
    for w in pair:
        w.close()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400))
def test_any_seeded_workload_gives_the_same_journal_in_both_builds(
    workers: tuple[_Worker, _Worker], tmp_path_factory: pytest.TempPathFactory, seed: int, n: int
) -> None:
    folder = tmp_path_factory.mktemp("w")
    a = workers[0].run(seed, n, folder / "pure")
    b = workers[1].run(seed, n, folder / "compiled")
    assert not a["accel"] and "bursar.broker.engine" in b["accel"]
    for key in ("entries_sha256", "fingerprint", "refused"):
        assert a[key] == b[key], key


@pytest.mark.parametrize(("policy", "limit"), [("easy", 20_000), ("bursar", 1_500)])
def test_pure_and_compiled_replays_have_the_same_digests(
    build_dir: Path, policy: str, limit: int
) -> None:
    trace = TRACES / KTH
    if not trace.is_file():
        pytest.skip(f"no trace at {trace} (set BURSAR_TRACES_DIR)")
    a = _child(build_dir, False, "replay", str(trace), policy, str(limit))
    b = _child(build_dir, True, "replay", str(trace), policy, str(limit))
    assert a["manifest"] == b["manifest"]
    assert a["metrics"] == b["metrics"]


@pytest.fixture
def stale_build(build_dir: Path, tmp_path: Path) -> Path:
    """The fresh build, its manifest saying one source was different when it was built."""
    lib = tmp_path / "stale" / "lib"
    shutil.copytree(build_dir / "lib", lib, symlinks=True)
    manifest = json.loads((lib / accel.MANIFEST).read_text())
    assert "broker/ledger.py" in manifest["sources"]
    manifest["sources"]["broker/ledger.py"] = "0" * 64
    (lib / accel.MANIFEST).write_text(json.dumps(manifest))
    return lib.parent


def _import_engine(build: Path | None, mode: str) -> subprocess.CompletedProcess[str]:
    code = "import bursar.broker.engine as e, bursar.broker.accel as a; print(len(a.active()))"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_env(build, mode),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_stale_build_is_refused_with_the_changed_file(stale_build: Path) -> None:
    with pytest.raises(accel.StaleBuild, match=r"stale: changed since it was built: broker/ledger"):
        accel.check(stale_build)
    warned = _import_engine(stale_build, "1")
    assert warned.returncode == 0, warned.stderr
    assert warned.stdout.strip() == "0"  # the pure engine
    assert "running the pure-Python engine" in warned.stderr
    assert "broker/ledger.py" in warned.stderr
    required = _import_engine(stale_build, "require")
    assert required.returncode != 0
    assert "StaleBuild" in required.stderr and "broker/ledger.py" in required.stderr


def test_no_build_and_no_flag(tmp_path: Path, build_dir: Path) -> None:
    missing = _import_engine(tmp_path / "nothing", "1")
    assert missing.returncode == 0 and missing.stdout.strip() == "0"
    assert "no compiled build" in missing.stderr
    off = _import_engine(build_dir, "0")  # built and fresh, but not asked for
    assert off.returncode == 0 and off.stdout.strip() == "0" and not off.stderr
    on = _import_engine(build_dir, "1")
    assert on.returncode == 0 and int(on.stdout) > 1 and not on.stderr
