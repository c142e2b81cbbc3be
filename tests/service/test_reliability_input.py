"""The reliability suite's input sections (fuzz, access, slurm) in short mode, as CI runs
them: a subprocess of benchmarks/reliability/run.py against real `bursar serve` processes
(and the real single-host Slurm cluster when it can run here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _sections(tmp_path: Path) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "reliability" / "run.py"),
            "--mode",
            "short",
            "--only",
            "fuzz,access,slurm",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["mode"] == "short"
    return {s["name"]: s for s in results["sections"]}


def test_input_sections_short_mode(tmp_path: Path) -> None:
    sections = _sections(tmp_path)
    assert set(sections) == {"fuzz", "access", "slurm"}

    fuzz = sections["fuzz"]
    f = fuzz["figures"]
    assert fuzz["ok"] and not fuzz["problems"]
    assert f["requests"] >= 1_500
    assert f["rpcs_covered"] == f["rpcs"] >= 17  # every RPC of Broker and Admin
    assert f["unknown_or_internal"] == 0
    assert 0 < f["max_message_chars"] <= 1024 and f["max_trailer_bytes"] <= 4096
    assert f["refused_only"]["journal_sha256_unchanged"]
    assert f["accepted"] > 0 and f["refused"] > f["refused_only"]["requests"]
    assert f["dry_runs_ok"] > 0  # WhatIfs that reached the engine's copy, journaling nothing
    assert f["health_serving"] == f["health_checks"] > 0
    for rpc, codes in f["by_rpc"].items():
        assert "UNKNOWN" not in codes and "INTERNAL" not in codes, rpc
        assert codes.get("UNAUTHENTICATED", 0) > 0, rpc  # the refused-only phase reached it
    # One bad value (NaN, ±inf, a negative, a tiny or huge number; an empty, control or
    # too long string) at every place of every request: all refused or harmless, none
    # UNKNOWN or INTERNAL, and each refusal journaled nothing (problems would say).
    one = f["one_bad_field"]
    assert one["places"] >= 100 and one["requests"] >= 4 * one["places"]
    for rpc, codes in one["by_rpc"].items():
        assert "UNKNOWN" not in codes and "INTERNAL" not in codes, rpc
    assert sum(c.get("INVALID_ARGUMENT", 0) for c in one["by_rpc"].values()) > one["places"]

    access = sections["access"]
    a = access["figures"]
    assert access["ok"] and not access["problems"]
    assert a["cells_plaintext"] > 100
    for table in a["matrix"].values():
        for rpc, row in table.items():
            assert not any(v.endswith("!") for v in row.values()), (rpc, row)
            assert row["none"] == row["wrong"] == row["rotated"] == "UNAUTHENTICATED"
            assert row["admin"] == "OK"
            if rpc.startswith("Admin.") or rpc == "Broker.WhatIf(envelope)":
                assert row["own"] == row["other"] == "PERMISSION_DENIED"
    assert a["non_loopback_exit"] == 2
    assert a["other_sees"]["caller"] == "campaign:other"

    slurm = sections["slurm"]
    if slurm["skipped"]:
        assert os.environ.get("BURSAR_REQUIRE_SYSTEM_TESTS") != "1"
        assert "Slurm" in slurm["skipped"] or "root" in slurm["skipped"]
        return
    s = slurm["figures"]
    assert slurm["ok"] and not slurm["problems"]
    assert s["node_down"]["lease_state"] == "LEASE_STATE_REVOKED"
    assert s["node_down"]["whole_pool_while_down"] == "RESOURCE_EXHAUSTED"
    assert s["leaked_jobs"] == 0 and s["journal_audit_exit"] == 0
    for key in ("ctld_stop", "ctld_kill"):
        assert s[key]["code"] not in ("UNKNOWN", "INTERNAL"), s[key]
