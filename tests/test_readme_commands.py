"""The README's shell sequences for serving and using the broker, run as written.

Every ``sh`` block of the "Service" and "Client and command line" sections is extracted
from README.md (so the docs cannot drift from what works) and run in order, in a clean
directory, against a real ``bursar serve`` on the packaged config: a block of ``bursar
serve`` lines starts the broker in the background; any other block runs as one bash script
(``set -eo pipefail``) and must exit 0. A block marked ``<!-- readme-test: skip: why -->``
on the line above it is not run (benchmarks, long runs, a Slurm cluster).

Two things are the test's, not the README's: ``bursar`` and ``python`` on PATH are this
interpreter, and ``bursar serve`` gets the test's free ports appended (so parallel runs do
not collide); the clients find the broker through ``BURSAR_TARGET``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = ("Service", "Client and command line")
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip:\s*(.+?)\s*-->")
_SHELL_FENCES = ("```sh", "```bash", "```shell")


@dataclass(frozen=True)
class Block:
    section: str
    line: int
    text: str
    skip: str | None

    @property
    def serves(self) -> bool:
        commands = [c for c in self.text.splitlines() if c.strip() and not c.startswith("#")]
        return bool(commands) and all(c.startswith("bursar serve") for c in commands)


def readme_blocks(text: str) -> list[Block]:
    """The shell blocks of SECTIONS, in document order, with their skip markers."""
    lines = text.splitlines()
    out: list[Block] = []
    section: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            title = line[3:].strip()
            section = title if title in SECTIONS else None
        if section is not None and line.strip() in _SHELL_FENCES:
            indent = len(line) - len(line.lstrip())
            j = i + 1
            body = []
            while lines[j].strip() != "```":
                body.append(lines[j][indent:])
                j += 1
            above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            marker = _SKIP.search(above)
            out.append(Block(section, i + 1, "\n".join(body), marker and marker.group(1)))
            i = j
        i += 1
    return out


def test_the_sections_blocks_are_found_and_each_is_run_or_marked() -> None:
    blocks = readme_blocks(README.read_text(encoding="utf-8"))
    assert {b.section for b in blocks} == set(SECTIONS)
    run = [b for b in blocks if b.skip is None]
    assert run and run[0].serves, "the first sequence run starts the broker"
    assert any(b.section == "Client and command line" and not b.serves for b in run)
    for b in blocks:
        assert b.skip is None or len(b.skip) > 5, f"README.md:{b.line}: say why it is skipped"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shims(bin_dir: Path, port: int) -> None:
    """``bursar`` and ``python`` on PATH: this interpreter; serve on the test's port."""
    bin_dir.mkdir()
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


def _env(bin_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURSAR_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["BURSAR_TARGET"] = f"127.0.0.1:{port}"
    env["COLUMNS"] = "100"
    return env


def _start(command: str, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    out = (log.with_suffix(".out")).open("w")
    err = (log.with_suffix(".err")).open("w")
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command}"], cwd=cwd, env=env, stdout=out, stderr=err, text=True
    )
    deadline = time.monotonic() + 60
    while "listening on" not in log.with_suffix(".out").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{command!r} did not start: {log.with_suffix('.err').read_text()[-2000:]}")
        time.sleep(0.1)
    return proc


def test_readme_sequences_run_as_written(tmp_path: Path) -> None:
    port = _free_port()
    bin_dir = tmp_path / "bin"
    _shims(bin_dir, port)
    env = _env(bin_dir, port)
    work = tmp_path / "work"
    work.mkdir()
    servers: list[subprocess.Popen[str]] = []
    try:
        for n, block in enumerate(readme_blocks(README.read_text(encoding="utf-8"))):
            if block.skip is not None:
                continue
            where = f"README.md:{block.line} ({block.section})"
            if block.serves:
                for k, command in enumerate(c for c in block.text.splitlines() if c.strip()):
                    servers.append(_start(command, work, env, tmp_path / f"serve{n}-{k}.log"))
                err = (tmp_path / f"serve{n}-0.err").read_text()
                assert "NOTICE: serving the packaged 512-GPU demo pool" in err, where
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
                f"{where} failed ({res.returncode}):\n{block.text}\n"
                f"--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}"
            )
            assert "Traceback" not in res.stderr, f"{where}:\n{res.stderr[-3000:]}"
        assert servers, "no block started the broker"
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
    # What the sequences did is all in the journal, and it re-derives.
    audit = subprocess.run(
        [str(bin_dir / "bursar"), "journal", "audit", "--state-dir", "state"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert audit.returncode == 0, audit.stderr
