"""The reliability suite's short mode for its kill -9, vanishing-client and soak sections,
run as CI runs it: a subprocess against real `bursar serve` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_short_mode_kill_vanish_soak(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "reliability" / "run.py"),
            *("--mode", "short", "--only", "kill,vanish,soak", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "short"
    sections = {s["name"]: s for s in results["sections"]}
    assert set(sections) == {"kill", "vanish", "soak"}
    assert all(s["ok"] and not s["problems"] for s in sections.values())

    kill = sections["kill"]["figures"]
    assert kill["kills"] == 3 and kill["recovery_s"]["n"] == 3
    assert kill["acknowledged_grants"] > 0 and kill["retries_after_unavailable"] > 0
    for broken in ("lost", "duplicated", "over_commits", "ghosts"):
        assert kill[broken] == 0, broken
    assert kill["audit_exit"] == 0 and kill["audit_mismatches"] == 0
    # The burst agents' calls overlapped: the servers committed several entries at once, so
    # the kills fell on open commit batches, and still no answered call was lost.
    assert kill["burst_agents"] > 0 and max(kill["entries_per_commit"]) > 1
    assert len(kill["commits"]) == kill["kills"] + 1
    assert all(kill["peak_held"][d] <= cap for d, cap in kill["capacity"].items())
    assert kill["peak_held"]["gpu"] > 0 and kill["peak_held"]["cpu"] > 0
    assert 0 < kill["recovery_s"]["p50"] <= kill["recovery_s"]["max"]

    vanish = sections["vanish"]["figures"]
    bound = vanish["lease_duration_s"] + vanish["tolerance_s"]
    assert 0 < vanish["ended_after_kill_max_s"] <= bound
    assert vanish["capacity_back_max_s"] <= bound
    for how in ("channel_closed", "process_killed"):
        assert vanish[f"withdrawn_{how}_s"]["max"] <= vanish["tolerance_s"]

    soak = sections["soak"]["figures"]
    assert soak["failed"] == {} and soak["stream_errors"] == {}
    assert soak["watch_events"] > 0 and soak["supply_snapshots"] > 0
    assert sum(soak["ok"].values()) > 100
    windows = soak["acquire_ms"]
    assert len(windows) >= 3
    assert all({"p50", "p99", "p999", "max"} <= set(w) for w in windows)
    # The server ran with BURSAR_STALL_LOG=1: its probes said what they saw on the way out.
    assert any("summary: gc runs" in line for line in soak["server_stall_log"])
    assert all("kind" in s for s in soak["stalls"])
    for end in ("server_start", "server_end"):
        assert soak[end]["rss_mib"] > 0 and soak[end]["fds"] > 0
