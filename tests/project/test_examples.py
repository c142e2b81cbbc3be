"""The examples as a new user runs them: ``bursar serve`` with its defaults in one terminal,
``python examples/X.py`` in another, in the same directory; without the extra an example
says in one line what to install; the example configs start the backend they are for, and
a start that fails leaves nothing behind.

Two things are the test's, not the user's: the broker listens on a free port (the examples
find it through ``BURSAR_TARGET``, as the CLI does), and metrics and dashboard on any port.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BURSAR = Path(sys.executable).parent / "bursar"
ANY_PORTS = ("--metrics-port", "0", "--dashboard-port", "0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURSAR_")}
    # `python` and the executables Parsl and Dask start are this interpreter's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["BURSAR_TARGET"] = f"127.0.0.1:{port}"
    return env


def _serve(cwd: Path, port: int, *args: str) -> subprocess.Popen[str]:
    """``bursar serve ARGS`` in ``cwd`` on ``port``, once it says it is listening."""
    out = (cwd / "serve.out").open("w")
    proc = subprocess.Popen(
        [str(BURSAR), "serve", *args, "--port", str(port), *ANY_PORTS],
        cwd=cwd,
        env=_env(port),
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while "listening on" not in (cwd / "serve.out").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"bursar serve did not start: {(cwd / 'serve.out').read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@pytest.fixture
def default_broker(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """Plain ``bursar serve`` (the packaged demo pool, state in ./state) in a clean
    directory; the directory and the port."""
    port = _free_port()
    proc = _serve(tmp_path, port)
    try:
        yield tmp_path, port
    finally:
        assert _stop(proc) == 0, (tmp_path / "serve.out").read_text()[-2000:]


def _run_example(name: str, cwd: Path, port: int) -> subprocess.CompletedProcess[str]:
    # As the docstring says: `python examples/X.py`, in the directory `bursar serve` runs in.
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=cwd,
        env=_env(port),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _docstring(name: str) -> str:
    doc = ast.get_docstring(ast.parse((EXAMPLES / name).read_text(encoding="utf-8")))
    assert doc is not None
    return doc


@pytest.mark.parametrize(
    ("name", "extra"), [("parsl_config_swap.py", "parsl"), ("dask_bursar_cluster.py", "dask")]
)
def test_each_docstring_says_the_extra_and_the_commands(name: str, extra: str) -> None:
    _, needs, serve, _, run = _docstring(name).split("\n\n")[:5]
    assert f"pip install 'bursar-broker[{extra}]'" in needs
    assert serve.strip() == "bursar serve"
    assert run.strip() == f"python examples/{name}"


@pytest.mark.slow
def test_the_parsl_example_runs_against_plain_bursar_serve(
    default_broker: tuple[Path, int],
) -> None:
    cwd, port = default_broker
    res = _run_example("parsl_config_swap.py", cwd, port)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    local, leased = re.findall(r"40 tasks \+ 1 dependent in .* s: (\{.*\})", res.stdout)
    assert ast.literal_eval(local) == {"local": 40}
    # Every task ran in a worker of a lease of the demo's campaign.
    by_lease = ast.literal_eval(leased)
    assert sum(by_lease.values()) == 40 and all(k.startswith("L") for k in by_lease)
    assert f"the broker at 127.0.0.1:{port}, campaign adaptive-sci" in res.stdout


@pytest.mark.slow
def test_the_dask_example_runs_against_plain_bursar_serve(
    default_broker: tuple[Path, int],
) -> None:
    cwd, port = default_broker
    res = _run_example("dask_bursar_cluster.py", cwd, port)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "LocalCluster:" in res.stdout and "BursarCluster:" in res.stdout
    assert "same results" in res.stdout


@pytest.mark.parametrize("name", ["parsl_config_swap.py", "dask_bursar_cluster.py"])
def test_without_a_running_broker_the_example_says_where_the_token_comes_from(
    tmp_path: Path, name: str
) -> None:
    res = _run_example(name, tmp_path, _free_port())
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: cannot read the token file state/tokens.json: [Errno 2] No such file or "
        "directory: 'state/tokens.json'; start `bursar serve` in this directory first (it "
        "writes state/tokens.json), or pass --token-file"
    ]
    assert res.stdout == ""  # nothing ran first


# Runs the example given as argv[2] with the top-level module argv[1] made unimportable, as
# if its extra were not installed.
WITHOUT = """
import importlib.abc, runpy, sys
blocked, example = sys.argv[1], sys.argv[2]
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == blocked or name.startswith(blocked + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Absent())
sys.argv = [example]
runpy.run_path(example, run_name="__main__")
"""


@pytest.mark.parametrize(
    ("name", "blocked", "extra"),
    [
        ("parsl_config_swap.py", "parsl", "parsl"),
        ("dask_bursar_cluster.py", "dask", "dask"),
        ("dask_bursar_cluster.py", "dask_jobqueue", "dask"),
    ],
)
def test_a_missing_extra_is_one_line_naming_the_install_command(
    tmp_path: Path, name: str, blocked: str, extra: str
) -> None:
    res = subprocess.run(
        [sys.executable, "-c", WITHOUT, blocked, str(EXAMPLES / name)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1
    assert res.stderr.splitlines() == [
        f"error: this example needs {blocked}, which is not installed: "
        f"pip install 'bursar-broker[{extra}]'"
    ]


# ---------------------------------------------------------------------------------------
# bursar serve: the example configs, and starts that fail


def test_serve_backend_local_without_a_config_is_one_error_and_makes_nothing(
    tmp_path: Path,
) -> None:
    res = subprocess.run(
        [str(BURSAR), "serve", "--backend", "local"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    (line,) = res.stderr.splitlines()
    assert line.startswith("error: --backend local needs --config FILE")
    assert list(tmp_path.iterdir()) == []


def test_serve_refuses_a_local_config_made_from_the_demo_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    demo = subprocess.run(
        [str(BURSAR), "config", "show-default"], capture_output=True, text=True, check=True
    ).stdout
    (tmp_path / "mine.toml").write_text(demo)
    res = subprocess.run(
        [str(BURSAR), "serve", "--backend", "local", "--config", "mine.toml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "NOTICE" not in res.stderr and "Slurm" not in res.stderr
    assert "mine.toml: pool.groups: the local backend discovers the nodes" in res.stderr
    assert "also policy.power_down_idle_s: the local backend's machine" in res.stderr
    assert "(checked for the local backend, from --backend)" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.toml"]  # no state/


def test_a_start_that_fails_after_making_its_directories_removes_them(tmp_path: Path) -> None:
    """The port is taken: the state directory given (there before) stays as it was; the
    local backend's run directory (made by this start) goes."""
    state = tmp_path / "state"
    state.mkdir()
    where = ("--config", str(EXAMPLES / "local.toml"), "--state-dir", str(state))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [str(BURSAR), "serve", *where, "--port", str(port), *ANY_PORTS],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 2, res.stderr
    assert "cannot be bound" in res.stderr
    assert state.is_dir() and list(state.iterdir()) == []
    # A new state directory that the failed start made is gone too.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = subprocess.run(
            [str(BURSAR), "serve", "--port", str(port), *ANY_PORTS],
            cwd=fresh,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert res.returncode == 2 and "cannot be bound" in res.stderr
    assert list(fresh.iterdir()) == []


def test_serve_starts_the_local_example_config_for_its_backend_key(tmp_path: Path) -> None:
    # No --backend: the file's `backend = "local"` picks the backend.
    proc = _serve(tmp_path, _free_port(), "--config", str(EXAMPLES / "local.toml"))
    try:
        out = (tmp_path / "serve.out").read_text()
        assert "local backend:" in out and "NOTICE" not in out
        assert "issued tokens for adaptive-sci, backfill" in out
    finally:
        assert _stop(proc) == 0
    assert "stopped; journal closed" in (tmp_path / "serve.out").read_text()


def test_an_explicit_backend_wins_over_the_files_key(tmp_path: Path) -> None:
    res = subprocess.run(
        [str(BURSAR), "serve", "--backend", "simulated", "--config", str(EXAMPLES / "local.toml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "local.toml: pool: required key is missing" in res.stderr
    assert "(checked for the simulated backend, from --backend)" in res.stderr
    assert list(tmp_path.iterdir()) == []
