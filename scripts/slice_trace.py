"""Cut the trace shipped in the package: the first jobs of the Parallel Workloads Archive's
KTH-SP2 log, its published header kept whole, with a header note saying what was cut.

    python scripts/slice_trace.py KTH-SP2-1996-2.1-cln.swf.gz sim/replay/data/kth-sp2-sample.swf.gz

The input must be the archive's file as published (its SHA-256 is checked against the
catalogue), so the slice is the same wherever it is cut. The output is gzip without a
name or time stamp; tests compare its decompressed text with a fresh cut.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
from pathlib import Path

from bursar.sim.replay.catalog import SAMPLE_JOBS, SAMPLE_SOURCE, entry

__all__ = ["cut", "main"]


def cut(published: bytes, jobs: int = SAMPLE_JOBS) -> str:
    """The slice's text from the published log (gzip or plain bytes): a note, the whole
    published header (its data-usage lines must stay in every copy), then the first
    ``jobs`` job lines unchanged."""
    src = entry(SAMPLE_SOURCE).files[0]
    digest = hashlib.sha256(published).hexdigest()
    if digest != src.sha256:
        raise ValueError(
            f"not the published {Path(src.path).name}: SHA-256 {digest}, expected {src.sha256}"
        )
    lines = gzip.decompress(published).decode("utf-8").splitlines()
    header = [ln for ln in lines if ln.startswith(";")]
    body = [ln for ln in lines if ln.strip() and not ln.startswith(";")]
    if len(body) < jobs:
        raise ValueError(f"the log has {len(body)} job lines, fewer than {jobs}")
    note = [
        f"; Slice: the first {jobs} job lines of {Path(src.path).name} (SHA-256 {src.sha256}),",
        f";        from the Parallel Workloads Archive, {src.url}",
        ";        Every line below is as published; the header's MaxJobs, MaxRecords and",
        ";        EndTime describe the whole log. Cut by scripts/slice_trace.py (bursar).",
        ";",
    ]
    return "\n".join([*note, *header, *body[:jobs]]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("published", type=Path, help="the published KTH-SP2 log (.swf.gz)")
    p.add_argument("out", type=Path, help="where to write the slice (.swf.gz)")
    p.add_argument("--jobs", type=int, default=SAMPLE_JOBS, help="how many job lines")
    a = p.parse_args(argv)
    try:
        text = cut(a.published.read_bytes(), a.jobs)
    except (OSError, ValueError) as e:
        print(f"slice_trace: {e}", file=sys.stderr)
        return 1
    # mtime=0 and no file name: the same text gives the same bytes on every run.
    a.out.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))
    print(f"wrote {a.out} ({a.out.stat().st_size:,} bytes, {a.jobs} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
