"""Replay policy plug-ins: discovered through the real entry-point machinery, run through
``bursar replay``, scored by the kernel they cannot influence.

Each test puts distributions on ``sys.path`` the way an installer leaves them: a
``NAME-VERSION.dist-info`` folder with ``METADATA`` and ``entry_points.txt`` beside the
code, so ``importlib.metadata`` finds them as it finds any installed package. The example
plug-in's entry points are read from its own ``pyproject.toml``."""

from __future__ import annotations

import csv
import json
import os
import textwrap
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bursar.cli.main import main
from bursar.sim.replay.policies import GROUP, POLICIES, policy_names
from bursar.sim.replay.whatif import parse_candidate

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "replay-policy-plugin"
TRACES = Path(
    os.environ.get("BURSAR_TRACES_DIR")
    or Path(__file__).resolve().parents[2].parent / "shared" / "traces"
)
KTH = "pwa-kth-sp2/KTH-SP2-1996-2.1-cln.swf.gz"
LUBLIN = "lublin-synthetic/lublin_256.swf"

CHEATS = '''
"""Policies that cheat or break, each a factory(workload, config)."""
from bursar.sim.replay.policies.easy import Easy
from bursar.sim.replay.policies.fifo import Fifo

NUMBER = 42


class Oversize(Fifo):
    """Starts every queued job at once, whether it fits or not."""

    def schedule(self, now, free):
        out = list(self.queue)
        self.queue.clear()
        return out


class Early(Fifo):
    """Starts the job after the last one submitted, before its submission."""

    def __init__(self, w, config=None):
        super().__init__(w, config)
        self.seen = -1

    def submit(self, j, now):
        self.seen = j

    def schedule(self, now, free):
        return [self.seen + 1]


class Fractional(Fifo):
    def schedule(self, now, free):
        return [0.5]


class Crashes(Fifo):
    def schedule(self, now, free):
        raise RuntimeError("the queue fell over\\nsecond line")


def tamper(w, config):
    """Tries to change what the kernel and the metrics read, then runs EASY."""
    n = len(w)
    for attempt in (
        lambda: w.hold.__setitem__(0, 0.0),
        lambda: setattr(w, "hold", [0.0] * n),
        # Past the frozen dataclass: changes only the plug-in's own copy.
        lambda: object.__setattr__(w, "hold", (0.0,) * n),
        lambda: object.__setattr__(w, "submit", (0.0,) * n),
        lambda: object.__setattr__(w, "capacity", 10**9),
        lambda: object.__setattr__(config, "starvation_s", 0.0),
        lambda: config.overrides.__setitem__("user-1", None),
    ):
        try:
            attempt()
        except Exception:
            pass
    return Easy(w)


def shapeless(w, config):
    return object()
'''


def _dist(site: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    """Install a distribution's metadata the way pip leaves it in site-packages."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = [f"[{GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty site directory first on sys.path, with the cheats' module in it."""
    s = tmp_path / "site"
    s.mkdir()
    (s / "replay_cheats.py").write_text(textwrap.dedent(CHEATS))
    monkeypatch.syspath_prepend(str(s))
    return s


@pytest.fixture
def wfp3(site: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The example plug-in, as ``pip install examples/replay-policy-plugin`` registers it."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"][GROUP]
    _dist(site, project["name"], project["version"], eps)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    return {"name": project["name"], "version": project["version"], **eps}


@pytest.fixture
def traces() -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"no traces at {TRACES} (set BURSAR_TRACES_DIR)")
    return TRACES


def _replay(trace: Path, policy: str, out: Path, *extra: str) -> Result:
    args = ["replay", "--trace", str(trace), "--policy", policy, "--out", str(out), *extra]
    return CliRunner().invoke(main, args)


def _error_line(res: Result) -> str:
    """The one line a failed command printed, and that it printed only that."""
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


def test_example_plugin_replays_through_the_cli(
    wfp3: dict[str, str], traces: Path, tmp_path: Path
) -> None:
    assert policy_names()[: len(POLICIES)] == list(POLICIES)
    assert "wfp3" in policy_names()
    help_text = CliRunner().invoke(main, ["replay", "--help"]).output
    assert "|bursar-arrival|wfp3]" in help_text
    res = _replay(traces / KTH, "wfp3", tmp_path / "wfp3")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "wfp3" / "metrics.json").read_text())
    assert m["strict"] is True and m["jobs"] == 28475
    assert m["manifest"]["policy"] == "wfp3"
    assert m["manifest"]["plugin"] == {
        "distribution": "bursar-wfp3",
        "entry_point": f"wfp3 = {wfp3['wfp3']}",
        "group": GROUP,
        "version": "0.1.0",
    }
    # The metrics are the kernel's, of the schedule it recorded (the CSV rounds to 6
    # significant digits, hence the tolerance).
    with open(tmp_path / "wfp3" / "schedule.csv") as f:
        rows = list(csv.DictReader(f))
    waits = [float(r["start"]) - float(r["submit"]) for r in rows]
    assert m["mean_wait_s"] == pytest.approx(sum(waits) / len(waits), rel=1e-3, abs=1.0)
    # A different order than EASY's: the plug-in's own decisions, not a built-in's.
    easy = _replay(traces / KTH, "easy", tmp_path / "easy")
    assert easy.exit_code == 0, easy.output
    e = json.loads((tmp_path / "easy" / "metrics.json").read_text())
    assert "plugin" not in e["manifest"]
    assert (
        e["manifest"]["outputs"]["schedule_sha256"] != m["manifest"]["outputs"]["schedule_sha256"]
    )
    assert e["utilization"] == pytest.approx(m["utilization"], abs=0.02)


def test_example_plugin_in_fidelity_and_whatif(wfp3: dict[str, str], traces: Path) -> None:
    res = CliRunner().invoke(
        main, ["fidelity", "--trace", str(traces / KTH), "--policy", "wfp3", "--json"]
    )
    assert res.exit_code == 0, res.output
    f = json.loads(res.stdout)
    assert f["policy"] == "wfp3" and f["grade"] in ("high", "medium", "low")
    assert parse_candidate("policy=wfp3,capacity=64").policy == "wfp3"
    with pytest.raises(ValueError, match=r"unknown policy 'wfp4'.*allowed: fifo.*wfp3"):
        parse_candidate("policy=wfp4")


def test_a_plugin_cannot_change_what_the_referee_reads(
    site: Path, traces: Path, tmp_path: Path
) -> None:
    _dist(site, "tamper-policies", "1.0", {"tamper": "replay_cheats:tamper"})
    res = _replay(traces / LUBLIN, "tamper", tmp_path / "t")
    assert res.exit_code == 0, res.output
    res = _replay(traces / LUBLIN, "easy", tmp_path / "e")
    assert res.exit_code == 0, res.output
    t = json.loads((tmp_path / "t" / "metrics.json").read_text())
    e = json.loads((tmp_path / "e" / "metrics.json").read_text())
    # Its decisions are EASY's; the runtimes, submit times, capacity and config it tried
    # to change are the kernel's own, so every measure is EASY's too.
    tm, em = t.pop("manifest"), e.pop("manifest")
    assert t == e
    assert tm["outputs"] == em["outputs"]
    assert tm["config"] == em["config"] and tm["config_sha256"] == em["config_sha256"]
    assert tm["plugin"]["distribution"] == "tamper-policies"


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("replay_cheats:Oversize", "invariant broken: capacity never exceeded"),
        ("replay_cheats:Early", "invariant broken: no start before submit"),
        (
            "replay_cheats:Fractional",
            "schedule at t=0 returned 0.5; expected a list of job indices of the workload",
        ),
    ],
)
def test_a_cheating_plugin_is_caught_by_the_referee(
    site: Path, traces: Path, tmp_path: Path, entry: str, expected: str
) -> None:
    _dist(site, "cheat-policies", "6.6.6", {"cheat": entry})
    line = _error_line(_replay(traces / LUBLIN, "cheat", tmp_path / "c"))
    assert expected in line
    assert f"'cheat = {entry}' of cheat-policies 6.6.6" in line
    assert not (tmp_path / "c" / "metrics.json").exists()
    # Without strict checks nothing would catch it: a plug-in always replays strict.
    line = _error_line(_replay(traces / LUBLIN, "cheat", tmp_path / "c", "--no-strict"))
    assert "'cheat' is a plug-in (from cheat-policies): a plug-in always replays strict" in line


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            "no_such_module_here:Policy",
            "failed to import: ModuleNotFoundError: No module named 'no_such_module_here'",
        ),
        ("replay_cheats:Missing", "failed to import: AttributeError"),
        ("replay_cheats:NUMBER", "names an object of type int, not a factory"),
        (
            "replay_cheats:shapeless",
            "returned an object of type object without the replay policy interface",
        ),
        (
            "replay_cheats:Crashes",
            "raised in schedule at t=0: RuntimeError: the queue fell over second line",
        ),
    ],
)
def test_a_broken_plugin_is_one_line_and_the_builtins_still_run(
    site: Path, traces: Path, tmp_path: Path, entry: str, expected: str
) -> None:
    _dist(site, "broken-policies", "2.0", {"broken": entry})
    line = _error_line(_replay(traces / LUBLIN, "broken", tmp_path / "b"))
    assert (
        f"replay policy plug-in 'broken' (entry point 'broken = {entry}' of broken-policies 2.0)"
        in line
    )
    assert expected in line
    res = _replay(traces / LUBLIN, "easy", tmp_path / "e")
    assert res.exit_code == 0, res.output
    assert res.stderr == ""


def test_a_clash_or_a_shared_name_is_refused(site: Path, traces: Path, tmp_path: Path) -> None:
    _dist(site, "clash-policies", "1.0", {"easy": "replay_cheats:Oversize"})
    _dist(site, "twin-a", "1.0", {"twin": "replay_cheats:tamper"})
    _dist(site, "twin-b", "3.1", {"twin": "replay_cheats:tamper"})
    _dist(site, "odd-names", "1.0", {"With,Comma": "replay_cheats:tamper"})
    assert policy_names() == list(POLICIES)
    # The built-in runs, with one warning line per refused entry point.
    res = _replay(traces / LUBLIN, "easy", tmp_path / "e")
    assert res.exit_code == 0, res.output
    warnings = res.stderr.splitlines()
    assert len(warnings) == 3, res.stderr
    # In name order, whatever order the file system lists the distributions in.
    assert "'With,Comma'" in warnings[0] and "odd-names 1.0" in warnings[0]
    assert warnings[1] == (
        "warning: replay policy plug-in 'easy' (entry point 'easy = replay_cheats:Oversize' "
        "of clash-policies 1.0) refused: 'easy' is a built-in policy; rename the entry point"
    )
    assert warnings[2] == (
        "warning: replay policy plug-in 'twin' refused: twin-a 1.0 and twin-b 3.1 both "
        "register it; uninstall one or rename its entry point"
    )
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert "plugin" not in m["manifest"] and m["utilization"] <= 1
    res = _replay(traces / LUBLIN, "twin", tmp_path / "t")
    assert res.exit_code == 2
    assert "twin-a 1.0 and twin-b 3.1 both register it" in res.stderr
