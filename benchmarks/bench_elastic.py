"""Elastic allocation cost: decisions per second with many elastic leases, and how the
cost per event grows with their number.

    python benchmarks/bench_elastic.py [--leases 100,1000,3000] [--events 2000]
        [--nodes 512] [--rule dmug] [--size-rule powers_of_two] [--repeat 3]

For each count E of elastic leases: a pool of ``--nodes`` 8-GPU nodes, E campaigns each
holding one elastic lease (min 1 GPU, max 16, Amdahl serial fraction 0.05, seeded work
and deadlines that admission control accepts; every whole size allowed, or with
``--size-rule powers_of_two`` only 1, 2, 4, 8 and 16 GPUs, so that a jump crosses
several steps, as on a measured curve), grown by the allocator over the spare
capacity; then a seeded mix of ``--events`` events is timed on top: fixed-size requests
of other campaigns (which take steps back, after a warning), their releases, elastic
leases released and asked for again, renewals, and clock ticks that fire the announced
shrinks. The baseline, in the same round, is the same mix with every elastic request
asked at its min and no intent (fixed leases of the same sizes and times). Each row shows
the median µs per event and decisions/s over ``--repeat`` interleaved rounds with their
range, and the ratio of the elastic mix's cost per event to the baseline's. Setup is not
timed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bursar.broker import events as ev
from bursar.broker.elastic import Intent
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.errors import RequestError
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

FIXED = 20
"""Campaigns that ask for fixed leases (and so take steps back from elastic ones)."""


def build(n_nodes: int, n_elastic: int, rule: str) -> Engine:
    pool = PoolSpec(
        groups=(NodeGroup(count=n_nodes, resources={"gpu": 8}, warm=n_nodes),),
        boot_latency_s=60.0,
    )
    eng = Engine(
        pool,
        PolicySpec(
            grace_s=30.0, warm_headroom={"gpu": 0}, power_down_idle_s=None, elastic_rule=rule
        ),
    )
    cap = 8.0 * n_nodes
    for i in range(n_elastic + FIXED):
        env = DimEnvelope(0.0, cap, cap, None)
        eng.apply(ev.CreateCampaign(0.0, CampaignSpec(f"c{i:05d}", {"gpu": env}, LeaseClass.BATCH)))
    return eng


def intent(rng: random.Random, size_rule: str) -> Intent:
    return Intent(
        min={"gpu": 1},
        max={"gpu": 16},
        remaining_work=rng.choice([2_000.0, 20_000.0, 80_000.0]),
        deadline_s=rng.choice([20_000.0, 40_000.0, 80_000.0]),
        amdahl=0.05,
        size_rule=size_rule,
    )


def request(
    name: str, rng: random.Random, t: float, elastic: bool, size_rule: str
) -> ev.RequestLease:
    it = intent(rng, size_rule)
    if elastic:
        return ev.RequestLease(t, name, {}, 3_600.0, intent=it)
    return ev.RequestLease(t, name, dict(it.min), 3_600.0)


def _id(d: object) -> str:
    return str(getattr(d, "lease_id", None) or getattr(d, "request_id", ""))


def run(
    n_nodes: int, n_elastic: int, n_events: int, rule: str, elastic: bool, seed: int, sizes: str
):
    """(seconds, events, decisions) of the timed mix."""
    eng = build(n_nodes, n_elastic, rule)
    rng = random.Random(seed)
    t = 1.0
    held: dict[str, str] = {}  # campaign -> its lease or request
    for i in range(n_elastic):
        name = f"c{i:05d}"
        held[name] = _id(eng.apply(request(name, rng, t, elastic, sizes)).own)
    fixed: list[str] = []
    decisions = events = 0
    start = time.perf_counter()
    for _ in range(n_events):
        t += rng.choice([0.0, 0.5, 1.0, 5.0, 20.0])
        due = eng.next_timer()
        if due is not None and due <= t:
            out = eng.apply(ev.Tick(due))
        else:
            r = rng.random()
            try:
                if r < 0.3:
                    name = f"c{n_elastic + rng.randrange(FIXED):05d}"
                    out = eng.apply(
                        ev.RequestLease(t, name, {"gpu": rng.choice([8, 16, 32])}, 600.0)
                    )
                    fixed.append(_id(out.own))
                elif r < 0.5 and fixed:
                    lid = fixed.pop(rng.randrange(len(fixed)))
                    if lid in eng.leases:
                        out = eng.apply(ev.Release(t, lid))
                    elif lid in eng.pending:
                        out = eng.apply(ev.CancelRequest(t, lid))
                    else:
                        out = eng.apply(ev.Tick(t))
                elif r < 0.8:
                    name = f"c{rng.randrange(n_elastic):05d}"
                    lid = held[name]
                    if lid in eng.leases:
                        out = eng.apply(ev.Release(t, lid))
                    elif lid in eng.pending:
                        out = eng.apply(ev.CancelRequest(t, lid))
                    else:
                        own = eng.apply(request(name, rng, t, elastic, sizes))
                        held[name] = (
                            own.own.request_id
                            if hasattr(own.own, "request_id")
                            else own.own.lease_id
                        )  # type: ignore[union-attr]
                        out = own
                elif r < 0.9:
                    name = f"c{rng.randrange(n_elastic):05d}"
                    lid = held[name]
                    out = (
                        eng.apply(ev.Renew(t, lid, 3_600.0))
                        if lid in eng.leases
                        else eng.apply(ev.Tick(t))
                    )
                else:
                    out = eng.apply(ev.Tick(t))
            except RequestError:
                continue
        events += 1
        decisions += len(out)
    return time.perf_counter() - start, events, decisions


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--leases", default="100,1000,3000", help="elastic lease counts, comma-separated"
    )
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--events", type=int, default=2_000)
    ap.add_argument("--rule", default="dmug")
    ap.add_argument(
        "--size-rule",
        default="",
        help="the intents' size rule: none (every whole size) or powers_of_two",
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    counts = [int(x) for x in a.leases.split(",")]
    rows: dict[int, dict[str, list[tuple[float, int, int]]]] = {
        n: {"elastic": [], "fixed": []} for n in counts
    }
    for _ in range(a.repeat):
        for n in counts:
            for kind in ("elastic", "fixed"):
                rows[n][kind].append(
                    run(a.nodes, n, a.events, a.rule, kind == "elastic", a.seed, a.size_rule)
                )
    print(
        f"{a.nodes} nodes x 8 GPUs, {a.events} events per round, {a.repeat} rounds, "
        f"rule {a.rule}, sizes {a.size_rule or 'every whole size'}"
    )
    print(
        f"{'elastic leases':>14} | {'µs/event':>9} {'range':>13} {'decisions/s':>11} | "
        f"{'fixed µs/event':>14} | {'ratio':>5} [range]"
    )
    for n in counts:
        e, f = rows[n]["elastic"], rows[n]["fixed"]
        us = [s / ev_ * 1e6 for s, ev_, _ in e]
        ds = [d / s for s, _, d in e]
        fus = [s / ev_ * 1e6 for s, ev_, _ in f]
        ratios = [x / y for x, y in zip(us, fus, strict=True)]
        print(
            f"{n:>14} | {statistics.median(us):>9.0f} {min(us):>6.0f}-{max(us):<6.0f} "
            f"{statistics.median(ds):>11,.0f} | {statistics.median(fus):>14.0f} | "
            f"{statistics.median(ratios):>5.1f} [{min(ratios):.1f}-{max(ratios):.1f}]"
        )


if __name__ == "__main__":
    main()
