"""One replay end to end: read a trace, map it, run a policy, measure, write the results.

The functional core is ``replay_trace`` (no I/O beyond reading the trace); ``write_run``
is the shell that writes ``metrics.json``, ``manifest.json`` and ``schedule.csv`` (the
manifest hashes the schedule itself, so a run that writes no CSV has the same manifest).
"""

from __future__ import annotations

import json
import math
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker.codec import json_safe
from bursar.sim.replay.estimate import check_estimate, estimated
from bursar.sim.replay.ingest import load_trace
from bursar.sim.replay.kernel import Schedule, replay
from bursar.sim.replay.manifest import build_manifest, canonical, file_sha256, sha256
from bursar.sim.replay.mapping import ReplayConfig, Workload, to_workload
from bursar.sim.replay.metrics import DEFAULT_TAU_S, compute_metrics
from bursar.sim.replay.policies import check_policy, make_policy, plugin
from bursar.sim.replay.policies.powercap import power_policy
from bursar.sim.replay.power import PowerSpec, facility, power_metrics
from bursar.sim.replay.table import JobTable, Trace, TraceError

SEED = 0
"""Replays draw no random numbers; the seed is recorded so that a manifest says so."""


@dataclass(frozen=True, slots=True)
class RunResult:
    trace: Trace
    """The trace's header and quality report; its job table is released once mapped."""
    workload: Workload
    schedule: Schedule
    metrics: dict[str, Any]
    manifest: dict[str, Any]
    wall_s: float
    """Wall time of read + map + replay + metrics (not part of metrics or manifest)."""


def schedule_digest(s: Schedule) -> str:
    """SHA-256 of every job's start and end time (float64, little-endian, in order)."""
    data = array("d", s.start)
    data.extend(s.end)
    if sys.byteorder != "little":
        data.byteswap()
    return sha256(data.tobytes())


def schedule_csv(w: Workload, s: Schedule) -> bytes:
    lines = ["job_id,campaign,submit,start,end,size"]
    names = w.campaign_names
    for j in range(len(w)):
        lines.append(
            f"{w.job_id[j]},{names[w.campaign[j]]},{w.submit[j]:g},{s.start[j]:g},"
            f"{s.end[j]:g},{w.size[j]}"
        )
    return ("\n".join(lines) + "\n").encode()


def replay_trace(
    trace_path: str | Path,
    policy: str,
    *,
    capacity: int | None = None,
    config: ReplayConfig | None = None,
    tau_s: float = DEFAULT_TAU_S,
    strict: bool = True,
    limit: int | None = None,
    fmt: str | None = None,
    estimate: str = "requested",
    power: PowerSpec | None = None,
    power_caps: Sequence[float] = (),
) -> RunResult:
    """Replay ``trace_path`` under ``policy``. ``limit`` keeps only the first jobs (by
    submit time), for quick looks and for the broker policy on the largest traces.
    ``fmt`` is the trace format (``ingest.FORMATS``) when the name does not tell it.
    ``estimate`` is what the policy takes a job's runtime to be (``estimate.ESTIMATES``).
    ``power`` meters the facility's draw (``power.PowerSpec``) and, with a cap, keeps it
    (``policies.powercap``); the metrics then have ``power``, with the hours above each
    of ``power_caps`` too."""
    check_policy(policy)
    config = config or ReplayConfig()
    check_estimate(estimate, policy)
    capped = power is not None and power.cap_w is not None
    if capped:
        power_policy(policy)
        if estimate != "requested" and policy == "conservative":
            raise ValueError("--estimate under a power cap is for fifo and easy only")
    plug = plugin(policy)
    if plug is not None and not strict:
        # The referee's checks are what make a plug-in's metrics worth reading.
        raise ValueError(
            f"{policy!r} is a plug-in (from {plug.distribution}): a plug-in always replays "
            "strict, with the invariants checked after every event; drop --no-strict"
        )
    if tau_s <= 0 or not math.isfinite(tau_s):
        raise ValueError(f"--bsld-tau must be a finite number of seconds > 0 (got {tau_s})")
    t0 = time.perf_counter()
    trace = load_trace(trace_path, fmt)
    cap = capacity if capacity is not None else trace.header.capacity
    if cap is None or cap <= 0:
        raise TraceError(
            f"{trace_path}: the trace does not say its machine size (no MaxProcs or MaxNodes); "
            "pass --capacity N"
        )
    w = to_workload(trace, int(cap), config.campaigns)
    # The workload holds all the replay reads: the job table goes now, so that a long
    # trace is not held twice for the whole run (the result keeps its header and report).
    trace = Trace(trace.path, trace.header, JobTable(unit=trace.jobs.unit), trace.quality)
    if limit is not None and limit < len(w):
        for col in ("job_id", "submit", "size", "duration", "hold", "campaign"):
            setattr(w, col, getattr(w, col)[:limit])
        if w.measured_w is not None:
            w.measured_w = w.measured_w[:limit]
        trace.quality.notes.append(f"replayed the first {limit} jobs only (--limit)")
    fp = facility(w, power) if power is not None else None
    if capped:
        w.power = fp
        cls = power_policy(policy)
        s = replay(w, estimated(w, estimate, lambda v: cls(v, config)), strict=strict)
    else:
        s = replay(
            w, estimated(w, estimate, lambda v: make_policy(policy, v, config)), strict=strict
        )
    metrics = compute_metrics(w, s, config, tau_s)
    if fp is not None:
        metrics["power"] = power_metrics(w, s, fp, power_caps)
    wall = time.perf_counter() - t0
    metrics["quality"] = trace.quality.to_dict()
    metrics["strict"] = strict
    metrics = json_safe(metrics)
    run_config = {
        "capacity": int(cap),
        "bsld_tau_s": tau_s,
        "strict": strict,
        "limit": limit,
        "replay": config.to_dict(),
    }
    if fmt is not None:
        # Only when given: runs that detect the format keep their manifests unchanged.
        run_config["format"] = fmt
    if power is not None:
        run_config["power"] = power.to_dict()  # likewise
    if estimate != "requested":
        run_config["estimate"] = estimate  # likewise: the default leaves manifests as they were
    manifest = build_manifest(
        trace=trace_path,
        trace_sha256=file_sha256(trace_path),
        policy=policy,
        plugin=None if plug is None else plug.provenance(),
        config=run_config,
        seed=SEED,
        outputs={
            "metrics_sha256": sha256(canonical(metrics)),
            "schedule_sha256": schedule_digest(s),
        },
    )
    return RunResult(trace, w, s, metrics, manifest, wall)


def write_run(result: RunResult, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "schedule.csv").write_bytes(schedule_csv(result.workload, result.schedule))
    (out / "manifest.json").write_text(json.dumps(result.manifest, indent=2, sort_keys=True))
    body = {**result.metrics, "manifest": result.manifest}
    path = out / "metrics.json"
    path.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    return path
