"""The simulator's three facility experiments, as grids of independent cells.

A *cell* is a plain dict (``sweep``, ``seed``, ``duration_s``, ``params``) and
``run_cell(cell)`` runs it: one simulated run of the real engine through the simulator
(``bursar.sim.scenario.simulate``), in a temporary state dir, returning the cell with
its measured values. Cells share nothing, so any Dask worker can run any of them
(``bursar.sim.sweep``); ``experiment_claims`` pools the results into the claims table.

* ``headroom``: warm headroom (GPUs) x grace period (s) in the agent-burst scenario, against the
  probe's time to 128 GPUs and the mean pool utilisation.
* ``overbooking``: the sum of burst ceilings as a multiple of the pool (1.375x from the
  victim, a *guaranteed* 128-GPU probe and backfill; storm campaigns, all storming at
  once, make up the rest), against the guaranteed probe's latency and violations.
* ``enforcement``: prepaid against grant-instant bucket checks, by lease length: the
  GPU-seconds above its sustained rate an adversary (``Extractor``) with a 25k GPU-s
  bucket gets over any interval.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker.config import Config
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.policy import Enforcement
from bursar.sim.runner import Params, scenario_config
from bursar.sim.scenario import DURATION_S, max_excess, percentile, run_seed, simulate
from bursar.workflows.agents import Backfill, Extractor, Probe, Storm, Victim

__all__ = [
    "ADVERSARY_BUCKET",
    "FULL",
    "QUICK",
    "Grid",
    "cells",
    "enforcement_config",
    "experiment_claims",
    "overbooking_config",
    "run_cell",
]

SWEEPS = ("headroom", "overbooking", "enforcement")
POOL_GPUS = 512.0
GPUS_PER_NODE = 8.0

ADVERSARY_BUCKET = 25_000.0
"""B of the enforcement adversary, GPU-s (the prototype's seed sweep)."""
ADVERSARY_SUSTAINED = 32.0
ADVERSARY_BURST = 384.0

PROBE_GUARANTEED = CampaignSpec(
    name="probe",
    envelopes={"gpu": DimEnvelope(guarantee=128, sustained=128, burst=128, bucket=None)},
    # Interactive: its guarantee is promised at once. A batch campaign's unmet guarantee
    # may be lent to backfill and is served within a grace period instead.
    lease_class=LeaseClass.INTERACTIVE,
)


@dataclass(frozen=True)
class Grid:
    """The values each sweep takes, and how long each of its cells runs (virtual s)."""

    headroom_gpus: tuple[float, ...]
    grace_s: tuple[float, ...]
    factors: tuple[float, ...]
    lease_s: tuple[float, ...]
    enforcements: tuple[str, ...] = ("prepaid", "grant_instant")
    duration_headroom_s: float = DURATION_S
    duration_overbooking_s: float = DURATION_S
    duration_enforcement_s: float = 3600.0


FULL = Grid(
    headroom_gpus=(16, 32, 64, 128, 256),
    grace_s=(15, 30, 60, 120),
    factors=(2, 3, 4, 5, 6, 7),
    lease_s=(300, 900, 1800, 3600),
)
QUICK = Grid(
    headroom_gpus=(16, 256),
    grace_s=(15, 120),
    factors=(2, 7),
    lease_s=(300, 1800),
    duration_headroom_s=2400.0,
    duration_overbooking_s=2400.0,
    duration_enforcement_s=1800.0,
)


def cells(grid: Grid, seeds: Iterable[int], sweeps: Iterable[str] = SWEEPS) -> list[dict]:
    """Every cell of the chosen sweeps, seeds innermost."""
    seeds = list(seeds)
    want = set(sweeps)
    out: list[dict[str, Any]] = []

    def add(sweep: str, duration: float, **params: Any) -> None:
        for s in seeds:
            out.append({"sweep": sweep, "seed": s, "duration_s": duration, "params": params})

    if "headroom" in want:
        for h in grid.headroom_gpus:
            for g in grid.grace_s:
                add("headroom", grid.duration_headroom_s, warm_headroom=h, grace_s=g)
    if "overbooking" in want:
        for f in grid.factors:
            add("overbooking", grid.duration_overbooking_s, factor=f)
    if "enforcement" in want:
        for e in grid.enforcements:
            for lease in grid.lease_s:
                add("enforcement", grid.duration_enforcement_s, enforcement=e, lease_s=lease)
    return out


# ---------------------------------------------------------------------------------------
# Configurations


def _by_name(cfg: Config) -> dict[str, CampaignSpec]:
    return {c.name: c for c in cfg.campaigns}


def _storm_bursts(extra: float) -> list[float]:
    """Split ``extra`` GPUs of burst ceiling over as few storms as the scenario's storm's burst
    (384) allows, in multiples of 8."""
    if extra <= 0:
        return []
    n = math.ceil(extra / ADVERSARY_BURST)
    q, r = divmod(round(extra / GPUS_PER_NODE), n)
    return [GPUS_PER_NODE * (q + (1 if i < r else 0)) for i in range(n)]


def overbooking_config(factor: float, params: Params | None = None) -> Config:
    """The flagship pool with the victim, a guaranteed probe (128 GPUs), backfill and as many
    copies of the scenario's storm as bring the sum of burst ceilings to ``factor`` x the pool.
    Enough nodes start warm to hold every guarantee plus the headroom, as the demo
    config does for its own campaigns."""
    params = params or Params(probe=False)
    base = scenario_config(dataclasses.replace(params, probe=False))
    spec = _by_name(base)
    fixed = [spec["victim"], PROBE_GUARANTEED, spec["backfill"]]
    extra = factor * POOL_GPUS - sum(c.envelopes["gpu"].burst for c in fixed)
    if extra < 0:
        lowest = sum(c.envelopes["gpu"].burst for c in fixed) / POOL_GPUS
        raise ValueError(f"overbooking factor {factor} is below the {lowest}x the fixed campaigns")
    storm = spec["storm"]
    storms = [
        dataclasses.replace(
            storm,
            name=f"storm-{i + 1}",
            envelopes={
                **storm.envelopes,
                "gpu": dataclasses.replace(storm.envelopes["gpu"], burst=b),
            },
        )
        for i, b in enumerate(_storm_bursts(extra))
    ]
    campaigns = (*fixed, *storms)
    guarantees = sum(c.envelopes["gpu"].guarantee for c in campaigns)
    warm_nodes = math.ceil((guarantees + params.warm_headroom) / GPUS_PER_NODE)
    groups = tuple(
        dataclasses.replace(g, warm=min(g.count, max(g.warm, warm_nodes))) for g in base.pool.groups
    )
    pool = dataclasses.replace(base.pool, groups=groups)
    return Config(pool=pool, policy=base.policy, campaigns=campaigns)


def enforcement_config(enforcement: str, params: Params | None = None) -> Config:
    """The flagship pool with one campaign, the adversary: guarantee 0, R = 32, burst 384,
    B = 25k GPU-s, under ``enforcement`` ("prepaid" or "grant_instant")."""
    base = scenario_config(dataclasses.replace(params or Params(), probe=False))
    policy = dataclasses.replace(base.policy, enforcement=Enforcement(enforcement))
    adversary = CampaignSpec(
        name="adversary",
        envelopes={
            "gpu": DimEnvelope(
                guarantee=0,
                sustained=ADVERSARY_SUSTAINED,
                burst=ADVERSARY_BURST,
                bucket=ADVERSARY_BUCKET,
            )
        },
        lease_class=LeaseClass.BATCH,
    )
    return Config(pool=base.pool, policy=policy, campaigns=(adversary,))


# ---------------------------------------------------------------------------------------
# Running one cell


def _latencies(records: list[tuple[str, dict[str, Any]]], campaign: str) -> list[Any]:
    return [r for k, r in records if k == "latency" and r["campaign"] == campaign]


def _utilisation(series: dict[str, Any]) -> float:
    n = len(series["t"])
    if not n:
        return 0.0
    total = sum(sum(xs) for xs in series["held"].values())
    return total / (n * POOL_GPUS)


def _headroom(cell: dict[str, Any], state: Path) -> dict[str, Any]:
    p = cell["params"]
    params = Params(warm_headroom=float(p["warm_headroom"]), grace_s=float(p["grace_s"]))
    r = run_seed(cell["seed"], state, params, cell["duration_s"])
    probe = _latencies(r.records, "probe")
    ok = [x["latency"] for x in probe if x["latency"] is not None]
    paths: dict[str, int] = {}
    for x in probe:
        if x["latency"] is not None:
            paths[x["path"]] = paths.get(x["path"], 0) + 1
    return {
        "journal_sha256": r.journal_sha256,
        "events": r.events,
        "measured": {
            "probe_latencies_s": ok,
            "probe_p50_s": percentile(ok, 0.5),
            "probe_p95_s": percentile(ok, 0.95),
            "probe_refused": len(probe) - len(ok),
            "probe_paths": paths,
            "utilisation": round(r.metrics["utilisation"], 4),
        },
    }


def _overbooking(cell: dict[str, Any], state: Path) -> dict[str, Any]:
    factor = float(cell["params"]["factor"])
    duration = float(cell["duration_s"])
    cfg = overbooking_config(factor)
    storm_start, storm_len = duration / 4, min(1800.0, duration / 2)
    agents: dict[str, Any] = {
        "victim": Victim(until=duration),
        "probe": Probe(until=duration),
        "backfill": Backfill(until=duration),
    }
    storms = [c for c in cfg.campaigns if c.name.startswith("storm-")]
    for c in storms:
        # Correlated: every storm starts at once and hammers its own burst ceiling.
        agents[c.name] = Storm(
            start_s=storm_start, length_s=storm_len, burst=c.envelopes["gpu"].burst
        )
    tr = simulate(cfg, agents, cell["seed"], state, duration)
    probe = _latencies(tr.records, "probe")
    victim = _latencies(tr.records, "victim")
    ok = [x["latency"] for x in probe if x["latency"] is not None]
    in_storm = [
        x["latency"]
        for x in probe
        if x["latency"] is not None and storm_start <= x["at"] < storm_start + storm_len
    ]
    # Both ask only within their own guarantee: anything but "at once" is a violation.
    violations = sum(1 for x in probe + victim if x["latency"] is None or x["latency"] > 1e-6)
    held = tr.series["held"]
    idx = [i for i, t in enumerate(tr.series["t"]) if storm_start <= t < storm_start + storm_len]
    storm_gpus = [sum(held[c.name][i] for c in storms) for i in idx]
    bursts = sum(c.envelopes["gpu"].burst for c in cfg.campaigns)
    return {
        "journal_sha256": tr.journal_sha256,
        "events": tr.events,
        "measured": {
            "sum_burst_over_pool": round(bursts / POOL_GPUS, 4),
            "storms": len(storms),
            "probe_latencies_s": ok,
            "probe_p50_s": percentile(ok, 0.5),
            "probe_p95_s": percentile(ok, 0.95),
            "probe_max_during_storms_s": max(in_storm) if in_storm else None,
            "probe_refused": len(probe) - len(ok),
            "victim_p95_s": percentile(
                [x["latency"] for x in victim if x["latency"] is not None], 0.95
            ),
            "guaranteed_requests": len(probe) + len(victim),
            "guarantee_violations": violations,
            "storms_mean_gpus_during_storm": round(sum(storm_gpus) / len(storm_gpus), 2)
            if storm_gpus
            else 0.0,
            "utilisation": round(_utilisation(tr.series), 4),
        },
    }


def _enforcement(cell: dict[str, Any], state: Path) -> dict[str, Any]:
    p = cell["params"]
    duration = float(cell["duration_s"])
    cfg = enforcement_config(p["enforcement"])
    agent = Extractor(
        sustained=ADVERSARY_SUSTAINED,
        burst=ADVERSARY_BURST,
        lease_s=float(p["lease_s"]),
        until=duration,
    )
    tr = simulate(cfg, {"adversary": agent}, cell["seed"], state, duration, track=("adversary",))
    steps = tr.steps["adversary"]
    extracted = max_excess(steps, ADVERSARY_SUSTAINED, duration)
    pts = [*steps, (duration, 0.0)]
    total = sum(u * (t1 - t0) for (t0, u), (t1, _) in itertools.pairwise(pts))
    return {
        "journal_sha256": tr.journal_sha256,
        "events": tr.events,
        "measured": {
            "extracted_gpu_s": round(extracted, 1),
            "extracted_over_bucket": round(extracted / ADVERSARY_BUCKET, 4),
            "bucket_gpu_s": ADVERSARY_BUCKET,
            "gpu_s_held": round(total, 1),
            "sustained_gpu_s": ADVERSARY_SUSTAINED * duration,
        },
    }


_RUNNERS = {"headroom": _headroom, "overbooking": _overbooking, "enforcement": _enforcement}


def run_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Run one cell in a temporary state dir; the cell with its measured values."""
    if cell.get("sweep") not in _RUNNERS:
        raise ValueError(f"unknown sweep {cell.get('sweep')!r}; allowed: {', '.join(SWEEPS)}")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bursar-cell-") as tmp:
        out = _RUNNERS[cell["sweep"]](cell, Path(tmp))
    return {**cell, **out, "wall_s": round(time.perf_counter() - t0, 3)}


# ---------------------------------------------------------------------------------------
# Claims


def _row(name: str, prototype: str, bound: str, measured: str, ok: bool) -> dict[str, Any]:
    return {"claim": name, "prototype": prototype, "bound": bound, "measured": measured,
            "holds": bool(ok)}  # fmt: skip


def pooled(results: list[dict[str, Any]], sweep: str, key: str, **params: Any) -> list[Any]:
    """``measured[key]`` lists of the matching cells, concatenated over seeds."""
    out: list[Any] = []
    for r in results:
        if r["sweep"] == sweep and all(r["params"].get(k) == v for k, v in params.items()):
            out += r["measured"][key]
    return out


def experiment_claims(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The experiments' claims with their stated bounds, from whichever sweeps ran."""
    rows: list[dict[str, Any]] = []
    head = [r for r in results if r["sweep"] == "headroom"]
    if head:
        for g in sorted({r["params"]["grace_s"] for r in head}):
            p50s = []
            refused = asked = 0
            for h in sorted({r["params"]["warm_headroom"] for r in head}):
                lat = pooled(results, "headroom", "probe_latencies_s", warm_headroom=h, grace_s=g)
                p50s.append((h, percentile(lat, 0.5)))
                cell = [
                    r
                    for r in head
                    if r["params"]["warm_headroom"] == h and r["params"]["grace_s"] == g
                ]
                refused += sum(r["measured"]["probe_refused"] for r in cell)
                asked += len(lat) + sum(r["measured"]["probe_refused"] for r in cell)
            meas = ", ".join(f"{h:g}: {'n/a' if v is None else f'{v:.0f}'}" for h, v in p50s)
            # A probe not served within its 290 s timeout has no latency: say how many.
            meas += f" ({refused} of {asked} probes not served in 290 s)"
            rows.append(
                _row(
                    f"probe p50 time to 128 GPUs, grace {g:g} s, by warm headroom (GPUs: s)",
                    f"about grace + 2 s = {g + 2:g} s",
                    "(measured only)",
                    meas,
                    True,
                )
            )
        util = {}
        for r in head:
            util.setdefault(r["params"]["warm_headroom"], []).append(r["measured"]["utilisation"])
        rows.append(
            _row(
                "mean utilisation by warm headroom (GPUs: %)",
                "falls as headroom grows",
                "(measured only)",
                ", ".join(f"{h:g}: {100 * sum(v) / len(v):.1f}" for h, v in sorted(util.items())),
                True,
            )
        )
    over = [r for r in results if r["sweep"] == "overbooking"]
    if over:
        top = max(r["params"]["factor"] for r in over)
        lat = pooled(results, "overbooking", "probe_latencies_s", factor=top)
        p95 = percentile(lat, 0.95)
        at_top = [r for r in over if r["params"]["factor"] == top]
        refused = sum(r["measured"]["probe_refused"] for r in at_top)
        viol = sum(r["measured"]["guarantee_violations"] for r in at_top)
        asked = sum(r["measured"]["guaranteed_requests"] for r in at_top)
        rows.append(
            _row(
                f"overbooking at {top:g}x: guaranteed probe p95",
                "1 s",
                "<= 2 s",
                "n/a" if p95 is None else f"{p95:.2f} s (n={len(lat)}, {refused} refused)",
                p95 is not None and p95 <= 2.0 and refused == 0,
            )
        )
        rows.append(
            _row(
                f"overbooking at {top:g}x: guarantee violations (probe and victim)",
                "0",
                "0",
                f"{viol} of {asked} guaranteed requests",
                viol == 0,
            )
        )
    enf = [r for r in results if r["sweep"] == "enforcement"]
    for mode, proto, bound, test in (
        ("prepaid", "pinned to B", "<= 1.1 B", lambda x: x <= 1.1),
        ("grant_instant", "167k GPU-s = 6.7 B", ">= 3 B", lambda x: x >= 3.0),
    ):
        xs = [r for r in enf if r["params"]["enforcement"] == mode]
        if not xs:
            continue
        vals = [r["measured"]["extracted_over_bucket"] for r in xs]
        worst = max(vals) if mode == "prepaid" else min(vals)
        rows.append(
            _row(
                f"enforcement {mode.replace('_', '-')}: GPU-s above R extracted "
                f"(B = {ADVERSARY_BUCKET:.0f})",
                proto,
                bound,
                f"{'max' if mode == 'prepaid' else 'min'} {worst:.2f} B over "
                f"{len(xs)} cells ({min(vals):.2f}..{max(vals):.2f} B)",
                test(worst),
            )
        )
    return rows
