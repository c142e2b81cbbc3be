"""Replay metrics, with the definitions below.

* wait = start - submit (mean, p50, p95, max);
* bounded slowdown = max(1, (wait + run) / max(run, tau)), tau = 10 s by default
  (mean, p95), where run is the job's recorded runtime (what it needed, also for a job
  the broker killed);
* percentiles by linear interpolation between the closest ranks (numpy's default);
* utilisation = processor-seconds used / (capacity x span from the first submit to the
  last completion); makespan = that span; a job uses its size for its recorded runtime,
  or until it was killed;
* refused: jobs a policy refused at their submission (the broker, for a job larger than
  the pool can ever give its campaign beside the other campaigns' guarantees); they never
  ran, and the waits, slowdowns and per-campaign figures count the jobs that ran;
* killed: jobs a policy ended before their recorded runtime (the broker, when it refused
  a renewal), and the processor-seconds of runtime they lost; ran past request: jobs
  whose recorded runtime exceeds their requested time (the same for every policy);
* per campaign: its share of the processor-seconds used against its guarantee's share of
  the capacity;
* starvation count: jobs that waited longer than the config's ``starvation_s``.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import Any

from bursar.sim.replay.kernel import Schedule
from bursar.sim.replay.mapping import ReplayConfig, Workload

DEFAULT_TAU_S = 10.0


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """The p-th percentile (0..100) of sorted data, linear interpolation between ranks."""
    n = len(sorted_xs)
    if n == 0:
        return math.nan
    r = (n - 1) * p / 100.0
    lo = math.floor(r)
    hi = min(lo + 1, n - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (r - lo)


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs) if xs else math.nan


def compute_metrics(
    w: Workload,
    s: Schedule,
    config: ReplayConfig,
    tau_s: float = DEFAULT_TAU_S,
    guarantees: dict[str, float] | None = None,
) -> dict[str, Any]:
    n = len(w)
    submit, hold, size = w.submit, w.hold, w.size
    # A refused job never ran: it has no wait, and holds nothing.
    no = set(s.refused)
    ran = [j for j in range(n) if j not in no] if no else range(n)
    # Compact arrays (8 bytes a job): the metrics' own state on a million-job trace; a
    # sort's list of floats lives only until its percentiles are read.
    # array() from a generator appends value by value: no list of floats in between.
    start = s.start
    waits = array("d", (start[j] - submit[j] for j in ran))
    ws = sorted(waits)
    wait_pct = (percentile(ws, 50), percentile(ws, 95), ws[-1] if ws else math.nan)
    del ws
    bsld = array(
        "d",
        (max(1.0, (x + hold[j]) / max(hold[j], tau_s)) for x, j in zip(waits, ran, strict=True)),
    )
    bs = sorted(bsld)
    p95_bsld = percentile(bs, 95)
    del bs
    first = min(submit) if n else 0.0
    last = max((s.end[j] for j in ran), default=0.0)
    span = last - first
    # A killed job held its processors from its start to its end, not its whole runtime.
    held = hold
    lost = 0.0
    if s.killed or no:
        held = array("d", hold)
        for j in s.killed:
            held[j] = s.end[j] - s.start[j]
        for j in no:
            held[j] = 0.0
        lost = math.fsum(size[j] * (hold[j] - held[j]) for j in s.killed)
    used = math.fsum(size[j] * held[j] for j in ran)
    per_used = [0.0] * len(w.campaign_names)
    per_jobs = [0] * len(w.campaign_names)
    per_wait = [0.0] * len(w.campaign_names)
    per_refused = [0] * len(w.campaign_names)
    for x, j in zip(waits, ran, strict=True):
        c = w.campaign[j]
        per_used[c] += size[j] * held[j]
        per_jobs[c] += 1
        per_wait[c] += x
    for j in no:
        per_refused[w.campaign[j]] += 1
    guarantees = guarantees or {}
    campaigns = {}
    for c, name in enumerate(w.campaign_names):
        g = guarantees.get(name, config.overrides.get(name, config.default).guarantee)
        campaigns[name] = {
            "jobs": per_jobs[c],
            "unit_seconds": per_used[c],
            "share": per_used[c] / used if used > 0 else 0.0,
            "guarantee": g,
            "guarantee_share": g / w.capacity,
            "mean_wait_s": per_wait[c] / per_jobs[c] if per_jobs[c] else 0.0,
            "refused": per_refused[c],
        }
    return {
        "jobs": n,
        "capacity": w.capacity,
        "unit": w.unit,
        "mean_wait_s": _mean(waits),
        "p50_wait_s": wait_pct[0],
        "p95_wait_s": wait_pct[1],
        "max_wait_s": wait_pct[2],
        "bsld_tau_s": tau_s,
        "mean_bsld": _mean(bsld),
        "p95_bsld": p95_bsld,
        "utilization": used / (w.capacity * span) if span > 0 else 0.0,
        "makespan_s": span,
        "starvation_s": config.starvation_s,
        "starved": sum(1 for x in waits if x > config.starvation_s),
        "refused": len(no),
        "killed": len(s.killed),
        "killed_unit_seconds": lost,
        "ran_past_request": sum(1 for j in range(n) if hold[j] > w.duration[j]),
        "events": s.events,
        "campaigns": campaigns,
    }
