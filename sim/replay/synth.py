"""Generated parallel workloads for stress tests, written as SWF, deterministic per seed.

The model is Downey's (A. B. Downey, "A parallel workload model and its implications
for processor allocation", HPDC 1997): a job's size and its runtime are drawn from
log-uniform distributions, since both span orders of magnitude with no typical value;
sizes lean to powers of two as Lublin and Feitelson measured (U. Lublin and D. G.
Feitelson, "The workload on parallel supercomputers: modeling the characteristics of
rigid jobs", JPDC 63(11), 2003: about 75% of jobs). Arrivals are Poisson at the rate
that offers the machine the asked load. The stress knobs bend it:

* ``tail_alpha``: runtimes Pareto with this shape above the log-uniform's lower bound
  instead (a heavy tail: the smaller, the heavier; capped at ``max_runtime_s``);
* ``burst``: (start, length, factor): arrivals ``factor`` times as fast over [start,
  start + length) seconds from the first submission (a shock the site has not had);
* ``user_skew``: users drawn by Zipf's law with this exponent (0: all alike; 2: one
  user submits most jobs);
* ``load``: the offered load, the machine's processor-seconds asked per second over
  its capacity.

Requests overestimate runtimes as users do: the runtime times a factor log-uniform on
[1, 8], rounded up to a whole minute. Every draw comes from one ``random.Random(seed)``
in a fixed order, so the same parameters and seed write the same bytes.
"""

from __future__ import annotations

import gzip
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

POW2_SHARE = 0.75
"""The share of sizes rounded to a power of two (Lublin and Feitelson 2003)."""


@dataclass(frozen=True, slots=True)
class SynthParams:
    jobs: int = 10_000
    capacity: int = 128
    load: float = 0.7
    min_runtime_s: float = 10.0
    max_runtime_s: float = 86_400.0
    tail_alpha: float | None = None
    burst: tuple[float, float, float] | None = None
    users: int = 100
    user_skew: float = 1.0
    seed: int = 1

    def check(self) -> None:
        """ValueError naming the parameter and what it may be."""
        if self.jobs < 1:
            raise ValueError(f"jobs must be at least 1 (got {self.jobs})")
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1 (got {self.capacity})")
        if not (0 < self.load <= 10):
            raise ValueError(f"load must be in (0, 10] (got {self.load})")
        if not (0 < self.min_runtime_s < self.max_runtime_s):
            raise ValueError(
                "runtimes need 0 < min_runtime_s < max_runtime_s "
                f"(got {self.min_runtime_s}, {self.max_runtime_s})"
            )
        if self.tail_alpha is not None and not (0 < self.tail_alpha <= 10):
            raise ValueError(f"tail_alpha must be in (0, 10] (got {self.tail_alpha})")
        if self.burst is not None:
            start, length, factor = self.burst
            if start < 0 or length <= 0 or factor <= 0:
                raise ValueError(
                    f"burst is START,LENGTH,FACTOR with START >= 0, LENGTH > 0 and "
                    f"FACTOR > 0 (got {self.burst})"
                )
        if self.users < 1:
            raise ValueError(f"users must be at least 1 (got {self.users})")
        if not (0 <= self.user_skew <= 5):
            raise ValueError(f"user_skew must be in [0, 5] (got {self.user_skew})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _size(rng: random.Random, capacity: int) -> int:
    top = math.log2(capacity)
    x = rng.uniform(0.0, top)
    if rng.random() < POW2_SHARE:
        return min(capacity, 2 ** round(x))
    return max(1, min(capacity, round(2**x)))


def _runtime(rng: random.Random, p: SynthParams) -> float:
    if p.tail_alpha is None:
        lo, hi = math.log(p.min_runtime_s), math.log(p.max_runtime_s)
        return math.exp(rng.uniform(lo, hi))
    return min(p.max_runtime_s, p.min_runtime_s * rng.paretovariate(p.tail_alpha))


def generate(p: SynthParams) -> list[tuple[int, int, int, int, int, int]]:
    """Jobs as (id, submit, runtime, size, request, user), in submit order."""
    p.check()
    rng = random.Random(p.seed)
    sizes = [_size(rng, p.capacity) for _ in range(p.jobs)]
    runs = [max(1, round(_runtime(rng, p))) for _ in range(p.jobs)]
    # The mean gap that offers the asked load: work per job over load x capacity.
    work = math.fsum(s * r for s, r in zip(sizes, runs, strict=True)) / p.jobs
    gap = work / (p.load * p.capacity)
    weights = [1.0 / (k**p.user_skew) for k in range(1, p.users + 1)]
    users = rng.choices(range(1, p.users + 1), weights=weights, k=p.jobs)
    t = 0.0
    out = []
    for i in range(p.jobs):
        rate = 1.0
        if p.burst is not None and p.burst[0] <= t < p.burst[0] + p.burst[1]:
            rate = p.burst[2]
        t += rng.expovariate(rate / gap) if i else 0.0
        over = 2 ** rng.uniform(0.0, 3.0)
        req = 60 * math.ceil(runs[i] * over / 60)
        out.append((i + 1, int(t), runs[i], sizes[i], req, users[i]))
    return out


def write_swf(p: SynthParams, path: Path) -> Path:
    """Write the workload as SWF (gzip if the name ends in .gz), header lines first: the
    model, its citation and every parameter, so that the file says how to make it again."""
    jobs = generate(p)
    lines = [
        "; Version: 2.2",
        "; Computer: synthetic (bursar traces synth)",
        "; Note: Downey 1997 log-uniform sizes and runtimes, sizes leaning to powers of "
        "two (Lublin and Feitelson 2003), Poisson arrivals at the offered load",
        "; Parameters: " + " ".join(f"{k}={v}" for k, v in p.to_dict().items() if v is not None),
        f"; MaxJobs: {p.jobs}",
        f"; MaxRecords: {p.jobs}",
        f"; MaxProcs: {p.capacity}",
        f"; MaxNodes: {p.capacity}",
    ]
    for i, sub, run, size, req, user in jobs:
        # Waits are unknown (-1): a generated workload has no recorded schedule.
        lines.append(f"{i} {sub} -1 {run} {size} -1 -1 {size} {req} -1 1 {user} 1 -1 1 1 -1 -1")
    data = ("\n".join(lines) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    if path.name.endswith(".gz"):
        # mtime 0 and no file name in the gzip header: the same bytes every time.
        with open(tmp, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
            f.write(data)
    else:
        tmp.write_bytes(data)
    tmp.replace(path)
    return path
