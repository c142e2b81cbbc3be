"""The same agent program that runs in virtual time, against a live broker over gRPC."""

from __future__ import annotations

import random
import time
from pathlib import Path

from service_support import CAMPAIGNS, POOL, config, run, serve

from bursar.providers.client import AsyncBrokerClient, Backoff
from bursar.workflows.agents import Extractor, Victim
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


EXTRACTOR_CONFIG = POOL + CAMPAIGNS.replace(
    "[campaigns.sci.gpu]\nsustained = 8\nburst = 24\nbucket = 100000",
    "[campaigns.sci.gpu]\nsustained = 8\nburst = 24\nbucket = 20",
)


def test_extractor_agent_against_a_live_broker_falls_back_to_what_its_bucket_pays(
    tmp_path: Path,
) -> None:
    # Prepaid: 24 GPUs for 2 s needs (24 - 8) x 2 = 32 GPU-s above R, more than the
    # whole bucket (20): OUT_OF_RANGE over gRPC, which the agent sees as Refused and
    # answers with the largest size the bucket pays for (8 + 20 / 2 -> 16 GPUs).
    async def scenario() -> None:
        async with (
            serve(tmp_path, config(EXTRACTOR_CONFIG)) as c,
            AsyncBrokerClient(
                c.address, c.tokens["sci"], backoff=Backoff(initial_s=0.05, max_s=0.3), rng=1
            ) as client,
        ):
            ctx = GrpcCtx(client, "sci", random.Random(1))
            agent = Extractor(
                sustained=8.0, burst=24.0, lease_s=2.0, retry_s=0.2, until=time.time() + 1.0
            )
            await agent.run(ctx)
            asks = [(r["gpus"], r["refused"]) for k, r in ctx.records if k == "ask"]
            assert asks[:2] == [(24.0, "OUT_OF_RANGE"), (16.0, None)], asks
            # Then the bucket is spent: 8 more GPUs above R are refused, not granted.
            assert all(refused for _, refused in asks[2:]), asks

    run(scenario(), timeout_s=60)
