"""The replay's fidelity gate: how closely a baseline replay reproduces the recorded schedule.

An SWF trace records, for every job, the wait the real machine gave it, so the schedule the
machine ran is known: start = submit + wait, end = start + runtime. ``fidelity`` replays the
trace under a baseline policy and compares the replayed schedule with that record. A policy
comparison on a trace is only worth as much as the replay's ability to reproduce the
machine's own behaviour under a policy close to the one it ran; this gate says how much.

Measures (replayed against observed, on the same jobs):

* aggregates: mean and p95 wait, utilisation (the definitions of ``metrics``: processor
  seconds used over capacity x span from the first submit to the last end);
* the wait distribution's Kolmogorov-Smirnov distance (the largest gap between the two
  empirical CDFs, 0 = identical, 1 = disjoint), and bounded slowdown percentiles (p50,
  p90, p95, p99; tau = 10 s by default) of both schedules;
* not graded: the KS distance with waits under a minute counted as a minute (a real
  scheduler's cycle delays almost every start by seconds, a replay's does not);
* correlation: Pearson and Spearman (average ranks for ties) of the per-job waits, and of
  the queue length over time, sampled at every job's submit instant (jobs submitted by
  then and not started by then). A series with no variance correlates 1 with an identical
  series and 0 with any other.

Grade, from four of the measures; the thresholds were fixed before any trace was graded
and are not tuned to results:

=============================  ==========  ============
measure                        high        medium
=============================  ==========  ============
KS distance of waits           <= 0.10     <= 0.25
mean wait relative error       <= 0.25     <= 0.50
utilisation, absolute gap      <= 0.02     <= 0.05
queue length Spearman          >= 0.80     >= 0.50
=============================  ==========  ============

``high`` when every measure meets its high threshold, ``medium`` when every one meets at
least its medium threshold, ``low`` otherwise. The mean wait's relative error is
``|replayed - observed| / max(observed, 60 s)``: a machine whose jobs barely wait is not
graded on seconds.

Baseline: given, or the best fit among fifo, easy and conservative: the highest grade,
ties broken by the smallest KS distance of the waits, then by that order. The gate needs
recorded waits: a trace without them (the synthetic Lublin traces) raises ``TraceError``.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bursar.sim.replay.ingest import load_trace
from bursar.sim.replay.kernel import replay
from bursar.sim.replay.mapping import ReplayConfig, Workload, to_workload
from bursar.sim.replay.metrics import DEFAULT_TAU_S, percentile
from bursar.sim.replay.policies import check_policy, make_policy
from bursar.sim.replay.table import QualityReport, Trace, TraceError

__all__ = [
    "BASELINES",
    "GRADES",
    "THRESHOLDS",
    "Fidelity",
    "Measures",
    "Thresholds",
    "fidelity",
    "grade",
    "ks_distance",
    "pearson",
    "spearman",
]

BASELINES = ("fifo", "easy", "conservative")
"""The policies a default baseline is chosen from, in tie-break order."""
GRADES = ("high", "medium", "low")
WAIT_FLOOR_S = 60.0
"""The mean wait's relative error divides by at least this."""
BSLD_PERCENTILES = (50, 90, 95, 99)
LATENCY_S = 60.0
"""Waits shorter than this count as this in the ungraded ``ks_wait_past_latency``."""


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The grade's limits (see the module docstring): a grade needs all four met."""

    high_ks: float = 0.10
    medium_ks: float = 0.25
    high_mean_wait_rel: float = 0.25
    medium_mean_wait_rel: float = 0.50
    high_util_gap: float = 0.02
    medium_util_gap: float = 0.05
    high_queue_spearman: float = 0.80
    medium_queue_spearman: float = 0.50


THRESHOLDS = Thresholds()


@dataclass(frozen=True, slots=True)
class Measures:
    """Replayed against observed; ``*_obs`` from the trace's record, ``*_rep`` the replay."""

    jobs: int
    mean_wait_obs: float
    mean_wait_rep: float
    mean_wait_rel: float
    p95_wait_obs: float
    p95_wait_rep: float
    util_obs: float
    util_rep: float
    util_gap: float
    ks_wait: float
    ks_wait_past_latency: float
    """Not graded: the KS distance with every wait under ``LATENCY_S`` counted as
    ``LATENCY_S``. A real scheduler starts almost no job in the second it arrives (its
    cycle takes seconds to a minute) where a replay starts many at once; this separates
    that latency from a different order of the queue."""
    bsld_obs: dict[str, float]
    """Bounded slowdown percentiles of the record, keyed "p50", "p90", "p95", "p99"."""
    bsld_rep: dict[str, float]
    wait_pearson: float
    wait_spearman: float
    queue_pearson: float
    queue_spearman: float


@dataclass(frozen=True, slots=True)
class Fidelity:
    """The gate's verdict on one trace and one baseline policy."""

    trace: str
    policy: str
    grade: str
    measures: Measures
    thresholds: Thresholds
    capacity: int
    chosen_by: str
    """How the baseline was picked: "given", or the rule that chose it."""
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every baseline tried when none was given: its grade and KS distance."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return _finite(d)

    def to_json(self) -> str:
        """The verdict as JSON (NaN written as null)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def markdown(self) -> str:
        """A Markdown table: each measure observed and replayed, then the grade."""
        m = self.measures
        rows = [
            ("mean wait (s)", _num(m.mean_wait_obs), _num(m.mean_wait_rep)),
            ("p95 wait (s)", _num(m.p95_wait_obs), _num(m.p95_wait_rep)),
            ("utilisation", f"{m.util_obs:.3f}", f"{m.util_rep:.3f}"),
        ]
        for k in m.bsld_obs:
            rows.append((f"bounded slowdown {k}", _num(m.bsld_obs[k]), _num(m.bsld_rep[k])))
        lines = [
            f"Fidelity of `{self.policy}` on `{Path(self.trace).name}` "
            f"({m.jobs:,} jobs): **{self.grade}**",
            "",
            "| measure | observed | replayed |",
            "|---|---:|---:|",
            *(f"| {a} | {b} | {c} |" for a, b, c in rows),
            "",
            "| gate measure | value | high | medium |",
            "|---|---:|---:|---:|",
        ]
        t = self.thresholds
        for name, value, hi, med in gate_rows(m, t):
            lines.append(f"| {name} | {value} | {hi} | {med} |")
        return "\n".join(lines) + "\n"


def gate_rows(m: Measures, t: Thresholds) -> list[tuple[str, str, str, str]]:
    """The four graded measures with their thresholds, formatted for a table."""
    return [
        ("KS distance of waits", f"{m.ks_wait:.3f}", f"<= {t.high_ks}", f"<= {t.medium_ks}"),
        (
            "mean wait relative error",
            f"{m.mean_wait_rel:.3f}",
            f"<= {t.high_mean_wait_rel}",
            f"<= {t.medium_mean_wait_rel}",
        ),
        (
            "utilisation gap",
            f"{m.util_gap:.3f}",
            f"<= {t.high_util_gap}",
            f"<= {t.medium_util_gap}",
        ),
        (
            "queue length Spearman",
            f"{m.queue_spearman:.3f}",
            f">= {t.high_queue_spearman}",
            f">= {t.medium_queue_spearman}",
        ),
        (
            f"KS distance past {LATENCY_S:g} s latency (not graded)",
            f"{m.ks_wait_past_latency:.3f}",
            "",
            "",
        ),
        ("wait Spearman (not graded)", f"{m.wait_spearman:.3f}", "", ""),
        ("queue length Pearson (not graded)", f"{m.queue_pearson:.3f}", "", ""),
    ]


def _num(x: float) -> str:
    return f"{x:,.1f}" if math.isfinite(x) else "n/a"


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def ks_distance(a: list[float], b: list[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: sup |F_a(x) - F_b(x)| over all x."""
    if not a or not b:
        raise ValueError("the KS distance needs two non-empty samples")
    xa = np.sort(np.asarray(a, dtype=float))
    xb = np.sort(np.asarray(b, dtype=float))
    grid = np.concatenate([xa, xb])
    # CDFs right-continuous at every sample point: the supremum is reached at one of them.
    fa = np.searchsorted(xa, grid, side="right") / len(xa)
    fb = np.searchsorted(xb, grid, side="right") / len(xb)
    return float(np.max(np.abs(fa - fb)))


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    if len(x) != len(y) or len(x) == 0:
        raise ValueError("correlation needs two series of the same non-zero length")
    sx, sy = float(np.std(x)), float(np.std(y))
    if sx == 0.0 or sy == 0.0:
        # Undefined in the formula; a constant series reproduced exactly is a perfect fit.
        return 1.0 if np.array_equal(x, y) else 0.0
    return float(np.corrcoef(x, y)[0, 1])


def pearson(x: list[float], y: list[float]) -> float:
    return _corr(np.asarray(x, dtype=float), np.asarray(y, dtype=float))


def _ranks(x: np.ndarray) -> np.ndarray:
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    return (upper - (counts - 1) / 2.0)[inv]


def spearman(x: list[float], y: list[float]) -> float:
    """Pearson correlation of the ranks, tied values sharing their average rank."""
    ax, ay = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.array_equal(ax, ay):
        return 1.0
    return _corr(_ranks(ax), _ranks(ay))


def _queue_lengths(submit: list[float], start: list[float]) -> list[float]:
    """Jobs waiting at each submit instant: submitted by then, not started by then."""
    ss, st = sorted(submit), sorted(start)
    return [float(bisect.bisect_right(ss, t) - bisect.bisect_right(st, t)) for t in submit]


def _utilisation(w: Workload, start: list[float]) -> float:
    n = len(w)
    if n == 0:
        return 0.0
    end = max(start[j] + w.hold[j] for j in range(n))
    span = end - min(w.submit)
    used = math.fsum(w.size[j] * w.hold[j] for j in range(n))
    return used / (w.capacity * span) if span > 0 else 0.0


def _bsld(waits: list[float], hold: list[float], tau_s: float) -> dict[str, float]:
    b = sorted(max(1.0, (wt + h) / max(h, tau_s)) for wt, h in zip(waits, hold, strict=True))
    return {f"p{p}": percentile(b, p) for p in BSLD_PERCENTILES}


def measure(
    w: Workload, observed_wait: list[float], replayed_start: list[float], tau_s: float
) -> Measures:
    """Compare a replayed schedule with the recorded waits of the same workload's jobs."""
    n = len(w)
    if n == 0 or len(observed_wait) != n or len(replayed_start) != n:
        raise ValueError("measure needs one observed wait and one replayed start per job")
    sub = w.submit
    rep_wait = [replayed_start[j] - sub[j] for j in range(n)]
    obs_start = [sub[j] + observed_wait[j] for j in range(n)]
    mo, mr = math.fsum(observed_wait) / n, math.fsum(rep_wait) / n
    so, sr = sorted(observed_wait), sorted(rep_wait)
    uo, ur = _utilisation(w, obs_start), _utilisation(w, replayed_start)
    qo, qr = _queue_lengths(sub, obs_start), _queue_lengths(sub, replayed_start)
    return Measures(
        jobs=n,
        mean_wait_obs=mo,
        mean_wait_rep=mr,
        mean_wait_rel=abs(mr - mo) / max(mo, WAIT_FLOOR_S),
        p95_wait_obs=percentile(so, 95),
        p95_wait_rep=percentile(sr, 95),
        util_obs=uo,
        util_rep=ur,
        util_gap=abs(ur - uo),
        ks_wait=ks_distance(so, sr),
        ks_wait_past_latency=ks_distance(
            [max(x, LATENCY_S) for x in so], [max(x, LATENCY_S) for x in sr]
        ),
        bsld_obs=_bsld(observed_wait, w.hold, tau_s),
        bsld_rep=_bsld(rep_wait, w.hold, tau_s),
        wait_pearson=pearson(observed_wait, rep_wait),
        wait_spearman=spearman(observed_wait, rep_wait),
        queue_pearson=pearson(qo, qr),
        queue_spearman=spearman(qo, qr),
    )


def grade(m: Measures, t: Thresholds = THRESHOLDS) -> str:
    """ "high", "medium" or "low" by the rule of the module docstring."""
    if (
        m.ks_wait <= t.high_ks
        and m.mean_wait_rel <= t.high_mean_wait_rel
        and m.util_gap <= t.high_util_gap
        and m.queue_spearman >= t.high_queue_spearman
    ):
        return "high"
    if (
        m.ks_wait <= t.medium_ks
        and m.mean_wait_rel <= t.medium_mean_wait_rel
        and m.util_gap <= t.medium_util_gap
        and m.queue_spearman >= t.medium_queue_spearman
    ):
        return "medium"
    return "low"


def _observed_waits(trace: Trace, w: Workload, capacity: int) -> list[float]:
    """The recorded wait of each workload job, in the workload's order.

    ``to_workload`` orders jobs by a stable sort on submit time and drops those larger
    than the capacity; the same walk here pairs each workload job with its record.
    """
    t = trace.jobs
    ids: list[int] = []
    out: list[float] = []
    for i in sorted(range(len(t)), key=t.submit.__getitem__):
        p = t.procs[i]
        if math.ceil(p if p > 0 else t.req_procs[i]) <= capacity:
            ids.append(t.id[i])
            out.append(float(t.wait[i]))
    if ids != list(w.job_id):  # the workload's columns may be arrays
        raise TraceError(f"{trace.path}: cannot pair the replayed jobs with their records")
    return out


def fidelity(
    trace: Trace | str | Path,
    policy: str | None = None,
    *,
    capacity: int | None = None,
    limit: int | None = None,
    fmt: str | None = None,
    config: ReplayConfig | None = None,
    tau_s: float = DEFAULT_TAU_S,
    thresholds: Thresholds = THRESHOLDS,
) -> Fidelity:
    """Replay ``trace`` (a loaded ``Trace`` or a path) under ``policy`` and grade how well
    the replay reproduces the recorded schedule.

    ``policy`` None: the best fit among ``BASELINES`` (see the module docstring).
    ``limit`` keeps the first N jobs by submit time; ``fmt`` is the trace format when it
    cannot be told from the name. Raises ``TraceError`` for a trace without recorded waits
    or without a machine size, ``ValueError`` for an unknown policy.
    """
    if policy is not None:
        check_policy(policy)
    tr = trace if isinstance(trace, Trace) else load_trace(trace, fmt)
    if "wait" in tr.quality.absent or not len(tr.jobs):
        raise TraceError(
            f"{tr.path}: the trace records no waits (a synthetic or GPU trace?): the fidelity "
            "gate compares a replay with the schedule the machine ran, and needs each job's "
            "observed wait"
        )
    cap = capacity if capacity is not None else tr.header.capacity
    if cap is None or cap <= 0:
        raise TraceError(
            f"{tr.path}: the trace does not say its machine size (no MaxProcs or MaxNodes); "
            "pass a capacity"
        )
    cap = int(cap)
    config = config or ReplayConfig()
    # A scratch report: the caller's trace keeps its own quality report untouched.
    w = to_workload(tr, cap, config.campaigns, QualityReport())
    obs = _observed_waits(tr, w, cap)
    if limit is not None and limit < len(w):
        for col in ("job_id", "submit", "size", "duration", "hold", "campaign"):
            setattr(w, col, getattr(w, col)[:limit])
        obs = obs[:limit]
    if not len(w):
        raise TraceError(f"{tr.path}: no job fits the machine ({cap})")

    def run(name: str) -> Measures:
        s = replay(w, make_policy(name, w, config), strict=True)
        return measure(w, obs, s.start, tau_s)

    if policy is not None:
        m = run(policy)
        return Fidelity(tr.path, policy, grade(m, thresholds), m, thresholds, cap, "given")
    tried: dict[str, Measures] = {name: run(name) for name in BASELINES}
    rank = {g: k for k, g in enumerate(GRADES)}
    best = min(
        BASELINES,
        key=lambda p: (rank[grade(tried[p], thresholds)], tried[p].ks_wait, BASELINES.index(p)),
    )
    candidates = {
        p: {"grade": grade(m, thresholds), "ks_wait": m.ks_wait} for p, m in tried.items()
    }
    return Fidelity(
        tr.path,
        best,
        grade(tried[best], thresholds),
        tried[best],
        thresholds,
        cap,
        "best of fifo, easy, conservative: highest grade, then smallest KS distance of waits",
        candidates,
    )
