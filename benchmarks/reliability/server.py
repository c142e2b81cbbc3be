"""`bursar serve` as a real process for the reliability suite: start it on free ports,
read what it announces, kill it (any signal), start it again on the same state."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import time
from pathlib import Path


class Server:
    """`python -m bursar.broker.service` on a free port (``--port 0``), metrics off unless
    ``args`` say otherwise. ``address`` is what the server printed after "listening on"."""

    def __init__(self, state_dir: Path, *args: str, timeout_s: float = 60.0) -> None:
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
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        line = self.wait_for("listening on", timeout_s)
        self.ready_s = time.monotonic() - self.started
        """Seconds from spawning the process to its "listening on" line (SERVING)."""
        self.address = line.split("listening on ", 1)[1].split()[0]

    def wait_for(self, needle: str, timeout_s: float = 60.0) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if needle in line:
                return line
        err = self.proc.stderr.read() if self.proc.poll() is not None and self.proc.stderr else ""
        raise RuntimeError(f"server never said {needle!r}: {''.join(self.lines)} {err}")

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
