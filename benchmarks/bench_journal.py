"""Journal append throughput: one row per append, committed each time, as the broker does.

Run: ``.venv/bin/python benchmarks/bench_journal.py [--n 20000]``. Prints appends per
second for ``durability="normal"`` (WAL, synchronous=NORMAL: survives a process crash)
and ``durability="full"`` (synchronous=FULL: one fsync per append, survives power loss),
and the ratio between them. Rows are shaped like real ones: a lease request and its
grant with rule inputs. Files go to a temporary directory on the default temp filesystem
(set TMPDIR to measure another disk).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bursar.broker import codec
from bursar.broker import decisions as d
from bursar.broker import events as e
from bursar.broker.decisions import Decision
from bursar.broker.events import Event
from bursar.broker.journal import Durability, Journal
from bursar.broker.policy import NodeGroup, PolicySpec, PoolSpec

POOL = PoolSpec(
    groups=(NodeGroup(count=64, resources={"gpu": 8, "cpu": 64, "mem_gb": 512}, warm=64),)
)


def rows(n: int) -> list[tuple[Event, list[Decision]]]:
    """``n`` request/grant pairs with distinct ids and times, built before timing starts."""
    out: list[tuple[Event, list[Decision]]] = []
    for i in range(n):
        at = i * 0.25
        campaign = f"campaign-{i % 5}"
        event = e.RequestLease(at=at, campaign=campaign, size={"gpu": 4.0}, duration_s=60.0)
        grant = d.Granted(
            at=at,
            lease_id=f"L{i:08d}",
            campaign=campaign,
            size={"gpu": 4.0},
            path=d.LeasePath.WARM,
            starts_at=at,
            expires_at=at + 60.0,
            tokens=120.0,
            price=1.37,
            credits=0.0913,
            nodes=(f"node{i % 64:03d}",),
            inputs={
                "class_rank": 1,
                "deficit": 0.125,
                "bucket": 24000.0 - (i % 100),
                "held": {"gpu": 32.0},
                "pool": {"warm": 96.0, "reclaimable": 64.0, "cold": 0.0},
            },
        )
        out.append((event, [grant]))
    return out


def bench(durability: Durability, data: list[tuple[Event, list[Decision]]], tmp: Path) -> float:
    """Appends per second, each committed before the next starts."""
    with Journal.open(tmp / f"{durability}.sqlite", POOL, PolicySpec(), durability=durability) as j:
        t0 = time.perf_counter()
        for event, decisions in data:
            j.append(event, decisions)
        elapsed = time.perf_counter() - t0
    return len(data) / elapsed


def bench_encode(data: list[tuple[Event, list[Decision]]]) -> float:
    """Rows per second through canonical JSON alone: the ceiling for any durability."""
    t0 = time.perf_counter()
    for event, decisions in data:
        codec.encode(event)
        codec.dumps([codec.to_dict(x) for x in decisions])
    return len(data) / (time.perf_counter() - t0)


def bench_batched(data: list[tuple[Event, list[Decision]]], tmp: Path, batch: int) -> float:
    with Journal.open(tmp / "batched.sqlite", POOL, PolicySpec()) as j:
        t0 = time.perf_counter()
        for i in range(0, len(data), batch):
            j.append_many(data[i : i + batch])
        elapsed = time.perf_counter() - t0
    return len(data) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000, help="appends per run (default 20000)")
    parser.add_argument(
        "--n-full",
        type=int,
        default=None,
        help="appends for the durability=full run (default: --n); fsync-bound disks are slow",
    )
    args = parser.parse_args()
    data = rows(args.n)
    with tempfile.TemporaryDirectory(prefix="bursar-bench-") as tmpdir:
        tmp = Path(tmpdir)
        print(f"journal append benchmark: {args.n} rows, one commit per append, in {tmp}")
        normal = bench("normal", data, tmp)
        print(f"  durability=normal  {normal:10,.0f} appends/s")
        full = bench("full", data[: args.n_full or args.n], tmp)
        print(f"  durability=full    {full:10,.0f} appends/s")
        print(f"  normal / full      {normal / full:10.2f}x")
        print("for reference:")
        batched = bench_batched(data, tmp, batch=100)
        print(f"  append_many(100)   {batched:10,.0f} appends/s  (one commit per 100 rows)")
        encode = bench_encode(data)
        print(f"  encoding only      {encode:10,.0f} rows/s     (canonical JSON, no I/O)")


if __name__ == "__main__":
    main()
