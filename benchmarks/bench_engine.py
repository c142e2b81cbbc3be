"""Engine throughput: decisions per second with many campaigns and a deep queue, and how
the cost per event grows with the pool and the queue.

    python benchmarks/bench_engine.py [--campaigns 1000] [--pending 10000] [--events 20000]
    python benchmarks/bench_engine.py --scaling [--nodes 64,1024,10000]
        [--pendings 1000,10000,100000] [--events 2000] [--repeat 3]

Builds a pool of 8-GPU nodes (64 by default: 512 GPUs), creates the campaigns, fills the
pool with leases and queues ``--pending`` blocking requests behind it, then times a
seeded mix of events on top of that backlog: new requests (mostly queued, some
non-blocking and rejected), releases that let queued requests in, renewals, meters and
clock ticks that expire leases. Prints decisions/s and events/s for the measured phase,
and, as a baseline in the same run, the same mix on an empty queue.

``--scaling`` prints a table instead: for each pool size (``--nodes``) and queue depth
(``--pendings``) the same mix, with every campaign's envelope scaled with the pool
(guarantee, sustained rate, burst and bucket times nodes / 64, so that the same share of
the pool is contended at every size). Each cell shows the median microseconds per event
and decisions/s over ``--repeat`` rounds (interleaved: one round of every cell, then
the next, so that a slow spell of a shared machine hits every cell alike), their range,
and the ratio of its cost per event to the 64-node cell of the same queue depth in the
same round. Setup (filling the pool and the queue) is not timed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from bursar.broker import events as ev
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import RequestError
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

CLASSES = (LeaseClass.INTERACTIVE, LeaseClass.BATCH, LeaseClass.OPPORTUNISTIC)


IDLE_W, PEAK_W = 371.0, 1860.0
"""Marconi100's measured node idle and peak (docs/results/power.md), taken here for an
8-GPU node: a benchmark's figures, to make the cap bind, not a model of any machine."""


def build(n_campaigns: int, n_nodes: int = 64, power_cap_share: float | None = None) -> Engine:
    """``power_cap_share``: lease power under a cap of every node's idle draw plus this
    share of their draw above idle (None: power not leased, the default)."""
    power = {} if power_cap_share is None else {"idle_w": IDLE_W, "peak_w": PEAK_W}
    pool = PoolSpec(
        groups=(
            NodeGroup(
                count=n_nodes,
                resources={"gpu": 8, "cpu": 64, "mem_gb": 512},
                warm=n_nodes,
                **power,  # type: ignore[arg-type]
            ),
        ),
        boot_latency_s=60.0,
    )
    cap = (
        None
        if power_cap_share is None
        else n_nodes * (IDLE_W + power_cap_share * (PEAK_W - IDLE_W))
    )
    eng = Engine(pool, PolicySpec(grace_s=30.0, warm_headroom={"gpu": 0}, power_cap_w=cap))
    k = n_nodes / 64  # envelopes scale with the pool
    for i in range(n_campaigns):
        g = 0.25 if i % 4 == 0 else 0.0  # sum of guarantees stays well under 512
        spec = CampaignSpec(
            f"c{i:04d}",
            {
                "gpu": DimEnvelope(g * k, 4.0 * k, 64.0 * k, 200_000.0 * k),
                "fs_bw": DimEnvelope(0.0, 100.0, 400.0, 10_000.0),
            },
            CLASSES[i % 3],
            preemptible=(i % 10 == 9),
        )
        if spec.preemptible:
            spec = CampaignSpec(
                spec.name,
                {"gpu": DimEnvelope(0.0, 4.0 * k, 64.0 * k, None)},
                LeaseClass.OPPORTUNISTIC,
                True,
            )
        eng.apply(ev.CreateCampaign(0.0, spec))
    return eng


def fill(eng: Engine, n_pending: int, rng: random.Random, t: float) -> float:
    names = sorted(eng.campaigns)
    while len(eng.pending) < n_pending:
        t += 0.001
        c = rng.choice(names)
        eng.apply(ev.RequestLease(t, c, {"gpu": rng.choice((1, 2, 4, 8))}, rng.uniform(600, 3600)))
    return t


def mix(eng: Engine, n_events: int, rng: random.Random, t: float) -> tuple[int, int, float]:
    names = sorted(eng.campaigns)
    metered = [n for n in names if not eng.campaigns[n].spec.preemptible]
    decisions = 0
    applied = 0
    start = time.perf_counter()
    for _ in range(n_events):
        t += 0.01
        r = rng.random()
        live = list(eng.leases) if r < 0.45 else None
        if r < 0.3 and live:
            e: ev.Event = ev.Release(t, rng.choice(live))
        elif r < 0.45 and live:
            e = ev.Renew(t, rng.choice(live), 600.0)
        elif r < 0.5:
            e = ev.Meter(
                t,
                rng.choice(metered),
                "fs_bw",
                300.0,
            )
        elif r < 0.55:
            t += 5.0
            e = ev.Tick(t)
        else:
            e = ev.RequestLease(
                t,
                rng.choice(names),
                {"gpu": rng.choice((1, 2, 4, 8))},
                rng.uniform(600, 3600),
                blocking=rng.random() < 0.7,
            )
        try:
            decisions += len(eng.apply(e))
            applied += 1
        except RequestError:
            pass
    return decisions, applied, time.perf_counter() - start


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def scaling(a: argparse.Namespace) -> None:
    nodes, pendings = _ints(a.nodes), _ints(a.pendings)
    base_nodes = nodes[0]
    us: dict[tuple[int, int], list[float]] = {}
    dps: dict[tuple[int, int], list[float]] = {}
    ratio: dict[tuple[int, int], list[float]] = {}
    cells = [(n, p) for p in pendings for n in nodes]
    with progress(len(cells) * a.repeat) as bar:
        for r in range(a.repeat):
            for n, p in cells:
                rng = random.Random(a.seed + r)
                eng = build(a.campaigns, n)
                t = fill(eng, p, rng, 1.0)
                d, applied, s = mix(eng, a.events, rng, t)
                us.setdefault((n, p), []).append(s / applied * 1e6)
                dps.setdefault((n, p), []).append(d / s)
                bar.advance()
            for n, p in cells:
                ratio.setdefault((n, p), []).append(us[n, p][-1] / us[base_nodes, p][-1])
    print(
        f"{a.campaigns} campaigns, {a.events} events per cell, {a.repeat} rounds "
        f"(median, then min-max); ratio: cost per event against the {base_nodes}-node cell"
    )
    print(
        f"{'nodes':>7}{'pending':>9}{'us/event':>10}{'range':>16}"
        f"{'decisions/s':>13}{'range':>18}{'ratio':>7}{'range':>13}"
    )
    med = statistics.median
    for n, p in cells:
        u, dd, rr = us[n, p], dps[n, p], ratio[n, p]
        print(
            f"{n:>7,}{p:>9,}{med(u):>10.0f}{f'{min(u):.0f}-{max(u):.0f}':>16}"
            f"{med(dd):>13,.0f}{f'{min(dd):,.0f}-{max(dd):,.0f}':>18}"
            f"{med(rr):>7.2f}{f'{min(rr):.2f}-{max(rr):.2f}':>13}"
        )


def progress(total: int) -> Any:
    from rich.progress import Progress

    class _Bar:
        def __init__(self) -> None:
            self.p = Progress(transient=True)
            self.task = self.p.add_task("cells", total=total)

        def __enter__(self) -> _Bar:
            self.p.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self.p.__exit__(None, None, None)

        def advance(self) -> None:
            self.p.advance(self.task)

    return _Bar()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--campaigns", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=None, help="default 20000; 2000 per cell")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scaling", action="store_true", help="the nodes x pending table")
    ap.add_argument("--nodes", default="64,1024,10000")
    ap.add_argument("--pendings", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--power-cap-share",
        type=float,
        default=None,
        help="lease power under a cap: idle draw plus this share of the draw above idle",
    )
    a = ap.parse_args()
    if a.scaling:
        a.events = a.events or 2000
        scaling(a)
        return
    a.events = a.events or 20_000

    rng = random.Random(a.seed)
    base = build(a.campaigns, power_cap_share=a.power_cap_share)
    if a.power_cap_share is not None:
        print(f"power leased: cap {base.watts.cap:,.0f} W")
    d0, n0, s0 = mix(base, a.events, rng, 1.0)
    print(
        f"baseline (empty queue):   {d0 / s0:10.0f} decisions/s  {n0 / s0:10.0f} events/s "
        f"({d0} decisions, {n0} events in {s0:.2f} s)"
    )

    rng = random.Random(a.seed)
    eng = build(a.campaigns, power_cap_share=a.power_cap_share)
    t0 = time.perf_counter()
    t = fill(eng, a.pending, rng, 1.0)
    print(
        f"setup: {len(eng.campaigns)} campaigns, {len(eng.leases)} leases, "
        f"{len(eng.pending)} pending ({time.perf_counter() - t0:.1f} s)"
    )
    d, n, s = mix(eng, a.events, rng, t)
    print(
        f"deep queue ({len(eng.pending)} pending at end): {d / s:10.0f} decisions/s  "
        f"{n / s:10.0f} events/s ({d} decisions, {n} events in {s:.2f} s)"
    )
    print(f"ratio deep/baseline decisions/s: {(d / s) / (d0 / s0):.2f}")


if __name__ == "__main__":
    main()
