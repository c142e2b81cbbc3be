"""Engine throughput: decisions per second with many campaigns and a deep queue.

    python benchmarks/bench_engine.py [--campaigns 1000] [--pending 10000] [--events 20000]

Builds a 512-GPU pool (64 nodes x 8 GPUs), creates the campaigns, fills the pool with
leases and queues ``--pending`` blocking requests behind it, then times a seeded mix of
events on top of that backlog: new requests (mostly queued, some non-blocking and
rejected), releases that let queued requests in, renewals, meters and clock ticks that
expire leases. Prints decisions/s and events/s for the measured phase, and, as a
baseline in the same run, the same mix on an empty queue.
"""

from __future__ import annotations

import argparse
import random
import time

from bursar.broker import events as ev
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import RequestError
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

CLASSES = (LeaseClass.INTERACTIVE, LeaseClass.BATCH, LeaseClass.OPPORTUNISTIC)


def build(n_campaigns: int) -> Engine:
    pool = PoolSpec(
        groups=(NodeGroup(count=64, resources={"gpu": 8, "cpu": 64, "mem_gb": 512}, warm=64),),
        boot_latency_s=60.0,
    )
    eng = Engine(pool, PolicySpec(grace_s=30.0, warm_headroom={"gpu": 0}))
    for i in range(n_campaigns):
        g = 0.25 if i % 4 == 0 else 0.0  # sum of guarantees stays well under 512
        spec = CampaignSpec(
            f"c{i:04d}",
            {
                "gpu": DimEnvelope(g, 4.0, 64.0, 200_000.0),
                "fs_bw": DimEnvelope(0.0, 100.0, 400.0, 10_000.0),
            },
            CLASSES[i % 3],
            preemptible=(i % 10 == 9),
        )
        if spec.preemptible:
            spec = CampaignSpec(
                spec.name,
                {"gpu": DimEnvelope(0.0, 4.0, 64.0, None)},
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--campaigns", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    base = build(a.campaigns)
    d0, n0, s0 = mix(base, a.events, rng, 1.0)
    print(
        f"baseline (empty queue):   {d0 / s0:10.0f} decisions/s  {n0 / s0:10.0f} events/s "
        f"({d0} decisions, {n0} events in {s0:.2f} s)"
    )

    rng = random.Random(a.seed)
    eng = build(a.campaigns)
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
