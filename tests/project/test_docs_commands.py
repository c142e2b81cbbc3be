"""The documentation's shell sequences for serving and using the broker, run as written.

Two sequences, each against a real ``bursar serve`` on the packaged config, so that the
docs cannot drift from what works:

* every ``sh`` block of the guide pages in ``PAGES`` (the service, live policy changes, the
  command line, the shipped trace), in that order, in a clean directory;
* the README's "first hour" (between its ``first-hour`` snippet markers, which the site's
  Getting started page includes), in a fresh copy of what a clone holds that it uses (the
  examples), with no ``../shared`` beside it.

A block of ``bursar serve`` lines (after an optional ``. .venv/bin/activate``) starts the
broker in the background, as a reader runs it in a terminal of its own; any other block
runs as one bash script (``set -eo pipefail``) and must exit 0. A block marked
``<!-- docs-test: skip: why -->`` on the line above it is not run (long runs, a Slurm
cluster, an extra the test cannot rely on).

What is the test's, not the docs': ``bursar`` and ``python`` on PATH are this interpreter,
``bursar serve`` gets the test's free ports appended (so parallel runs do not collide), and
the clients find the broker through ``BURSAR_TARGET``. For the first hour these two live in
the copy's ``.venv/bin``, whose ``activate`` puts them first on PATH; nothing else of this
interpreter's environment is on PATH, so a block that forgets to activate fails.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
PAGES = (
    "docs/operators/service.md",
    "docs/operators/policy.md",
    "docs/guides/cli.md",
    "docs/operators/traces.md",
)
# Commands the README's "Service" and "Client and command line" sections ran before the
# docs site: each must still be in a block that runs.
FORMERLY_RUN = (
    "bursar serve --state-dir state",
    "bursar policy --admin-token-file state/admin.token show",
    "bursar policy --admin-token-file state/admin.token apply --config policy-45.toml --dry-run",
    "bursar config show-default | sed 's/^grace_s = 30$/grace_s = 45/' > policy-45.toml",
    "bursar acquire --size gpu=8 --duration 600 --",
    "bursar acquire --size gpu=8,cpu=64 -- sh -c 'bursar renew \"$BURSAR_LEASE_ID\" --duration 1200'",
    "bursar acquire --size gpu=8 -- sh -c 'bursar release \"$BURSAR_LEASE_ID\"'",
    "bursar status --json",
    "whatif --size gpu=16 --duration 3600",
    "update adaptive-sci --envelope gpu:burst=64 --what-if",
)
FIRST_HOUR = re.compile(
    r"<!-- --8<-- \[start:first-hour\] -->\n(.*?)<!-- --8<-- \[end:first-hour\] -->", re.S
)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(.+?)\s*-->")
_SHELL_FENCES = ("```sh", "```bash", "```shell")
_ACTIVATE = ". .venv/bin/activate"


@dataclass(frozen=True)
class Block:
    where: str
    text: str
    skip: str | None

    @property
    def commands(self) -> list[str]:
        return [c for c in self.text.splitlines() if c.strip() and not c.startswith("#")]

    @property
    def serves(self) -> bool:
        rest = [c for c in self.commands if c.strip() != _ACTIVATE]
        return bool(rest) and all(c.startswith("bursar serve") for c in rest)


def shell_blocks(text: str, name: str) -> list[Block]:
    """The shell blocks of a Markdown text, in document order, with their skip markers."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() in _SHELL_FENCES:
            indent = len(line) - len(line.lstrip())
            j = i + 1
            body = []
            while lines[j].strip() != "```":
                body.append(lines[j][indent:])
                j += 1
            above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            marker = _SKIP.search(above)
            out.append(Block(f"{name}:{i + 1}", "\n".join(body), marker and marker.group(1)))
            i = j
        i += 1
    return out


def page_blocks() -> list[Block]:
    return [b for page in PAGES for b in shell_blocks((ROOT / page).read_text(), page)]


def first_hour_blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    m = FIRST_HOUR.search(text)
    assert m, "README.md: the first-hour snippet markers are missing"
    offset = text[: m.start(1)].count("\n")
    blocks = shell_blocks(m.group(1), "README.md")
    # Line numbers relative to the README, not to the section.
    return [
        Block(f"README.md:{int(b.where.rsplit(':', 1)[1]) + offset}", b.text, b.skip)
        for b in blocks
    ]


def test_the_blocks_are_found_and_each_is_run_or_marked() -> None:
    for blocks in (page_blocks(), first_hour_blocks()):
        run = [b for b in blocks if b.skip is None]
        assert run and run[0].serves, "the first sequence run starts the broker"
        assert any(not b.serves for b in run)
        for b in blocks:
            assert b.skip is None or len(b.skip) > 5, f"{b.where}: say why it is skipped"
    ran = "\n".join(b.text for b in page_blocks() if b.skip is None)
    missing = [c for c in FORMERLY_RUN if c not in ran]
    assert not missing, f"no longer run from {PAGES}: {missing}"
    # The first hour is the README's walk through a running broker.
    hour = "\n".join(b.text for b in first_hour_blocks() if b.skip is None)
    for command in (
        "bursar serve",
        "bursar acquire --size gpu=8 --duration 600 --",
        "bursar leases list --pending",
        "export BURSAR_TOKEN_FILE=state/tokens.json",
    ):
        assert command in hour, command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shims(bin_dir: Path, port: int) -> None:
    """``bursar`` and ``python`` for the blocks: this interpreter; serve on the test's port."""
    bin_dir.mkdir(parents=True)
    bursar = bin_dir / "bursar"
    bursar.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "from bursar.cli.main import main\n"
        "args = sys.argv[1:]\n"
        "if args[:1] == ['serve']:\n"
        f"    args += ['--port', '{port}', '--metrics-port', '0', '--dashboard-port', '0']\n"
        "sys.exit(main(args, prog_name='bursar'))\n"
    )
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for f in (bursar, python):
        f.chmod(f.stat().st_mode | stat.S_IXUSR)


def _env(path_first: Path | None, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSAR_", "VIRTUAL_ENV"))}
    # This interpreter's own bin is never on PATH: the blocks get bursar from the shims.
    ours = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    env["PATH"] = os.pathsep.join(([str(path_first)] if path_first else []) + path)
    env["BURSAR_TARGET"] = f"127.0.0.1:{port}"
    env["COLUMNS"] = "100"
    return env


def _start(
    prelude: str, command: str, cwd: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[str]:
    out = log.with_suffix(".out")
    err = log.with_suffix(".err")
    proc = subprocess.Popen(
        ["bash", "-c", f"{prelude}\nexec {command}"],
        cwd=cwd,
        env=env,
        stdout=out.open("w"),
        stderr=err.open("w"),
        text=True,
    )
    deadline = time.monotonic() + 60
    while "listening on" not in out.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{command!r} did not start: {err.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


@contextmanager
def _servers() -> Iterator[list[subprocess.Popen[str]]]:
    servers: list[subprocess.Popen[str]] = []
    try:
        yield servers
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in servers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert all(p.returncode == 0 for p in servers)


def _run_blocks(
    blocks: list[Block], work: Path, env: dict[str, str], logs: Path, bursar: Path
) -> None:
    with _servers() as servers:
        for n, block in enumerate(blocks):
            if block.skip is not None:
                continue
            if block.serves:
                prelude = "\n".join(c for c in block.commands if c.strip() == _ACTIVATE)
                serve = [c for c in block.commands if c.strip() != _ACTIVATE]
                for k, command in enumerate(serve):
                    log = logs / f"serve{n}-{k}.log"
                    servers.append(_start(prelude, command, work, env, log))
                err = (logs / f"serve{n}-0.err").read_text()
                assert "NOTICE: serving the packaged 512-GPU demo pool" in err, block.where
                continue
            res = subprocess.run(
                ["bash", "-eo", "pipefail", "-c", block.text],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert res.returncode == 0, (
                f"{block.where} failed ({res.returncode}):\n{block.text}\n"
                f"--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
            )
            assert "Traceback" not in res.stderr, f"{block.where}:\n{res.stderr[-3000:]}"
        assert servers, "no block started the broker"
    # What the sequences did is all in the journal, and it re-derives.
    audit = subprocess.run(
        [str(bursar), "journal", "audit", "--state-dir", "state"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert audit.returncode == 0, audit.stderr


def test_guide_sequences_run_as_written(tmp_path: Path) -> None:
    port = _free_port()
    bin_dir = tmp_path / "bin"
    _shims(bin_dir, port)
    work = tmp_path / "work"
    work.mkdir()
    _run_blocks(page_blocks(), work, _env(bin_dir, port), tmp_path, bin_dir / "bursar")


def test_the_readme_first_hour_runs_as_written_from_a_fresh_clone(tmp_path: Path) -> None:
    port = _free_port()
    # What the first hour reads of a clone: the examples; .venv as `make demo` leaves it,
    # with the test's shims in its bin. Beside the copy there is no ../shared.
    clone = tmp_path / "bursar"
    shutil.copytree(ROOT / "examples", clone / "examples")
    venv_bin = clone / ".venv" / "bin"
    _shims(venv_bin, port)
    (venv_bin / "activate").write_text(
        f'VIRTUAL_ENV="{clone / ".venv"}"\nexport VIRTUAL_ENV\n'
        f'PATH="{venv_bin}:$PATH"\nexport PATH\n'
    )
    assert not (tmp_path / "shared").exists()
    env = _env(None, port)
    assert shutil.which("bursar", path=env["PATH"]) is None, "bursar must come from activate"
    _run_blocks(first_hour_blocks(), clone, env, tmp_path, venv_bin / "bursar")
