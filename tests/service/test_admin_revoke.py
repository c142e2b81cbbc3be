"""Admin.RevokeLease over real gRPC: an operator ends a live lease at once; its holder's
watch reports the revocation with the operator's reason; the journal records it and the
audit replays it; every bad call is refused with the right status and journals nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from service_support import run, serve

from bursar.broker.audit import audit
from bursar.broker.journal import JOURNAL_FILENAME, Journal
from bursar.providers.client import (
    AsyncAdminClient,
    AsyncBrokerClient,
    Backoff,
    FailedPrecondition,
    InvalidArgument,
    LeaseEventKind,
    LeaseState,
    NotFound,
    PermissionDenied,
)

FAST = Backoff(initial_s=0.05, max_s=0.3)


def test_an_operator_revokes_a_lease_and_its_holder_is_told_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path) as c,
            AsyncBrokerClient(c.address, c.tokens["sci"], backoff=FAST) as sci,
            AsyncAdminClient(c.address, c.admin_token, backoff=FAST) as admin,
        ):
            lease = await sci.acquire({"gpu": 8}, 60, blocking=False)
            watch = sci.watch(lease.id)
            snap = await asyncio.wait_for(anext(watch), 5)
            assert snap.snapshot and snap.kind is LeaseEventKind.ACTIVATED
            free_before = (await sci.supply()).dims["gpu"].available_warm

            ended = await admin.revoke_lease(lease.id, "draining node for maintenance")
            assert ended.state is LeaseState.REVOKED
            assert ended.end_cause == "revoked by an administrator: draining node for maintenance"

            ev = await asyncio.wait_for(anext(watch), 5)
            assert ev.kind is LeaseEventKind.REVOKED and ev.lease.end_cause == ended.end_cause
            assert (await sci.get_lease(lease.id)).state is LeaseState.REVOKED
            # Its GPUs are back in the pool at once.
            assert (await sci.supply()).dims["gpu"].available_warm == free_before + 8
            # The holder's own release after the fact is harmless.
            assert (await sci.release(lease.id)).state is LeaseState.REVOKED

    run(scenario())
    journal = Journal.open(tmp_path / JOURNAL_FILENAME)
    try:
        revocations = [
            event_json
            for _seq, event_json, _decisions in journal.raw_entries()
            if "revoked by an administrator: draining node" in event_json
        ]
        assert len(revocations) == 1
        report = audit(journal)
        assert report.ok and not report.mismatches
    finally:
        journal.close()


def test_bad_revocations_are_refused_and_journal_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            serve(tmp_path) as c,
            AsyncBrokerClient(c.address, c.tokens["sci"], backoff=FAST) as sci,
            AsyncAdminClient(c.address, c.admin_token, backoff=FAST) as admin,
        ):
            lease = await sci.acquire({"gpu": 8}, 60, blocking=False)
            done = await sci.acquire({"gpu": 8}, 60, blocking=False)
            await sci.release(done.id)
            before = c.journal_len()

            with pytest.raises(NotFound, match="no lease 'L999'"):
                await admin.revoke_lease("L999", "why not")
            with pytest.raises(FailedPrecondition, match="already ended"):
                await admin.revoke_lease(done.id, "too late")
            with pytest.raises(InvalidArgument, match="reason"):
                await admin.revoke_lease(lease.id, "   ")
            with pytest.raises(InvalidArgument, match="200 printable"):
                await admin.revoke_lease(lease.id, "x" * 201)
            with pytest.raises(InvalidArgument, match="lease_id"):
                await admin.revoke_lease("", "no id")
            # A campaign's own token is not an admin token.
            async with AsyncAdminClient(c.address, c.tokens["sci"], backoff=FAST) as not_admin:
                with pytest.raises(PermissionDenied):
                    await not_admin.revoke_lease(lease.id, "mine")

            assert c.journal_len() == before
            assert (await sci.get_lease(lease.id)).state is LeaseState.ACTIVE

    run(scenario())
