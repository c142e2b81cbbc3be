"""The trace shipped in the package (``sample``: the first 10,000 jobs of KTH-SP2) and how
the replay commands turn a catalogue name into a file: ``bursar replay``, ``fidelity`` and
``whatif`` run on ``sample`` with nothing downloaded, the slice is what the script cuts from
the published log, and a name not fetched says how to fetch it.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bursar.cli.main import main
from bursar.sim.replay.catalog import SAMPLE_JOBS, entry, packaged_path

ROOT = Path(__file__).resolve().parent.parent.parent
SHARED = Path(os.environ.get("BURSAR_TRACES_DIR") or ROOT.parent / "shared" / "traces")
SAMPLE = packaged_path(entry("sample"))
KTH = entry("kth-sp2").files[0]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def bursar(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_the_sample_is_small_attributed_and_a_whole_slice() -> None:
    assert SAMPLE.stat().st_size <= 256 * 1024
    text = gzip.decompress(SAMPLE.read_bytes()).decode()
    header = [ln for ln in text.splitlines() if ln.startswith(";")]
    jobs = [ln for ln in text.splitlines() if ln and not ln.startswith(";")]
    assert len(jobs) == SAMPLE_JOBS
    assert header[0].startswith(f"; Slice: the first {SAMPLE_JOBS} job lines of KTH-SP2")
    assert "; Acknowledge: Lars Malinowsky" in header
    assert "; MaxProcs: 100" in header


def test_the_sample_is_what_the_script_cuts_from_the_published_log(tmp_path: Path) -> None:
    published = SHARED / KTH.path
    if not published.is_file():
        pytest.skip(f"no traces at {SHARED} (set BURSAR_TRACES_DIR)")
    out = tmp_path / "slice.swf.gz"
    script = ROOT / "scripts" / "slice_trace.py"
    subprocess.run([sys.executable, str(script), str(published), str(out)], check=True)
    # The texts, not the gzip bytes: another zlib may compress the same text differently.
    assert gzip.decompress(out.read_bytes()) == gzip.decompress(SAMPLE.read_bytes())
    # And the script refuses a file that is not the published log.
    bad = tmp_path / "other.swf.gz"
    bad.write_bytes(SAMPLE.read_bytes())
    r = subprocess.run(
        [sys.executable, str(script), str(bad), str(tmp_path / "x.swf.gz")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "not the published KTH-SP2" in r.stderr
    assert not (tmp_path / "x.swf.gz").exists()


def test_the_wheel_carries_the_sample() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = tool["package-data"]["bursar.sim.replay"]
    rel = SAMPLE.relative_to(ROOT / "sim" / "replay").as_posix()
    assert any(fnmatch.fnmatch(rel, g) for g in globs), (rel, globs)


def test_replay_sample_runs_with_nothing_fetched(tmp_path: Path) -> None:
    out = tmp_path / "replay"
    r = bursar("replay", "--trace", "sample", "--policy", "easy", "--out", str(out))
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["jobs"] == SAMPLE_JOBS
    given = json.loads((out / "manifest.json").read_text())["input"]
    assert given == {"trace": SAMPLE.name, "sha256": _sha(SAMPLE)}


def test_fidelity_sample_grades_the_replay() -> None:
    r = bursar("fidelity", "--trace", "sample", "--json")
    assert r.exit_code == 0, r.output
    verdict = json.loads(r.output)
    assert verdict["grade"] in ("high", "medium", "low")
    assert verdict["measures"]["jobs"] == SAMPLE_JOBS


@pytest.mark.slow
def test_whatif_sample_compares_a_candidate(tmp_path: Path) -> None:
    out = tmp_path / "whatif"
    r = bursar("whatif", "--trace", "sample", "--candidate", "capacity=120", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "capacity=120: " in r.output
    doc = json.loads((out / "whatif.json").read_text())
    assert [c["label"] for c in doc["candidates"]] == ["capacity=120"]


def test_a_name_not_fetched_says_how_to_fetch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./traces here
    monkeypatch.setenv("BURSAR_TRACES_DIR", str(tmp_path / "none"))
    for cmd in (
        ["replay", "--policy", "easy", "--trace", "kth-sp2"],
        ["fidelity", "--trace", "kth-sp2"],
        ["whatif", "--candidate", "capacity=120", "--trace", "kth-sp2"],
        ["matrix", "--policy", "easy", "--trace", "kth-sp2"],
    ):
        r = bursar(*cmd)
        assert r.exit_code == 1, (cmd, r.output)
        assert "trace kth-sp2 is not fetched" in r.output
        assert "run: bursar traces fetch kth-sp2" in r.output
    r = bursar("replay", "--policy", "easy", "--trace", "kth-sp2", "--traces", "mine")
    assert "run: bursar traces fetch kth-sp2 --to mine" in r.output
    # The matrix's default traces are catalogue names too.
    r = bursar("matrix", "--policy", "easy")
    assert "run: bursar traces fetch ctc-sp2" in r.output
    # A word that is neither a file nor a name; an ElasticFlow table is not a job log.
    r = bursar("replay", "--policy", "easy", "--trace", "kth")
    assert r.exit_code == 1 and "no catalogue trace called kth" in r.output
    assert "sample, ctc-sp2, sdsc-sp2, hpc2n, kth-sp2" in r.output
    r = bursar("replay", "--policy", "easy", "--trace", "cluster05")
    assert r.exit_code == 1 and "use: bursar sim elastic --trace cluster05" in r.output
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_fetched_name_is_found_under_traces_and_a_path_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ./traces (where `bursar traces fetch` writes) comes before the shared folder.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BURSAR_TRACES_DIR", str(tmp_path / "none"))
    local = tmp_path / "traces" / KTH.path
    local.parent.mkdir(parents=True)
    local.write_bytes(SAMPLE.read_bytes())  # any SWF will do: the name resolves to the path
    r = bursar("replay", "--policy", "easy", "--trace", "kth-sp2", "--limit", "100")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "out/replay/manifest.json").read_text())
    assert manifest["input"] == {"trace": Path(KTH.path).name, "sha256": _sha(local)}
    # A path is a path, as before.
    r = bursar("replay", "--policy", "easy", "--trace", str(SAMPLE), "--limit", "100")
    assert r.exit_code == 0, r.output
