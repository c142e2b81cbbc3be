"""Deadlines under a facility power cap: the ElasticFlow jobs, each run on GPUs whose
draw the Zeus measurements give, when the facility's GPUs may draw at most a cap.

A separate, small simulator beside the engine's (``runner``): the engine has no power
dimension yet, so this one keeps its own books, in virtual time, deterministic.

* A job's time on g GPUs is its iterations over the measured throughput of its model
  and batch size on g (``trace.time_on``), at the GPUs' highest power limit.
* At a power limit its GPUs each draw Zeus's measured average power for its model at
  that limit, and it runs ``slowdown`` times as long (Zeus's time per epoch at that
  limit over the time at the highest, ``model.GpuProfile``). ElasticFlow's resnet50,
  bert and deepspeech2 have Zeus counterparts (``model.ZEUS_MODELS``); the other models
  (gpt2, vgg16, inception3) take the median of those three at each limit (``generic``).
* Jobs queue in deadline order. At each arrival and each end, every queued job that can
  still meet its deadline is started if some size fits: the fewest measured GPUs that
  finish by the deadline from now, within the free GPUs and the free watts. ``wait``:
  at the highest power limit only, else the job waits. ``throttle``: also at a lower
  measured limit (slower, drawing less), the highest that fits, when the highest does
  not. A job is given one size and one limit for its whole run.
* A job that can no longer meet its deadline even on the most GPUs it could use at the
  highest limit is dropped (as ElasticFlow's simulator declines it): not met. A started
  job finishes by its deadline by construction: deadlines met = jobs started.

The cap is on the running GPUs' draw (Zeus measures GPU power only: no host, no idle
GPUs). Not the engine: no leases, renewals or resizes; what it answers is how many
deadlines a cap costs, and how many a lower power limit saves.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bursar.broker.codec import json_safe
from bursar.sim.elastic.trace import Curves, Job, load_curves, load_jobs, time_on
from bursar.sim.power.model import ZEUS_MODELS, GpuProfile, facility_draw
from bursar.sim.power.readers import read_zeus_profiles
from bursar.sim.replay.manifest import canonical, sha256
from bursar.sim.replay.table import TraceError

MODES = ("wait", "throttle")
GENERIC = "generic"
FRACTIONS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2)
"""The caps of a sweep: these fractions of the uncapped run's peak GPU draw."""


def generic_profile(profiles: Mapping[str, GpuProfile]) -> GpuProfile:
    """The median of the ElasticFlow models' Zeus profiles at each limit they share."""
    mine = [profiles[z] for z in ZEUS_MODELS.values() if z in profiles]
    if not mine:
        raise TraceError(f"no Zeus profile for any of {', '.join(ZEUS_MODELS.values())}")
    limits = sorted(set.intersection(*(set(p.limits) for p in mine)))
    at = [[p.at(limit) for p in mine] for limit in limits]
    return GpuProfile(
        GENERIC,
        mine[0].gpu,
        tuple(limits),
        tuple(statistics.median(w for w, _ in a) for a in at),
        tuple(statistics.median(s for _, s in a) for a in at),
    )


def profile_for(model: str, profiles: Mapping[str, GpuProfile], generic: GpuProfile) -> GpuProfile:
    z = ZEUS_MODELS.get(model)
    return profiles[z] if z is not None and z in profiles else generic


@dataclass(frozen=True, slots=True)
class Outcome:
    met: int
    dropped: int
    throttled: int
    """Jobs started below the highest power limit."""
    energy_kwh: float
    peak_kw: float


@dataclass(frozen=True, slots=True)
class _Plan:
    gpus: int
    limit: int
    watts: float
    seconds: float


def _sizes(curve: Sequence[tuple[int, float]], gpus: int) -> list[int]:
    return [g for g, _ in curve if g <= gpus]


def simulate(
    jobs: Sequence[Job],
    curves: Curves,
    profiles: Mapping[str, GpuProfile],
    gpus: int,
    cap_w: float,
    mode: str,
) -> Outcome:
    """One run of the trace on ``gpus`` GPUs under ``cap_w`` (inf: no cap)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    generic = generic_profile(profiles)
    prof = [profile_for(j.model, profiles, generic) for j in jobs]
    curve = [curves.curve(j.model, j.batch_size) or () for j in jobs]
    queue: list[tuple[float, int]] = []  # (deadline, job)
    ends: list[tuple[float, int]] = []
    free, wfree = gpus, cap_w
    start = [math.nan] * len(jobs)
    end = [math.nan] * len(jobs)
    draw = [0.0] * len(jobs)
    held: dict[int, _Plan] = {}
    dropped = throttled = 0
    i = 0
    while i < len(jobs) or ends:
        t_sub = jobs[i].submit if i < len(jobs) else math.inf
        now = min(t_sub, ends[0][0] if ends else math.inf)
        while ends and ends[0][0] == now:
            _, j = heapq.heappop(ends)
            p = held.pop(j)
            free += p.gpus
            wfree += p.watts
        while i < len(jobs) and jobs[i].submit == now:
            heapq.heappush(queue, (jobs[i].deadline, i))
            i += 1
        waiting = []
        while queue:
            dl, j = heapq.heappop(queue)
            job, c, pr = jobs[j], curve[j], prof[j]
            left = dl - now
            fastest = min(
                (time_on(c, job.iterations, g) for g in _sizes(c, gpus)), default=math.inf
            )
            if fastest > left:
                dropped += 1
                continue
            plan = None
            limits = pr.limits[::-1] if mode == "throttle" else pr.limits[-1:]
            for g in _sizes(c, free):
                base = time_on(c, job.iterations, g)
                for limit in limits:
                    w, slow = pr.at(limit)
                    secs = base * slow
                    if secs <= left and g * w <= wfree:
                        plan = _Plan(g, limit, g * w, secs)
                        break
                if plan is not None:
                    break
            if plan is None:
                waiting.append((dl, j))
                continue
            free -= plan.gpus
            wfree -= plan.watts
            held[j] = plan
            start[j], end[j], draw[j] = now, now + plan.seconds, plan.watts
            throttled += plan.limit != pr.max_limit
            heapq.heappush(ends, (end[j], j))
        for item in waiting:
            heapq.heappush(queue, item)
        if i >= len(jobs) and not ends:
            dropped += len(queue)  # nothing will free up: they can never start
            break
    d = facility_draw(start, end, draw, 0.0)
    met = sum(1 for s in start if s == s)
    return Outcome(met, dropped, throttled, d.energy_j / 3.6e6, d.peak_w / 1e3)


def sweep(
    jobs: Sequence[Job],
    curves: Curves,
    profiles: Mapping[str, GpuProfile],
    gpus: int,
    fractions: Sequence[float] = FRACTIONS,
) -> dict[str, Any]:
    """The uncapped run, then each cap (a fraction of its peak) under both modes."""
    free = simulate(jobs, curves, profiles, gpus, math.inf, "wait")
    rows = []
    for f in fractions:
        cap = math.ceil(round(f * free.peak_kw * 1e3, 6))  # whole watts, not below f x peak
        row: dict[str, Any] = {"fraction": f, "cap_kw": cap / 1e3}
        for mode in MODES:
            o = simulate(jobs, curves, profiles, gpus, float(cap), mode)
            row[mode] = {
                "met": o.met,
                "dropped": o.dropped,
                "throttled": o.throttled,
                "energy_kwh": o.energy_kwh,
                "peak_kw": o.peak_kw,
            }
        rows.append(row)
    matched = sum(1 for j in jobs if j.model in ZEUS_MODELS)
    return {
        "jobs": len(jobs),
        "matched": matched,
        "gpus": gpus,
        "uncapped": {"met": free.met, "energy_kwh": free.energy_kwh, "peak_kw": free.peak_kw},
        "rows": rows,
    }


def markdown(name: str, rep: dict[str, Any]) -> str:
    u = rep["uncapped"]
    lines = [
        f"**{name}** ({rep['jobs']:,} jobs, {rep['matched']:,} with a Zeus model; "
        f"{rep['gpus']} GPUs). Uncapped: {u['met']:,} deadlines met, peak GPU draw "
        f"{u['peak_kw']:,.1f} kW, {u['energy_kwh']:,.0f} kWh.",
        "",
        "| cap (kW) | share of peak | met, wait | met, throttle | throttled jobs "
        "| energy kWh, wait | energy kWh, throttle |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rep["rows"]:
        w, t = r["wait"], r["throttle"]
        lines.append(
            f"| {r['cap_kw']:,.1f} | {r['fraction']:.0%} | {w['met']:,} | {t['met']:,} | "
            f"{t['throttled']:,} | {w['energy_kwh']:,.0f} | {t['energy_kwh']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bursar.sim.elastic.power TRACE.csv.gz ... --gpus N --zeus FILE``."""
    ap = argparse.ArgumentParser(prog="python -m bursar.sim.elastic.power", description=__doc__)
    ap.add_argument("traces", nargs="+", type=Path, help="ElasticFlow job tables")
    ap.add_argument("--gpus", type=int, required=True, help="the cluster's GPUs (195job: 128)")
    ap.add_argument("--zeus", type=Path, required=True, help="summary_power_<gpu>.csv[.gz]")
    ap.add_argument(
        "--curves", type=Path, help="throughputs folder; default: throughputs_A100 beside the trace"
    )
    ap.add_argument("--out", type=Path, default=Path("out/elastic-power"))
    a = ap.parse_args(argv)
    try:
        profiles = read_zeus_profiles(a.zeus)
        reports = {}
        for t in a.traces:
            curves = load_curves(a.curves or t.parent / "throughputs_A100")
            jobs = load_jobs(t)
            reports[t.name.split(".")[0]] = sweep(jobs, curves, profiles, a.gpus)
    except (TraceError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    today = datetime.now(UTC).date().isoformat()
    text = "\n".join(markdown(n, r) for n, r in reports.items())
    # The run hash: every trace's report, canonical JSON.
    run_hash = sha256(canonical(json_safe(reports)))
    (a.out / "elastic-power.md").write_text(
        f"Measured {today} (run hash `{run_hash[:16]}`).\n\n{text}"
    )
    (a.out / "elastic-power.json").write_text(
        json.dumps({"date": today, "run_sha256": run_hash, **reports}, indent=1) + "\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
