"""A facility power cap over a replay: each job's draw from the power model, the cap's
budget, and the draw's metrics (energy, peak, time above each cap).

Every unit of the replay's capacity is one node of the model's type (``NodePower``):
idle it draws ``idle_w``; a job draws, on each of its nodes, its measured draw where the
trace records one (``Workload.measured_w``, PM100's job table: the job's whole draw),
else a loaded node's draw at the job's own quantile of the measured distribution
(``model.job_watts``). The cap is on the whole machine's draw: the running jobs' and
every other node's idle draw.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bursar.sim.power.model import NodePower, facility_draw, job_watts
from bursar.sim.replay.kernel import Schedule
from bursar.sim.replay.mapping import FacilityPower, Workload


@dataclass(frozen=True, slots=True)
class PowerSpec:
    """What a replay meters, and the cap it keeps (None: metered only, no cap)."""

    node: NodePower
    cap_w: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cap_w": self.cap_w,
            "node": self.node.name,
            "idle_w": round(self.node.idle_w, 3),
            "peak_w": round(self.node.peak_w, 3),
            "source": self.node.source,
        }


def extra_watts(w: Workload, node: NodePower) -> array:
    """Each job's draw above its nodes' idle draw, whole watts rounded up."""
    out = array("d")
    measured = w.measured_w
    idle = node.idle_w
    for j in range(len(w)):
        size = w.size[j]
        m = measured[j] if measured is not None else -1.0
        total = float(math.ceil(m)) if m > 0 else float(job_watts(node, w.job_id[j], size))
        out.append(float(max(math.ceil(total - size * idle), 0)))
    return out


def facility(w: Workload, spec: PowerSpec) -> FacilityPower:
    """The facility power (idle draw, each job's extra) under ``spec``'s cap (inf: none)."""
    cap = math.inf if spec.cap_w is None else float(spec.cap_w)
    idle = float(math.ceil(w.capacity * spec.node.idle_w))
    return FacilityPower(cap, idle, extra_watts(w, spec.node))


def floor_w(p: FacilityPower) -> float:
    """The feasibility floor: the lowest cap under which every job can run (the machine
    idle but for the job with the largest draw). Below it that job is stranded."""
    return p.idle_w + (max(p.extra_w) if len(p.extra_w) else 0.0)


def power_metrics(
    w: Workload, s: Schedule, p: FacilityPower, caps: Iterable[float] = ()
) -> dict[str, Any]:
    """Energy (kWh), peak and mean draw (kW), hours above the run's own cap (if it has
    one) and above each of ``caps``, jobs stranded (refused: they can never fit), the
    idle draw and the feasibility floor (kW)."""
    caps = sorted({*caps, *([p.cap_w] if math.isfinite(p.cap_w) else [])})
    d = facility_draw(s.start, s.end, p.extra_w, p.idle_w, caps)
    starts = [x for x in s.start if x == x]
    ends = [x for x in s.end if x == x]
    span = (max(ends) - min(starts)) if starts else 0.0
    out: dict[str, Any] = {
        "energy_kwh": d.energy_j / 3.6e6,
        "peak_kw": d.peak_w / 1e3,
        "mean_kw": d.energy_j / span / 1e3 if span > 0 else p.idle_w / 1e3,
        "idle_kw": p.idle_w / 1e3,
        "floor_kw": floor_w(p) / 1e3,
        "stranded": len(s.refused),
        "hours_above": {f"{c / 1e3:g}": d.above_s[c] / 3600 for c in caps},
    }
    if math.isfinite(p.cap_w):
        out["cap_kw"] = p.cap_w / 1e3
    return out
