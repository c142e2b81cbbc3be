"""The reliability suite: faults, load and bad input against `bursar serve`, through its
public interfaces only.

Run: ``.venv/bin/python benchmarks/reliability/run.py [--mode short|long] [--only a,b]
[--out DIR]``. ``short`` (what CI runs, a few minutes) and ``long`` (the README's figures)
run the same checks at different sizes. Each section prints its figures; everything is
also written to DIR/results.json and DIR/report.md. The exit status is 1 when any
section found a broken invariant.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

from common import Mode, Result

SECTIONS = ("kill", "vanish", "soak", "fuzz", "access", "slurm")
"""Section modules (beside this file), each with ``run(mode, work_dir) -> Result``."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mode", choices=("short", "long"), default="short")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--out", type=Path, default=Path("out/reliability"))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SECTIONS)
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    mode: Mode = args.mode
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for name in names:
        module = importlib.import_module(name)
        t0 = time.monotonic()
        print(f"== {name} ({mode})", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"bursar-rel-{name}-") as work:
            result: Result = module.run(mode, Path(work))
        result.figures.setdefault("wall_s", round(time.monotonic() - t0, 1))
        results.append(result)
        for line in result.lines:
            print(f"   {line}", flush=True)
        if result.skipped:
            print(f"   skipped: {result.skipped}", flush=True)
        for p in result.problems:
            print(f"   PROBLEM: {p}", flush=True)
        print(f"   -> {'ok' if result.ok else 'FAILED'}", flush=True)
    (args.out / "results.json").write_text(
        json.dumps({"mode": mode, "sections": [dataclasses.asdict(r) for r in results]}, indent=2)
    )
    (args.out / "report.md").write_text(_markdown(mode, results))
    print(f"report: {args.out / 'report.md'}")
    return 0 if all(r.ok for r in results) else 1


def _markdown(mode: str, results: list[Result]) -> str:
    out = [f"# Reliability suite ({mode} mode)", ""]
    for r in results:
        status = "skipped" if r.skipped else ("ok" if r.ok else "FAILED")
        out += [f"## {r.name}: {status}", ""]
        out += [f"- {line}" for line in r.lines]
        if r.skipped:
            out.append(f"- skipped: {r.skipped}")
        out += [f"- **problem:** {p}" for p in r.problems]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
