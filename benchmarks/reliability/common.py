"""What every section of the reliability suite returns, and the figures' formatting."""

from __future__ import annotations

import shutil
import socket
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Mode = Literal["short", "long"]


@dataclass
class Result:
    """One section's outcome: ``ok`` is False when an invariant broke (a lost or duplicated
    grant, an UNKNOWN answer, a journal changed by a refused request...); ``figures`` are
    the numbers the README quotes (JSON-able); ``lines`` a person's summary."""

    name: str
    ok: bool = True
    figures: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None
    """Why the section did not run (a system package missing), or None."""

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)


def quantiles(xs: list[float]) -> dict[str, float]:
    """p50, p99, p99.9 and max of ``xs`` (empty: all zero)."""
    if not xs:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "p999": 0.0, "max": 0.0}
    s = sorted(xs)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))]

    return {
        "n": len(s),
        "p50": statistics.median(s),
        "p99": q(0.99),
        "p999": q(0.999),
        "max": s[-1],
    }


# ---------------------------------------------------------------------- shared with the tests
# (tests/conftest.py puts this folder on sys.path: one copy of each helper.)


def self_signed_cert(work: Path) -> tuple[Path, Path] | None:
    """A self-signed key and certificate for localhost / 127.0.0.1 in ``work`` (the
    ``openssl`` command makes them); None without openssl."""
    if shutil.which("openssl") is None:
        return None
    key, cert = work / "key.pem", work / "cert.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return key, cert


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def free_port_block(n: int) -> int:
    """A port P such that P..P+n-1 are free on 127.0.0.1 now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n >= 65535:
            continue
        ok = True
        for q in range(p, p + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
                    break
        if ok:
            return p
    raise RuntimeError("no block of free ports")
