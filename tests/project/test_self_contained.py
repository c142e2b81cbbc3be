"""The repository points only inside itself: its code, docs, configs and contract never send
a reader to a design brief's sections or to issue numbers they cannot see."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

# Built from pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(
        [
            re.escape("DESIGN" + ".md"),
            re.escape("STYLE" + ".md"),
            re.escape("ANCHORS" + ".md"),
            re.escape("ENGINES" + ".md"),
            "\u00a7",  # the section sign, as in "see section 3" written with it
            # Our own issues; an upstream project's ("Parsl issue #2961") is a public pointer.
            r"(?<!Parsl )(?<!Dask )(?<!Ray )(?<!gRPC )(?<!SQLite )\bissues? #?\d+\b",
        ]
    ),
    re.IGNORECASE,
)

TEXT = {".py", ".md", ".toml", ".proto", ".yaml", ".yml", ".html", ".sh", ".cfg", ".txt", ""}


def tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in out if Path(p).suffix in TEXT and not p.endswith("_pb2.py")]


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in tracked():
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
