"""The clients' what-if calls against a real broker on loopback: typed answers that match
what the real call then gets, nothing changed, typed errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from client_support import server_thread
from service_support import START, run, serve

from bursar.broker.clock import ManualClock
from bursar.providers.client import (
    AdminClient,
    AsyncAdminClient,
    AsyncBrokerClient,
    Backoff,
    BrokerClient,
    CampaignSpec,
    DecisionKind,
    DimEnvelope,
    InvalidArgument,
    LeasePath,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ReasonCode,
    Refused,
    WhatIfResult,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)


def test_async_whatif_acquire_matches_the_real_acquire(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path, clock=ManualClock(START)) as c,
            AsyncBrokerClient(c.address, c.tokens["sci"], backoff=FAST) as sci,
        ):
            digest, entries = c.core.engine.state_digest(), c.journal_len()
            what = await sci.whatif_acquire(
                {"gpu": 4}, 60, blocking=False, labels={"job": "a"}, nodes=1
            )
            assert isinstance(what, WhatIfResult) and what.granted
            assert what.outcome is DecisionKind.GRANT and what.reason is ReasonCode.UNSPECIFIED
            assert what.lease is not None and what.lease.path is LeasePath.WARM
            [own] = what.decisions
            assert own.kind is DecisionKind.GRANT and own.seq == 0
            assert own.details["lease_id"] == what.lease.id == own.lease_id
            assert c.core.engine.state_digest() == digest and c.journal_len() == entries
            lease = await sci.acquire({"gpu": 4}, 60, blocking=False, labels={"job": "a"}, nodes=1)
            assert lease == what.lease

            # 24 held: its burst, and the whole pool (so the pool is what refuses).
            await sci.acquire({"gpu": 20}, 60, blocking=False)
            refused = await sci.whatif_acquire({"gpu": 4}, 60, blocking=False)
            assert refused.outcome is DecisionKind.REJECT and refused.lease is None
            assert refused.reason is ReasonCode.POOL_FULL
            with pytest.raises(Refused) as real:
                await sci.acquire({"gpu": 4}, 60, blocking=False)
            assert real.value.reason == refused.reason.value
            queued = await sci.whatif_acquire({"gpu": 4}, 60, timeout=5)
            assert queued.outcome is DecisionKind.QUEUE
            assert queued.reason is ReasonCode.POOL_FULL

            with pytest.raises(OutOfRange):  # the same error acquire raises
                await sci.whatif_acquire({"gpu": 4}, 7200)
            with pytest.raises(InvalidArgument):
                await sci.whatif_acquire({"tpu": 1}, 60)
            with pytest.raises(PermissionDenied):
                await sci.whatif_envelope(CampaignSpec("sci", {"gpu": DimEnvelope(0, 8, 32)}))

    run(scenario())


def test_async_whatif_envelope_from_the_broker_and_admin_clients(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path, clock=ManualClock(START)) as c,
            AsyncBrokerClient(c.address, c.tokens["sci"], backoff=FAST) as sci,
            AsyncBrokerClient(c.address, c.admin_token, backoff=FAST) as broker,
            AsyncAdminClient(c.address, c.admin_token, backoff=FAST) as admin,
        ):
            await sci.acquire({"gpu": 24}, 60, blocking=False)
            # Lower sci's burst below what it holds: nothing is revoked, and nothing
            # is granted either; raising other's opens nothing the pool lacks.
            current = (await admin.get_campaign("sci")).spec
            lower = CampaignSpec("sci", {"gpu": DimEnvelope(0, 8, 8, 100000.0)})
            for client in (broker, admin):
                what = await client.whatif_envelope(lower)
                assert what.outcome is DecisionKind.CAMPAIGN and what.lease is None
                assert [d.kind for d in what.decisions] == [DecisionKind.CAMPAIGN]
                assert what.decisions[0].campaign == "sci"
            assert (await admin.get_campaign("sci")).spec == current
            with pytest.raises(NotFound):
                await admin.whatif_envelope(CampaignSpec("nope", {}))

    run(scenario())


def test_sync_clients_whatif(tmp_path: Path) -> None:
    with (
        server_thread(tmp_path) as server,
        BrokerClient(server.address, server.tokens["sci"], backoff=FAST) as sci,
        AdminClient(server.address, server.admin_token, backoff=FAST) as admin,
    ):
        what = sci.whatif_acquire({"gpu": 8}, 30, blocking=False)
        assert what.granted and what.lease is not None and what.lease.campaign == "sci"
        assert sci.list_leases() == []
        spec = CampaignSpec("other", {"gpu": DimEnvelope(0, 8, 32, 100000.0)})
        assert admin.whatif_envelope(spec).outcome is DecisionKind.CAMPAIGN
        assert admin.get_campaign("other").spec.envelopes["gpu"].burst == 24
