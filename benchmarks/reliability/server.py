"""`bursar serve` as a real process for the reliability suite: start it on free ports,
read what it announces, kill it (any signal), start it again on the same state.

The tests import this module too (``tests/conftest.py`` puts this folder on ``sys.path``),
so there is one copy of the helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path


class Server:
    """`python -m bursar.broker.service` on a free port (``--port 0``), metrics off unless
    ``args`` say otherwise. ``address`` is what the server printed after "listening on".

    What the process prints is read on background threads (stdout into ``lines``, stderr
    into ``errors``), so that a chatty server never blocks on a full pipe; a blocked write
    would show up as a stall that is the harness's fault, not the broker's."""

    def __init__(
        self,
        state_dir: Path,
        *args: str,
        timeout_s: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.args = args
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bursar.broker.service",
                "--state-dir",
                str(state_dir),
                "--port",
                "0",
                *(() if any(a.startswith("--metrics-port") for a in args) else ("--no-metrics",)),
                *(() if any(a.startswith("--dashboard") for a in args) else ("--no-dashboard",)),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._changed = threading.Condition()
        self._eof = 0
        self._readers = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.lines), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.errors), daemon=True),
        ]
        for t in self._readers:
            t.start()
        line = self.wait_for("listening on", timeout_s)
        self.ready_s = time.monotonic() - self.started
        """Seconds from spawning the process to its "listening on" line (SERVING)."""
        self.address = line.split("listening on ", 1)[1].split()[0]

    def _drain(self, stream: object, into: list[str]) -> None:
        assert stream is not None
        for line in stream:  # type: ignore[attr-defined]
            with self._changed:
                into.append(line)
                self._changed.notify_all()
        with self._changed:
            self._eof += 1
            self._changed.notify_all()

    def wait_for(self, needle: str, timeout_s: float = 60.0) -> str:
        """The first line of stdout holding ``needle``, waiting up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if needle in line:
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self._eof == 2:
                    break
                self._changed.wait(left)
        raise RuntimeError(
            f"server never said {needle!r}: {''.join(self.lines)} {''.join(self.errors)}"
        )

    def tokens(self) -> dict[str, str]:
        return json.loads((self.state_dir / "tokens.json").read_text())

    def admin(self) -> str:
        return (self.state_dir / "admin.token").read_text().strip()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for t in self._readers:
            t.join(timeout=5)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def md(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token``."""
    return (("authorization", f"Bearer {token}"),)


def proc_stats(pid: int) -> dict[str, float]:
    """A process's resident memory (MiB, from /proc/PID/status) and open descriptors."""
    rss_kb = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {"rss_mib": round(rss_kb / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def pool_toml(
    *,
    nodes: int,
    gpu: int = 8,
    campaigns: Mapping[str, float],
    grace_s: float = 1.0,
    min_retry_s: float = 0.2,
    cpu: bool = False,
) -> str:
    """A warm-only pool of ``nodes`` identical nodes (``gpu`` GPUs, 8 cores per GPU) and
    batch campaigns (name: GPU burst; with ``cpu``, cores too, in the same proportion),
    with no bucket limit: refusals come from capacity and bursts only."""
    out = [
        "[pool]",
        "boot_latency_s = 1",
        "[pool.groups.n]",
        f"count = {nodes}",
        f"warm = {nodes}",
        f"gpu = {gpu}",
        f"cpu = {gpu * 8}",
        f"mem_gb = {gpu * 64}",
        "[policy]",
        f"grace_s = {grace_s}",
        f"min_retry_s = {min_retry_s}",
        "max_lease_s = 3600",
        "[policy.warm_headroom]",
        "gpu = 0",
    ]
    for name, burst in campaigns.items():
        out += [
            f"[campaigns.{name}]",
            'class = "batch"',
            f"[campaigns.{name}.gpu]",
            f"sustained = {burst}",
            f"burst = {burst}",
        ]
        if cpu:
            out += [f"[campaigns.{name}.cpu]", f"sustained = {burst * 8}", f"burst = {burst * 8}"]
    return "\n".join(out) + "\n"
