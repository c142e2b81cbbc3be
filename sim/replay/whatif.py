"""Operator what-if on a trace: the same history under a baseline and candidate configs.

Every run is one ``replay_trace`` (strict, same trace, same prefix). A candidate changes
one or more of: the replay config (an envelope TOML), the capacity, the policy. The
report compares each candidate's KPIs with the baseline's and gives a verdict that is
"accepted" only when every hard constraint holds and p95 bounded slowdown improves:

* no guarantee violations (see ``guarantee_violations``), measured against the baseline's
  guarantees and the candidate's own, so a candidate cannot pass by dropping a promise;
* starvation no worse: no campaign has more starved jobs than under the baseline, with
  the baseline's ``starvation_s`` as the one yardstick for every run;
* no campaign has more jobs refused at submission than under the baseline (the broker
  refuses a job larger than the pool can ever give its campaign beside the others'
  guarantees; such a job never runs);
* utilisation no more than ``util_tolerance`` (in percentage points) below the baseline.

The functional core (``compare``) takes finished runs and returns plain data; the shell
(``write_whatif``) writes Markdown, HTML (figure inline), JSON and every run's manifest.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import html
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker.codec import json_safe
from bursar.broker.errors import require
from bursar.sim.replay.fidelity import fidelity
from bursar.sim.replay.mapping import ReplayConfig, Workload, load_replay_config
from bursar.sim.replay.metrics import DEFAULT_TAU_S, percentile
from bursar.sim.replay.policies import check_policy
from bursar.sim.replay.run import RunResult, replay_trace
from bursar.sim.replay.table import TraceError

DEFAULT_UTIL_TOLERANCE_PTS = 0.5
"""How far (percentage points) a candidate's utilisation may fall below the baseline's."""

DEFAULT_ISOLATION_BOUND_S = 30.0
"""A batch guarantee's bound: one reclaim grace period (the engine's default grace_s)."""

NOT_MODELLED = (
    "no network, storage or data staging: a job needs only its processors",
    "no node failures or drains unless the trace's own records show them",
    "runtimes as recorded: a job runs as long as it did on the real machine, whatever it is given",
    "users do not adapt: submit times, sizes and requested times are the trace's, "
    "whatever the queue looks like",
    "one always-warm node of the trace's capacity: no boots, no reclaims, no power-down, "
    "so reclaim and boot counts are not recorded",
    "no preemption: every lease is its campaign's class, none is preempted",
    "campaigns are the trace's users (or groups); a campaign is created at its first "
    "submission with its configured envelope",
)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One arm of the what-if: a label and what it changes against the baseline."""

    label: str
    config_path: Path | None = None
    capacity: int | None = None
    policy: str | None = None


def parse_candidate(spec: str) -> Candidate:
    """``path.toml`` (an envelope config), ``capacity=N``, ``policy=NAME``, or several of
    them joined by commas (``policy=easy,capacity=512``)."""
    config_path: Path | None = None
    capacity: int | None = None
    policy: str | None = None
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            raise ValueError(f"candidate {spec!r}: empty part")
        key, sep, value = part.partition("=")
        if sep and key == "capacity":
            try:
                capacity = int(value)
            except ValueError:
                raise ValueError(f"candidate {spec!r}: capacity must be an integer") from None
            if capacity <= 0:
                raise ValueError(f"candidate {spec!r}: capacity must be > 0")
        elif sep and key == "policy":
            try:
                check_policy(value)
            except ValueError as e:
                raise ValueError(f"candidate {spec!r}: {e}") from None
            policy = value
        elif sep and key == "config":
            config_path = Path(value)
        elif not sep:
            config_path = Path(part)
        else:
            raise ValueError(
                f"candidate {spec!r}: {key!r} is not one of config=, capacity=, policy= "
                "(or a path to a replay config)"
            )
    # A config is named by its file name: the report is read away from this machine.
    label = ",".join(_short(p.strip()) for p in spec.split(","))
    return Candidate(label, config_path, capacity, policy)


def _short(part: str) -> str:
    key, sep, value = part.partition("=")
    if not sep:
        return Path(part).name
    return f"config={Path(value).name}" if key == "config" else part


@dataclass(frozen=True, slots=True)
class Arm:
    """A run and what it was asked to be; ``result`` is None when the run failed."""

    label: str
    policy: str
    config: ReplayConfig
    result: RunResult | None
    error: str | None = None
    """Why the run failed (an invariant violation, an engine error)."""


def guarantee_violations(
    w: Workload,
    start: Sequence[float],
    end: Sequence[float],
    guarantees: dict[str, float],
    bound_s: float,
) -> dict[str, int]:
    """Per campaign: its requests within its unmet guarantee not served within ``bound_s``.

    What the replay records is each job's submit, start, end and campaign, so a request
    counts as within its campaign's unmet guarantee when, at its submit instant, the
    units of the campaign's own earlier requests not yet ended (running or still queued)
    plus its own size fit in the guarantee. Such a request violates the guarantee when it
    waits longer than ``bound_s``. Campaigns with no guarantee have none.
    """
    g_of = [guarantees.get(name, 0.0) for name in w.campaign_names]
    outstanding: list[list[tuple[float, int]]] = [[] for _ in w.campaign_names]
    held = [0] * len(w.campaign_names)
    out: dict[str, int] = {}
    for j in range(len(w)):
        c = w.campaign[j]
        g = g_of[c]
        if g <= 0:
            continue
        if math.isnan(start[j]):
            continue  # refused at its submission: it never ran nor held anything
        t = w.submit[j]
        heap = outstanding[c]
        while heap and heap[0][0] <= t:
            held[c] -= heapq.heappop(heap)[1]
        if held[c] + w.size[j] <= g and start[j] - t > bound_s:
            name = w.campaign_names[c]
            out[name] = out.get(name, 0) + 1
        heapq.heappush(heap, (end[j], w.size[j]))
        held[c] += w.size[j]
    return out


def starved_by_campaign(w: Workload, start: Sequence[float], starvation_s: float) -> dict[str, int]:
    out: dict[str, int] = {}
    for j in range(len(w)):
        if start[j] - w.submit[j] > starvation_s:
            name = w.campaign_names[w.campaign[j]]
            out[name] = out.get(name, 0) + 1
    return out


def _guarantees(config: ReplayConfig, names: Sequence[str]) -> dict[str, float]:
    return {n: config.overrides.get(n, config.default).guarantee for n in names}


def kpis(arm: Arm, starvation_s: float, guarantees: dict[str, float], bound_s: float) -> dict:
    r = arm.result
    assert r is not None
    m, w, s = r.metrics, r.workload, r.schedule
    no = set(s.refused)
    waits = sorted(s.start[j] - w.submit[j] for j in range(len(w)) if j not in no)
    violations = guarantee_violations(w, s.start, s.end, guarantees, bound_s)
    starved = starved_by_campaign(w, s.start, starvation_s)
    return {
        "label": arm.label,
        "policy": arm.policy,
        "capacity": m["capacity"],
        "unit": m["unit"],
        "jobs": m["jobs"],
        "p95_bsld": m["p95_bsld"],
        "mean_bsld": m["mean_bsld"],
        "mean_wait_s": m["mean_wait_s"],
        "p95_wait_s": percentile(waits, 95),
        "utilization": m["utilization"],
        "starved": sum(starved.values()),
        "starved_by_campaign": dict(sorted(starved.items())),
        "guarantee_violations": sum(violations.values()),
        "violations_by_campaign": dict(sorted(violations.items())),
        "killed": m["killed"],
        "killed_unit_seconds": m["killed_unit_seconds"],
        "refused": m["refused"],
        "refused_by_campaign": {
            k: v["refused"] for k, v in sorted(m["campaigns"].items()) if v["refused"]
        },
        # One always-warm node: the replay never reclaims or boots.
        "reclaims": None,
        "boots": None,
        "share": {k: v["share"] for k, v in sorted(m["campaigns"].items())},
        "campaign_jobs": {k: v["jobs"] for k, v in sorted(m["campaigns"].items())},
        "config_sha256": r.manifest["config_sha256"],
    }


DELTA_KEYS = (
    "p95_bsld",
    "mean_bsld",
    "mean_wait_s",
    "p95_wait_s",
    "utilization",
    "starved",
    "guarantee_violations",
    "killed",
    "refused",
)


def verdict(
    base: dict, cand: dict, util_tolerance_pts: float
) -> tuple[str, list[dict[str, Any]], list[str]]:
    """Each hard constraint with whether it held, and the narrative of the ones that failed."""
    constraints: list[dict[str, Any]] = []
    why: list[str] = []

    viol = cand["violations_by_campaign"]
    constraints.append(
        {
            "name": "no guarantee violations",
            "held": not viol,
            "value": cand["guarantee_violations"],
        }
    )
    if viol:
        worst = sorted(viol.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = ", ".join(f"{n}: {k}" for n, k in worst[:5])
        why.append(
            f"violates guarantees {cand['guarantee_violations']:,} times "
            f"(requests within the unmet guarantee that waited past the isolation bound; {parts}"
            f"{', ...' if len(worst) > 5 else ''})"
        )

    b_no, c_no = base.get("refused_by_campaign", {}), cand.get("refused_by_campaign", {})
    more = {n: (b_no.get(n, 0), k) for n, k in c_no.items() if k > b_no.get(n, 0)}
    constraints.append(
        {
            "name": "no campaign refused more jobs than under the baseline",
            "held": not more,
            "value": cand.get("refused", 0),
        }
    )
    if more:
        ranked_no = sorted(more.items(), key=lambda kv: (kv[1][0] - kv[1][1], kv[0]))
        parts = ", ".join(f"{n}: {k - b:,}" for n, (b, k) in ranked_no[:5])
        why.append(
            f"refuses {sum(k - b for b, k in more.values()):,} jobs the baseline ran, larger "
            f"than the pool can ever give their campaign beside the other campaigns' "
            f"guarantees ({parts}{', ...' if len(ranked_no) > 5 else ''})"
        )

    b_st, c_st = base["starved_by_campaign"], cand["starved_by_campaign"]
    worse = {
        n: (b_st.get(n, 0), k) for n, k in c_st.items() if k > b_st.get(n, 0)
    }  # (baseline, candidate)
    constraints.append(
        {
            "name": "no campaign starved more than under the baseline",
            "held": not worse,
            "value": cand["starved"],
        }
    )
    if worse:
        ranked = sorted(worse.items(), key=lambda kv: (kv[1][0] - kv[1][1], kv[0]))
        for n, (b, k) in ranked[:3]:
            jobs = cand["campaign_jobs"].get(n, 0)
            why.append(
                f"starves {_jobs(k - b)} of {n} more than the baseline: {k:,} of its "
                f"{_jobs(jobs)} waited longer than the starvation limit, against {b:,}"
            )
        if len(ranked) > 3:
            extra = sum(k - b for _, (b, k) in ranked[3:])
            why.append(f"and {extra:,} more starved jobs in {len(ranked) - 3} other campaigns")

    drop_pts = (base["utilization"] - cand["utilization"]) * 100.0
    ok_util = drop_pts <= util_tolerance_pts
    constraints.append(
        {
            "name": f"utilisation at most {util_tolerance_pts:g} points below the baseline",
            "held": ok_util,
            "value": cand["utilization"],
        }
    )
    if not ok_util:
        why.append(
            f"utilisation {cand['utilization']:.3f} against the baseline's "
            f"{base['utilization']:.3f}: {drop_pts:.2f} points lower, past the "
            f"{util_tolerance_pts:g}-point tolerance"
        )

    better = cand["p95_bsld"] < base["p95_bsld"]
    constraints.append(
        {"name": "p95 bounded slowdown improves", "held": better, "value": cand["p95_bsld"]}
    )
    if not better:
        why.append(
            f"p95 bounded slowdown {cand['p95_bsld']:,.2f} does not improve on the "
            f"baseline's {base['p95_bsld']:,.2f}"
        )
    ok = all(c["held"] for c in constraints)
    return ("accepted" if ok else "rejected"), constraints, why


def _jobs(n: int) -> str:
    return f"{n:,} job" if n == 1 else f"{n:,} jobs"


def pareto_front(rows: Sequence[dict]) -> list[str]:
    """Labels not dominated on (p95 bsld lower, mean wait lower, utilisation higher)."""

    def key(r: dict) -> tuple[float, float, float]:
        return (r["p95_bsld"], r["mean_wait_s"], -r["utilization"])

    front = []
    for r in rows:
        a = key(r)
        dominated = any(
            all(x <= y for x, y in zip(key(o), a, strict=True)) and key(o) != a
            for o in rows
            if o is not r
        )
        if not dominated:
            front.append(r["label"])
    return front


NOT_GRADED = "Fidelity: not graded"


def baseline_fidelity(
    trace: Path,
    policy: str,
    *,
    capacity: int | None,
    limit: int | None,
    config: ReplayConfig,
    tau_s: float,
    fmt: str | None = None,
) -> tuple[str, dict[str, Any] | None]:
    """The fidelity gate's grade of the baseline (the same policy, config and prefix): how
    closely it reproduces the schedule the machine recorded. One more replay."""
    try:
        f = fidelity(
            trace, policy, capacity=capacity, limit=limit, config=config, tau_s=tau_s, fmt=fmt
        )
    except TraceError as e:  # a trace without recorded waits cannot be graded
        return f"{NOT_GRADED} ({e})", None
    m = f.measures
    line = (
        f"Fidelity of the baseline (`{f.policy}` against the recorded schedule): "
        f"**{f.grade}** (KS distance of waits {m.ks_wait:.3f}, mean wait "
        f"{m.mean_wait_rep:,.0f} s replayed against {m.mean_wait_obs:,.0f} s recorded, "
        f"utilisation gap {m.util_gap:.3f}, queue-length Spearman {m.queue_spearman:.2f})"
    )
    return line, f.to_dict()


def _failed_row(arm: Arm) -> dict[str, Any]:
    return {
        "label": arm.label,
        "policy": arm.policy,
        "verdict": "rejected",
        "error": arm.error,
        "constraints": [
            {"name": "the replay runs to the end under the strict invariants", "held": False}
        ],
        "narrative": [f"the replay did not finish: {arm.error}"],
    }


def compare(
    baseline: Arm,
    candidates: Sequence[Arm],
    *,
    util_tolerance_pts: float = DEFAULT_UTIL_TOLERANCE_PTS,
    isolation_bound_s: float = DEFAULT_ISOLATION_BOUND_S,
    fidelity: tuple[str, dict[str, Any] | None] = (NOT_GRADED, None),
) -> dict[str, Any]:
    """The what-if report as plain data (what whatif.json holds). ``fidelity`` is the
    baseline's grade (``baseline_fidelity``), computed by the caller since it replays."""
    if baseline.result is None:
        raise ValueError(f"the baseline did not run: {baseline.error}")
    starvation_s = baseline.config.starvation_s
    names = baseline.result.workload.campaign_names
    base_g = _guarantees(baseline.config, names)
    base = kpis(baseline, starvation_s, base_g, isolation_bound_s)
    rows = []
    for arm in candidates:
        if arm.result is None:
            rows.append(_failed_row(arm))
            continue
        own = _guarantees(arm.config, arm.result.workload.campaign_names)
        g = {n: max(base_g.get(n, 0.0), own.get(n, 0.0)) for n in set(base_g) | set(own)}
        k = kpis(arm, starvation_s, g, isolation_bound_s)
        status, constraints, why = verdict(base, k, util_tolerance_pts)
        deltas = {key: k[key] - base[key] for key in DELTA_KEYS}
        share_delta = {
            n: k["share"].get(n, 0.0) - base["share"].get(n, 0.0)
            for n in sorted(set(k["share"]) | set(base["share"]))
        }
        rows.append(
            {
                **k,
                "verdict": status,
                "constraints": constraints,
                "narrative": why,
                "delta": deltas,
                "share_delta": share_delta,
            }
        )
    return json_safe(
        {
            "trace": baseline.result.manifest["input"],
            "limit": baseline.result.manifest["config"]["limit"],
            "starvation_s": starvation_s,
            "isolation_bound_s": isolation_bound_s,
            "util_tolerance_pts": util_tolerance_pts,
            "bsld_tau_s": baseline.result.metrics["bsld_tau_s"],
            "fidelity": fidelity[0],
            "fidelity_detail": fidelity[1],
            "baseline": base,
            "candidates": rows,
            "pareto_front": pareto_front([r for r in rows if "error" not in r]),
            "not_modelled": list(NOT_MODELLED),
            "manifests": {a.label: a.result.manifest for a in (baseline, *candidates) if a.result},
        }
    )


def run_whatif(
    trace: Path,
    baseline_config: Path | None,
    candidates: Sequence[Candidate],
    *,
    policy: str = "bursar",
    capacity: int | None = None,
    limit: int | None = None,
    tau_s: float = DEFAULT_TAU_S,
    progress: Callable[[str], None] | None = None,
    fmt: str | None = None,
) -> tuple[Arm, list[Arm]]:
    """Replay the baseline and every candidate on the same trace prefix.

    A candidate whose run fails (an invariant violation, an engine error) becomes an arm
    with the error, reported and rejected; the baseline's failure, or a trace that cannot
    be read, stops the what-if.
    """
    base_cfg = load_replay_config(baseline_config) if baseline_config else ReplayConfig()

    def one(label: str, pol: str, cfg: ReplayConfig, cap: int | None) -> Arm:
        r = replay_trace(trace, pol, capacity=cap, config=cfg, tau_s=tau_s, limit=limit, fmt=fmt)
        if progress is not None:
            progress(label)
        return Arm(label, pol, cfg, r)

    base = one("baseline", policy, base_cfg, capacity)
    arms = []
    for c in candidates:
        cfg = load_replay_config(c.config_path) if c.config_path else base_cfg
        cap = c.capacity if c.capacity is not None else capacity
        pol = c.policy or policy
        try:
            arms.append(one(c.label, pol, cfg, cap))
        except TraceError:
            raise
        except Exception as e:  # reported in the what-if as the candidate's failure
            arms.append(Arm(c.label, pol, cfg, None, f"{type(e).__name__}: {e}"))
            if progress is not None:
                progress(f"{c.label} (failed)")
    return base, arms


# The shell: Markdown, HTML, JSON, figure and manifests.

_ROWS: tuple[tuple[str, str, str], ...] = (
    ("p95_bsld", "p95 bounded slowdown", "{:,.2f}"),
    ("mean_wait_s", "mean wait (s)", "{:,.0f}"),
    ("p95_wait_s", "p95 wait (s)", "{:,.0f}"),
    ("utilization", "utilisation", "{:.4f}"),
    ("starved", "starved jobs", "{:,}"),
    ("guarantee_violations", "guarantee violations", "{:,}"),
    ("killed", "killed at a refused renewal", "{:,}"),
    ("refused", "refused at submission", "{:,}"),
    ("mean_bsld", "mean bounded slowdown", "{:,.2f}"),
)


def _fmt(fmt: str, v: Any) -> str:
    return "n/a" if v is None else fmt.format(v)


def _delta(fmt: str, v: float) -> str:
    s = fmt.format(v)
    return s if s.startswith("-") else "+" + s


def _share_rows(rep: dict[str, Any], top: int = 8) -> list[tuple[str, list[float]]]:
    """The campaigns whose share moved most under any candidate, largest first."""
    moved: dict[str, float] = {}
    for c in rep["candidates"]:
        for n, d in c.get("share_delta", {}).items():
            moved[n] = max(moved.get(n, 0.0), abs(d))
    names = sorted(moved, key=lambda n: (-moved[n], n))[:top]
    return [(n, [c.get("share_delta", {}).get(n) for c in rep["candidates"]]) for n in names]


def _safe_label(label: str) -> str:
    stem = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)[:40]
    return f"{stem}-{hashlib.sha256(label.encode()).hexdigest()[:8]}"


def markdown(rep: dict[str, Any], command: str, figure_name: str | None) -> str:
    base, cands = rep["baseline"], rep["candidates"]
    limit = f"the first {rep['limit']:,} jobs" if rep["limit"] else "every job"
    out = [
        "# What-if on a trace",
        "",
        f"Regenerate with `{command}`. Trace `{rep['trace']['trace']}` (sha256 "
        f"`{rep['trace']['sha256'][:16]}`), {limit}; baseline policy `{base['policy']}` on "
        f"{base['capacity']:,} {base['unit']}.",
        "",
        f"{rep['fidelity']}.",
        "",
        "## Hard constraints",
        "",
        "A candidate is accepted only if its replay runs to the end under the strict "
        "invariants and all of these hold:",
        "",
        f"1. no guarantee violations: no request within its campaign's unmet guarantee "
        f"waits longer than the isolation bound ({rep['isolation_bound_s']:g} s), against "
        "the baseline's guarantees and the candidate's own. A request is within the unmet "
        "guarantee when its campaign's earlier requests not yet ended (running or queued), "
        "plus its own size, fit in the guarantee at its submit time;",
        f"2. starvation no worse: no campaign has more jobs waiting longer than "
        f"{rep['starvation_s']:g} s (the baseline's starvation limit) than under the baseline;",
        f"3. utilisation at most {rep['util_tolerance_pts']:g} percentage points below the "
        "baseline's;",
        f"4. and p95 bounded slowdown improves on the baseline's (tau = {rep['bsld_tau_s']:g} s).",
        "",
        "## KPIs and deltas against the baseline",
        "",
        "| KPI | baseline | " + " | ".join(f"`{c['label']}`" for c in cands) + " |",
        "|---|---:|" + "---:|" * len(cands),
    ]
    for key, head, fmt in _ROWS:
        cells = [
            f"{_fmt(fmt, c[key])} ({_delta(fmt, c['delta'][key])})" if "delta" in c else "failed"
            for c in cands
        ]
        out.append(f"| {head} | {_fmt(fmt, base[key])} | " + " | ".join(cells) + " |")
    out.append(
        "| reclaims / boots | not recorded | " + " | ".join("not recorded" for _ in cands) + " |"
    )
    out.append("| **verdict** | | " + " | ".join(f"**{c['verdict']}**" for c in cands) + " |")
    out += [
        "",
        "Per-campaign share of the processor-seconds used, the campaigns that moved most "
        "(delta in percentage points against the baseline's share):",
        "",
        "| campaign | baseline share | " + " | ".join(f"`{c['label']}`" for c in cands) + " |",
        "|---|---:|" + "---:|" * len(cands),
    ]
    for n, ds in _share_rows(rep):
        cells = ["failed" if d is None else f"{d * 100:+.2f}" for d in ds]
        out.append(f"| {n} | {base['share'].get(n, 0.0):.4f} | " + " | ".join(cells) + " |")
    out += ["", "## Verdicts", ""]
    for c in cands:
        out.append(f"### `{c['label']}`: {c['verdict']}")
        out.append("")
        for k in c["constraints"]:
            out.append(f"- [{'x' if k['held'] else ' '}] {k['name']}")
        if c["narrative"]:
            out += ["", "Why it is blocked:", ""]
            out += [f"- {line}" for line in c["narrative"]]
        out.append("")
    front = ", ".join(f"`{x}`" for x in rep["pareto_front"]) or "none"
    out += [
        "## Pareto front",
        "",
        "Among the candidates, over (p95 bounded slowdown lower, mean wait lower, "
        f"utilisation higher): {front}.",
        "",
    ]
    if figure_name:
        out += [f"![p95 bounded slowdown against mean wait per run]({figure_name})", ""]
    out += ["## What the replay does not model", ""]
    out += [f"- {x}" for x in rep["not_modelled"]]
    out += [
        "",
        "Every run's manifest is in `whatif.json` and under `runs/`.",
        "",
    ]
    return "\n".join(out)


def figure_png(rep: dict[str, Any]) -> bytes:
    require("matplotlib", extra="plots", feature="the what-if figure")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    rows = [rep["baseline"], *(c for c in rep["candidates"] if "error" not in c)]
    front = set(rep["pareto_front"])
    for r in rows:
        is_base = r is rep["baseline"]
        accepted = r.get("verdict") == "accepted"
        marker = "s" if is_base else ("o" if accepted else "x")
        color = "black" if is_base else ("tab:green" if accepted else "tab:red")
        ax.scatter(r["mean_wait_s"], r["p95_bsld"], marker=marker, color=color, s=60)
        tag = r["label"] + (" (front)" if r["label"] in front else "")
        ax.annotate(
            f"{tag}\nutil {r['utilization']:.3f}",
            (r["mean_wait_s"], r["p95_bsld"]),
            fontsize=7,
            xytext=(5, 5),
            textcoords="offset points",
        )
    ax.set_xlabel("mean wait (s)")
    ax.set_ylabel("p95 bounded slowdown")
    ax.set_title("baseline (square), accepted (circle), rejected (cross)")
    fig.tight_layout()
    buf = io.BytesIO()
    # No timestamps in the PNG, so the same runs give the same bytes.
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def html_page(md_text: str, rep: dict[str, Any], png: bytes | None) -> str:
    """A self-contained page: the report's tables and lists, the figure inline."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>What-if on a trace</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:"
        "collapse;margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:4px 8px}"
        "td{text-align:right}td:first-child{text-align:left}.accepted{color:#070}"
        ".rejected{color:#a00}</style></head><body>",
    ]
    in_table = in_list = False
    for line in md_text.splitlines():
        if line.startswith("|"):
            cells = [x.strip() for x in line.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            if not in_table:
                parts.append("<table>")
                in_table = True
                tag = "th"
            else:
                tag = "td"
            parts.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            parts.append("</table>")
            in_table = False
        if line.startswith(("- ", "1. ", "2. ", "3. ", "4. ")):
            if not in_list:
                parts.append("<ul>")
                in_list = True
            item = line.split(" ", 1)[1]
            parts.append(f"<li>{_inline(item)}</li>")
            continue
        if in_list:
            parts.append("</ul>")
            in_list = False
        if line.startswith("!["):
            if png is not None:
                data = base64.b64encode(png).decode()
                parts.append(f"<img alt='what-if figure' src='data:image/png;base64,{data}'>")
        elif line.startswith("### "):
            v = "accepted" if line.endswith("accepted") else "rejected"
            parts.append(f"<h3 class='{v}'>{_inline(line[4:])}</h3>")
        elif line.startswith("## "):
            parts.append(f"<h2>{_inline(line[3:])}</h2>")
        elif line.startswith("# "):
            parts.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.strip():
            parts.append(f"<p>{_inline(line)}</p>")
    if in_table:
        parts.append("</table>")
    if in_list:
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _inline(text: str) -> str:
    out = html.escape(text)
    for mark, tag in (("**", "b"), ("`", "code")):
        pieces = out.split(mark)
        if len(pieces) % 2 == 1:
            out = "".join(p if i % 2 == 0 else f"<{tag}>{p}</{tag}>" for i, p in enumerate(pieces))
    return out.replace("[x]", "&#9745;").replace("[ ]", "&#9744;")


def write_whatif(
    baseline: Arm, candidates: Sequence[Arm], rep: dict[str, Any], out: Path, command: str
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    try:
        png: bytes | None = figure_png(rep)
    except ImportError:  # matplotlib is the plots extra; the tables stand without it
        png = None
    written = []
    fig_name = None
    if png is not None:
        fig_path = out / "whatif.png"
        fig_path.write_bytes(png)
        fig_name = fig_path.name
        written.append(fig_path)
    md_text = markdown(rep, command, fig_name)
    md = out / "whatif.md"
    md.write_text(md_text)
    page = out / "whatif.html"
    page.write_text(html_page(md_text, rep, png))
    data = out / "whatif.json"
    data.write_text(json.dumps({**rep, "command": command}, indent=1, sort_keys=True) + "\n")
    written = [md, page, data, *written]
    runs = out / "runs"
    for arm in (baseline, *candidates):
        if arm.result is None:
            continue  # a failed run wrote nothing; its error is in the report
        d = runs / _safe_label(arm.label)
        d.mkdir(parents=True, exist_ok=True)
        p = d / "manifest.json"
        p.write_text(json.dumps(arm.result.manifest, indent=2, sort_keys=True) + "\n")
        written.append(p)
    return written


__all__ = [
    "Arm",
    "Candidate",
    "compare",
    "guarantee_violations",
    "pareto_front",
    "parse_candidate",
    "run_whatif",
    "write_whatif",
]
