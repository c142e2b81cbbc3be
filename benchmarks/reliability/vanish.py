"""Clients that vanish without a word.

1. A client process holding leases (the client library's ``held_lease``, renewing in the
   background) is SIGKILLed. Its leases must end (EXPIRED) no later than their duration
   after the kill, plus ``TOLERANCE_S``; another campaign's blocking Acquire for the same
   capacity, sent at the kill, must be granted by then too.
2. A blocking Acquire whose channel is closed while it waits (the pool is full), and one
   whose process is SIGKILLed while it waits: the queued request must be withdrawn
   (a CANCELLED decision, nothing pending) within ``TOLERANCE_S``, and once the capacity
   is freed a non-blocking Acquire for all of it must succeed at once: the cut-off request
   holds nothing.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from common import Mode, Result, quantiles
from server import Server, md, pool_toml

from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

TOLERANCE_S = 0.5
"""How late past its bound an end may be: the broker's timer task wakes at the expiry, so
what is left is scheduling on a loaded machine (two cores shared with other work)."""

SIZES = {
    # rounds, leases held per client (8 GPUs each), lease duration s
    "short": (1, 2, 3.0),
    "long": (3, 2, 10.0),
}

HOLDER = """
import asyncio, sys
from bursar.providers.client import AsyncBrokerClient

async def main(address: str, token: str, n: int, duration: float) -> None:
    async with AsyncBrokerClient(address, token) as client:
        handles = [client.held_lease({"gpu": 8}, duration, blocking=False) for _ in range(n)]
        for h in handles:
            await h.__aenter__()
        print("HELD", *(h.id for h in handles), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""

WAITER = """
import asyncio, sys
import grpc
from bursar.protos.bursar.v1 import broker_pb2 as pb, broker_pb2_grpc as pbg

async def main(address: str, token: str) -> None:
    async with grpc.aio.insecure_channel(address) as ch:
        print("CALLING", flush=True)
        await pbg.BrokerStub(ch).Acquire(
            pb.AcquireRequest(size={"gpu": 16}, duration_s=60, timeout_s=60),
            metadata=(("authorization", f"Bearer {token}"),),
        )
        print("GRANTED", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def _pending(stub: pbg.BrokerStub, admin: str) -> int:
    return (await stub.GetStatus(pb.GetStatusRequest(), metadata=md(admin))).pending


async def _until(pred: object, timeout_s: float, step: float = 0.01) -> float:
    """Seconds until the async predicate holds (raises TimeoutError after timeout_s)."""
    t0 = time.perf_counter()
    while not await pred():  # type: ignore[operator]
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError
        await asyncio.sleep(step)
    return time.perf_counter() - t0


async def killed_holder(
    server: Server, stub: pbg.BrokerStub, duration: float, n: int, res: Result
) -> dict[str, float]:
    tokens, admin = server.tokens(), server.admin()
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, server.address, tokens["holder"], str(n), str(duration)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line.startswith("HELD"):
            raise RuntimeError(f"the holder process said {line!r}")
        lease_ids = line.split()[1:]
        # Long enough for the background renewals to have run at least once.
        await asyncio.sleep(duration * 0.8)
        t_kill = time.perf_counter()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Another campaign asks for the whole pool at once; it waits for the expiries.
    other = asyncio.ensure_future(
        stub.Acquire(
            pb.AcquireRequest(size={"gpu": 8.0 * n}, duration_s=5, timeout_s=duration + 10),
            metadata=md(tokens["other"]),
        )
    )
    expiries = {}
    for lid in lease_ids:
        lease = await stub.GetLease(pb.GetLeaseRequest(lease_id=lid), metadata=md(admin))
        expiries[lid] = lease.expires_at
    ended_after: list[float] = []
    late: list[float] = []
    for lid in lease_ids:

        async def ended(lid: str = lid) -> bool:
            lease = await stub.GetLease(pb.GetLeaseRequest(lease_id=lid), metadata=md(admin))
            return lease.HasField("ended_at")

        await _until(ended, duration + 10)
        ended_after.append(time.perf_counter() - t_kill)
        lease = await stub.GetLease(pb.GetLeaseRequest(lease_id=lid), metadata=md(admin))
        late.append(lease.ended_at - expiries[lid])
        if lease.state != pb.LEASE_STATE_EXPIRED:
            res.fail(f"{lid} ended {pb.LeaseState.Name(lease.state)}, not EXPIRED")
    got = await other
    back_s = time.perf_counter() - t_kill
    await stub.Release(pb.ReleaseRequest(lease_id=got.lease.lease_id), metadata=md(tokens["other"]))
    bound = duration + TOLERANCE_S
    if max(ended_after) > bound:
        res.fail(
            f"a killed client's lease ended {max(ended_after):.2f} s after the kill (> {bound})"
        )
    if back_s > bound:
        res.fail(f"the capacity came back {back_s:.2f} s after the kill (> {bound})")
    return {
        "ended_after_kill_s": max(ended_after),
        "expiry_late_s": max(late),
        "capacity_back_s": back_s,
        "waited_s": got.waited_s,
    }


async def cut_off_waiter(
    server: Server, stub: pbg.BrokerStub, how: str, res: Result
) -> dict[str, float]:
    """A blocking Acquire that waits on a full pool, then vanishes (``how``: its channel
    is closed, or its process SIGKILLed)."""
    tokens, admin = server.tokens(), server.admin()
    holder = md(tokens["holder"])
    full = await stub.Acquire(pb.AcquireRequest(size={"gpu": 16}, duration_s=120), metadata=holder)
    proc = None
    if how == "channel closed":
        channel = grpc.aio.insecure_channel(server.address)
        call = pbg.BrokerStub(channel).Acquire(
            pb.AcquireRequest(size={"gpu": 16}, duration_s=60, timeout_s=60),
            metadata=md(tokens["other"]),
        )
        waiting = asyncio.ensure_future(call)
    else:
        proc = subprocess.Popen(
            [sys.executable, "-c", WAITER, server.address, tokens["other"]],
            stdout=subprocess.PIPE,
            text=True,
        )
    try:
        await _until(lambda: _until_n(stub, admin, 1), 30)
        t_cut = time.perf_counter()
        if proc is None:
            await channel.close()
            await asyncio.gather(waiting, return_exceptions=True)
        else:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        await _until(lambda: _until_n(stub, admin, 0), 10, step=0.005)
        withdrawn_s = time.perf_counter() - t_cut
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    queued = await stub.ListDecisions(
        pb.ListDecisionsRequest(campaign="other", kinds=[pb.DECISION_KIND_QUEUE], limit=1000),
        metadata=md(admin),
    )
    rid = queued.decisions[-1].lease_id
    trail = await stub.ListDecisions(pb.ListDecisionsRequest(lease_id=rid), metadata=md(admin))
    kinds = [pb.DecisionKind.Name(d.kind) for d in trail.decisions]
    if kinds != ["DECISION_KIND_QUEUE", "DECISION_KIND_CANCELLED"]:
        res.fail(f"{how}: request {rid}'s decisions were {kinds}")
    await stub.Release(pb.ReleaseRequest(lease_id=full.lease.lease_id), metadata=holder)
    # All of the pool, at once: the cut-off request must not have taken any of it.
    again = await stub.Acquire(pb.AcquireRequest(size={"gpu": 16}, duration_s=5), metadata=holder)
    await stub.Release(pb.ReleaseRequest(lease_id=again.lease.lease_id), metadata=holder)
    others = await stub.ListLeases(pb.ListLeasesRequest(campaign="other"), metadata=md(admin))
    if others.leases:
        res.fail(f"{how}: the vanished client holds {[x.lease_id for x in others.leases]}")
    if withdrawn_s > TOLERANCE_S:
        res.fail(f"{how}: its request was withdrawn {withdrawn_s:.2f} s after (> {TOLERANCE_S})")
    return {"withdrawn_s": withdrawn_s}


async def _until_n(stub: pbg.BrokerStub, admin: str, n: int) -> bool:
    return await _pending(stub, admin) == n


def run(mode: Mode, work_dir: Path) -> Result:
    rounds, n, duration = SIZES[mode]
    res = Result("vanish")
    cfg = work_dir / "pool.toml"
    cfg.write_text(pool_toml(nodes=n, campaigns={"holder": 8.0 * n, "other": 8.0 * n}))
    server = Server(work_dir / "state", "--config", str(cfg))
    holders: list[dict[str, float]] = []
    cuts: dict[str, list[float]] = {"channel closed": [], "process killed": []}

    async def main() -> None:
        async with grpc.aio.insecure_channel(server.address) as ch:
            stub = pbg.BrokerStub(ch)
            for _ in range(rounds):
                holders.append(await killed_holder(server, stub, duration, n, res))
                for how in cuts:
                    cuts[how].append((await cut_off_waiter(server, stub, how, res))["withdrawn_s"])

    try:
        asyncio.run(main())
    finally:
        server.close()
    ended = max(h["ended_after_kill_s"] for h in holders)
    late = max(h["expiry_late_s"] for h in holders)
    back = max(h["capacity_back_s"] for h in holders)
    res.figures.update(
        rounds=rounds,
        lease_duration_s=duration,
        tolerance_s=TOLERANCE_S,
        killed_holder_leases=n * rounds,
        ended_after_kill_max_s=round(ended, 3),
        expiry_late_max_s=round(late, 3),
        capacity_back_max_s=round(back, 3),
        **{
            f"withdrawn_{how.replace(' ', '_')}_s": {
                k: (v if k == "n" else round(v, 3)) for k, v in quantiles(xs).items()
            }
            for how, xs in cuts.items()
        },
    )
    res.lines += [
        f"SIGKILLed holder ({n} leases of {duration:.0f} s, renewing, x{rounds}): leases "
        f"EXPIRED at most {ended:.2f} s after the kill (bound {duration + TOLERANCE_S:.1f} s), "
        f"at most {late * 1000:.0f} ms past expires_at; the whole pool granted to another "
        f"campaign {back:.2f} s after the kill",
        *(
            f"blocking Acquire cut off ({how}): withdrawn after at most {max(xs) * 1000:.0f} ms "
            f"(bound {TOLERANCE_S * 1000:.0f} ms); the freed pool then granted whole at once"
            for how, xs in cuts.items()
        ),
    ]
    return res
