"""What a WhatIf call's copy of the engine costs: pickling round trip against deepcopy;
and, with ``--service``, a WhatIf over gRPC against an Acquire.

    python benchmarks/bench_whatif.py [--leases 3000] [--ended 5000] [--pending 500]
        [--repeat 7] [--service]

Builds an engine in the state of a busy broker: a pool of 8-GPU nodes holding
``--leases`` live one-GPU leases of 20 campaigns, ``--ended`` leases that ended (the
engine remembers them in frozen chunks), ``--pending`` blocking requests queued behind a
full pool, and the idempotency keys of every request. Then, ``--repeat`` times each, it
copies the engine both ways WhatIf could:

* **pickle**: ``pickle.loads(pickle.dumps(engine))``, the snapshot's own capture
  (``snapshot.capture``) read back (``Engine.__getstate__`` leaves out per-pass caches);
* **deepcopy**: ``copy.deepcopy(engine)``, which calls the same ``__getstate__`` /
  ``__setstate__`` but walks the graph in Python, object by object.

Prints the median [min-max] milliseconds of each, whether each copy has the live
engine's state digest, and whether one non-blocking request decided on each copy gives
the live engine's own decision for it. The live engine is left as it was (its digest is
checked at the end).

``--service`` then starts the broker in process (``bursar serve``'s own server, on a
loopback port, a temporary state directory) with the same pool and ``--leases`` live
leases granted through Acquire, and times ``--repeat`` WhatIf calls (a one-GPU request)
against as many Acquire calls of the same request: the median [min-max] milliseconds
from the client's side. A WhatIf holds the broker's event loop while it copies.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import pickle
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from bursar.broker import events as ev
from bursar.broker.config import parse_config
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec, DimEnvelope, LeaseClass
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.server import Settings, running
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

NAMES = [f"c{i:02d}" for i in range(20)]


def build(leases: int, ended: int, pending: int) -> Engine:
    nodes = (leases + 7) // 8
    pool = PoolSpec(
        groups=(NodeGroup(nodes, {"gpu": 8, "cpu": 64, "mem_gb": 512}, warm=nodes),),
        boot_latency_s=60.0,
    )
    engine = Engine(pool, PolicySpec(max_lease_s=86_400.0))
    names = NAMES
    share = float(leases)
    for name in names:
        env = DimEnvelope(guarantee=0.0, sustained=share, burst=share, bucket=None)
        spec = CampaignSpec(name=name, envelopes={"gpu": env}, lease_class=LeaseClass.BATCH)
        engine.apply(ev.CreateCampaign(at=0.0, spec=spec))
    t = 1.0
    held: list[str] = []
    # Granted then released: what fills the engine's record of ended leases.
    for i in range(ended):
        out = engine.apply(
            ev.RequestLease(
                at=t,
                campaign=names[i % 20],
                size={"gpu": 1},
                duration_s=3600.0,
                idempotency_key=f"e{i}",
            )
        )
        engine.apply(ev.Release(at=t, lease_id=out.own.lease_id))  # type: ignore[union-attr]
        t += 0.001
    for i in range(leases):
        out = engine.apply(
            ev.RequestLease(
                at=t,
                campaign=names[i % 20],
                size={"gpu": 1},
                duration_s=80_000.0,
                idempotency_key=f"k{i}",
            )
        )
        held.append(out.own.lease_id)  # type: ignore[union-attr]
        t += 0.001
    for i in range(pending):
        engine.apply(
            ev.RequestLease(
                at=t,
                campaign=names[i % 20],
                size={"gpu": 2},
                duration_s=600.0,
                idempotency_key=f"q{i}",
            )
        )
        t += 0.001
    return engine


def probe(engine: Engine) -> object:
    """One request decided on ``engine``: what a WhatIf runs on its copy."""
    out = engine.apply(
        ev.RequestLease(
            at=engine.now + 1.0, campaign="c00", size={"gpu": 1}, duration_s=60, blocking=False
        )
    )
    return out.decisions


def _ms(times: list[float]) -> str:
    ms = [x * 1000 for x in times]
    return f"{statistics.median(ms):8.1f} ms [{min(ms):.1f}-{max(ms):.1f}]"


async def _service(leases: int, repeat: int) -> None:
    nodes = (leases + repeat + 7) // 8  # room for the timed Acquires too
    text = f"""
[pool]
boot_latency_s = 60
[pool.groups.w]
count = {nodes}
warm = {nodes}
gpu = 8
cpu = 64
mem_gb = 512
[policy]
max_lease_s = 86400
[policy.warm_headroom]
gpu = 0
""" + "".join(
        f'\n[campaigns.{n}]\nclass = "batch"\n[campaigns.{n}.gpu]\n'
        f"sustained = {leases}\nburst = {leases}\n"
        for n in NAMES
    )
    with tempfile.TemporaryDirectory() as state:
        settings = Settings(
            state_dir=Path(state),
            config=parse_config(text, "toml", source="bench_whatif"),
            port=0,
            metrics_port=None,
            limits=LimitSettings(rate=1e9, burst=1e9),
        )
        async with running(settings) as r, grpc.aio.insecure_channel(r.address) as channel:
            admin = (("authorization", f"Bearer {r.core.admin_token_path.read_text().strip()}"),)
            stub = pbg.BrokerStub(channel)
            for i in range(leases):
                await stub.Acquire(
                    pb.AcquireRequest(campaign=NAMES[i % 20], size={"gpu": 1}, duration_s=80_000),
                    metadata=admin,
                )
            ask = pb.AcquireRequest(campaign="c00", size={"gpu": 1}, duration_s=60)
            whatif, acquire = [], []
            for _ in range(repeat):
                t0 = time.perf_counter()
                await stub.WhatIf(pb.WhatIfRequest(acquire=ask), metadata=admin)
                whatif.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await stub.Acquire(ask, metadata=admin)
                acquire.append(time.perf_counter() - t0)
            print(f"service: {len(r.core.engine.leases)} live leases")
            print(f"WhatIf    {_ms(whatif)}")
            print(f"Acquire   {_ms(acquire)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--leases", type=int, default=3000)
    ap.add_argument("--ended", type=int, default=5000)
    ap.add_argument("--pending", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--service", action="store_true", help="also time WhatIf over gRPC")
    args = ap.parse_args()
    engine = build(args.leases, args.ended, args.pending)
    digest = engine.state_digest()
    print(
        f"engine: {len(engine.leases)} live leases, {len(engine.pending)} queued, "
        f"{len(engine.campaigns)} campaigns, {len(engine.pool.nodes)} nodes"
    )
    ways = {
        "pickle": lambda: pickle.loads(pickle.dumps(engine, protocol=pickle.HIGHEST_PROTOCOL)),
        "deepcopy": lambda: copy.deepcopy(engine),
    }
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(args.repeat):
        for name, make in ways.items():  # interleaved: a slow spell hits both alike
            t0 = time.perf_counter()
            make()
            times[name].append(time.perf_counter() - t0)
    expected = probe(copy.deepcopy(engine))
    for name, make in ways.items():
        twin = make()
        same = twin.state_digest() == digest
        decides = probe(twin) == expected
        print(f"{name:9s} {_ms(times[name])}  same digest: {same}  same decision: {decides}")
    assert engine.state_digest() == digest, "the live engine changed"
    if args.service:
        asyncio.run(_service(args.leases, args.repeat))


if __name__ == "__main__":
    main()
