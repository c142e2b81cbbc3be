"""The power model: what a node draws idle and loaded, what a job draws, what a GPU power
limit costs in run time, and a facility's draw over a schedule. Pure functions over
frozen values; the measurements come in through ``readers``.

Sources, each figure naming its own:

* **Node power** (``NodePower``), from Marconi100's measured node power per node per day
  (M100 ExaData, the BMC's ``total_power``): idle is a low percentile
  (``IDLE_PERCENTILE``) of the node-day means (a node-day mean is at least the node's
  floor, and the lowest are nodes idle all day), peak a high percentile
  (``PEAK_PERCENTILE``) of the node-day maxima (a 20 s sample under full load; the very
  top are sensor spikes). A loaded node's sustained draw, for a job whose power is not
  measured, is a quantile of the node-day means (``loaded``): the machine was busy most
  of the time, so a node-day mean is mostly a loaded node's average.
* **GPU power and the cost of a power limit** (``GpuProfile``), from Zeus's profiles
  (You, Chung and Chowdhury, NSDI '23): per model and GPU, the average GPU power at
  each power limit and the time per epoch relative to the highest limit (the median
  over the batch sizes and optimizers profiled).
* **Per job measured** where the trace has it (PM100's job table: ``readers``).
"""

from __future__ import annotations

import bisect
import hashlib
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bursar.sim.replay import metrics

IDLE_PERCENTILE = 1.0
"""Idle: the 1st percentile of node-day mean power (a node idle all day reads its floor)."""
PEAK_PERCENTILE = 99.0
"""Peak: the 99th percentile of node-day maximum power (above it: single-sample spikes)."""
QUANTILES = 100
"""A loaded node's draw is kept as this many quantiles of the node-day means (p0..p100)."""

ZEUS_MODELS: Mapping[str, str] = {
    "resnet50": "resnet50",
    "bert": "bert_base_uncased",
    "deepspeech2": "deepspeech2",
}
"""ElasticFlow's model names and their Zeus counterparts (gpt2, vgg16, inception3 have none)."""


def percentile(sorted_xs: Sequence[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of a sorted sequence."""
    if not sorted_xs:  # the replay's metrics answer NaN; a power model has no use for one
        raise ValueError("percentile of no values")
    return metrics.percentile(sorted_xs, p)


@dataclass(frozen=True, slots=True)
class NodePower:
    """One node type's draw in watts, and where the figures come from."""

    name: str
    idle_w: float
    peak_w: float
    loaded_w: tuple[float, ...]
    """Quantiles p0..p100 of a loaded node's sustained draw (ascending)."""
    source: str
    samples: int = 0
    """How many measurements the figures rest on (node-days)."""

    def __post_init__(self) -> None:
        if not 0 <= self.idle_w <= self.peak_w:
            raise ValueError(
                f"{self.name}: need 0 <= idle <= peak (got {self.idle_w}, {self.peak_w})"
            )
        if len(self.loaded_w) != QUANTILES + 1 or list(self.loaded_w) != sorted(self.loaded_w):
            raise ValueError(f"{self.name}: loaded_w must be {QUANTILES + 1} ascending quantiles")

    def loaded(self, u: float) -> float:
        """A loaded node's draw at quantile ``u`` in [0, 1], kept within [idle, peak]."""
        k = min(max(u, 0.0), 1.0) * QUANTILES
        lo = min(int(k), QUANTILES - 1)
        w = self.loaded_w[lo] + (self.loaded_w[lo + 1] - self.loaded_w[lo]) * (k - lo)
        return min(max(w, self.idle_w), self.peak_w)


def node_power(
    name: str, means: Iterable[float], maxima: Iterable[float], source: str
) -> NodePower:
    """A node type's ``NodePower`` from node-day means and maxima (W; zero readings, which
    are sensor faults, left out)."""
    m = sorted(x for x in means if x > 0)
    x = sorted(v for v in maxima if v > 0)
    if not m or not x:
        raise ValueError(f"{name}: no node-day power readings above 0 W")
    idle = percentile(m, IDLE_PERCENTILE)
    peak = percentile(x, PEAK_PERCENTILE)
    loaded = tuple(percentile(m, 100.0 * q / QUANTILES) for q in range(QUANTILES + 1))
    return NodePower(name, idle, max(peak, idle), loaded, source, len(m))


def job_quantile(job_id: int) -> float:
    """A job's place in the loaded-draw distribution, in [0, 1): fixed by its id (a hash,
    not a random draw), so a replay is the same on every run and every machine."""
    h = hashlib.blake2b(str(job_id).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2.0**64


def job_watts(node: NodePower, job_id: int, nodes: int) -> int:
    """A job's whole draw (W, rounded up) on ``nodes`` loaded nodes of type ``node``."""
    return math.ceil(nodes * node.loaded(job_quantile(job_id)))


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """One DNN model on one GPU, as Zeus measured it: at each power limit (W, ascending),
    the average GPU power (W) and the run time relative to the highest limit's."""

    network: str
    gpu: str
    limits: tuple[int, ...]
    watts: tuple[float, ...]
    slowdown: tuple[float, ...]
    """Time per epoch at the limit / time per epoch at the highest limit (>= about 1)."""

    @property
    def max_limit(self) -> int:
        return self.limits[-1]

    def at(self, limit: int) -> tuple[float, float]:
        """(average GPU power W, slowdown) at ``limit``: the measured limit at or below it
        (a limit between two measured ones runs as the lower, never better than measured)."""
        k = bisect.bisect_right(self.limits, limit) - 1
        if k < 0:
            raise ValueError(
                f"{self.network} on {self.gpu}: no measurement at or below {limit} W "
                f"(measured limits: {', '.join(map(str, self.limits))})"
            )
        return self.watts[k], self.slowdown[k]


@dataclass(frozen=True, slots=True)
class ZeusRow:
    dataset: str
    network: str
    batch_size: int
    optimizer: str
    power_limit: int
    time_per_epoch: float
    average_power: float


def gpu_profiles(rows: Iterable[ZeusRow], gpu: str) -> dict[str, GpuProfile]:
    """Per network: the median over its (dataset, batch size, optimizer) configurations of
    the average power and of the slowdown against that configuration's highest limit."""
    by_cfg: dict[tuple[str, str, int, str], dict[int, ZeusRow]] = {}
    for r in rows:
        by_cfg.setdefault((r.network, r.dataset, r.batch_size, r.optimizer), {})[r.power_limit] = r
    per_net: dict[str, dict[int, tuple[list[float], list[float]]]] = {}
    for (net, *_), pts in by_cfg.items():
        top = pts[max(pts)]
        for limit, r in pts.items():
            w, s = per_net.setdefault(net, {}).setdefault(limit, ([], []))
            w.append(r.average_power)
            s.append(r.time_per_epoch / top.time_per_epoch)
    out = {}
    for net, per_limit in sorted(per_net.items()):
        limits = tuple(sorted(per_limit))
        out[net] = GpuProfile(
            net,
            gpu,
            limits,
            tuple(statistics.median(per_limit[k][0]) for k in limits),
            tuple(statistics.median(per_limit[k][1]) for k in limits),
        )
    return out


@dataclass(frozen=True, slots=True)
class Draw:
    """A facility's draw over a schedule: energy, peak, and time above each cap."""

    energy_j: float
    peak_w: float
    above_s: dict[float, float]
    """Per cap (W): seconds the draw was above it."""


def facility_draw(
    start: Sequence[float],
    end: Sequence[float],
    extra_w: Sequence[float],
    idle_w: float,
    caps: Iterable[float] = (),
) -> Draw:
    """The draw of a machine whose nodes all draw idle (``idle_w`` in all) and each running
    job ``extra_w`` more, from the first start to the last end. A job with no start (NaN:
    refused) draws nothing."""
    steps: list[tuple[float, float]] = []
    for s, e, x in zip(start, end, extra_w, strict=True):
        if s == s and e > s:  # NaN: never ran
            steps.append((s, x))
            steps.append((e, -x))
    caps = sorted(set(caps))
    if not steps:
        return Draw(0.0, idle_w, dict.fromkeys(caps, 0.0))
    steps.sort()
    above = dict.fromkeys(caps, 0.0)
    level = idle_w
    peak = idle_w
    energy = 0.0
    t = steps[0][0]
    k = 0
    while k < len(steps):
        now = steps[k][0]
        dt = now - t
        if dt > 0:
            energy += level * dt
            for c in caps:
                if level > c:
                    above[c] += dt
        while k < len(steps) and steps[k][0] == now:
            level += steps[k][1]
            k += 1
        peak = max(peak, level)
        t = now
    return Draw(energy, peak, above)
