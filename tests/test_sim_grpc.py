"""The same agent program that runs in virtual time, against a live broker over gRPC."""

from __future__ import annotations

import random
import time
from pathlib import Path

from service_support import run, serve

from bursar.providers.client import AsyncBrokerClient, Backoff
from bursar.workflows.agents import Victim
from bursar.workflows.grpc_ctx import GrpcCtx


def test_victim_agent_runs_against_a_live_broker(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            async with AsyncBrokerClient(
                c.address, c.tokens["sci"], backoff=Backoff(initial_s=0.05, max_s=0.3), rng=1
            ) as client:
                ctx = GrpcCtx(client, "sci", random.Random(1))
                agent = Victim(
                    period_s=0.3,
                    sizes=(8.0,),
                    hold_s=(0.1, 0.3),
                    duration_s=5.0,
                    max_leases=2,
                    until=time.time() + 2.5,
                )
                await agent.run(ctx)
                for t in ctx.tasks:
                    await t
                lat = [r for k, r in ctx.records if k == "latency"]
                assert len(lat) >= 4
                assert all(r["latency"] is not None and r["latency"] < 1.0 for r in lat)
                leases = await client.list_leases("sci")
                assert all(x.ended for x in leases)  # every lease it took, it released
            assert c.journal_len() > len(lat)

    run(scenario(), timeout_s=30)
