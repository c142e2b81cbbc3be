"""Retries that back off: a refused renewal is retried with decorrelated jitter between a
floor and a ceiling, never sooner than the broker's retry_after, and says so in a line
when the refusals start and one when they end, against a real broker on a manual clock."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from service_support import START, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.providers.client import (
    AsyncAdminClient,
    AsyncBrokerClient,
    Backoff,
    CampaignSpec,
    DimEnvelope,
    LeaseState,
)
from bursar.providers.client._backoff import Pace


@given(
    floor=st.floats(0.01, 10),
    spread=st.floats(1, 20),
    seed=st.integers(0, 2**32),
)
def test_pace_stays_between_its_floor_and_ceiling(floor: float, spread: float, seed: int) -> None:
    pace = Pace(floor, floor * spread)
    delays = pace.delays(random.Random(seed))
    drawn = [next(delays) for _ in range(50)]
    assert all(floor <= d <= floor * spread for d in drawn)


def test_pace_grows_from_its_floor_and_is_reproducible() -> None:
    pace = Pace(1.0, 30.0)
    a = pace.delays(random.Random(7))
    b = pace.delays(random.Random(7))
    first = [next(a) for _ in range(12)]
    assert first == [next(b) for _ in range(12)]
    # Decorrelated jitter: each delay within [floor, 3x the previous one].
    assert 1.0 <= first[0] <= 3.0
    assert all(1.0 <= b <= 3.0 * a for a, b in itertools.pairwise(first))
    with pytest.raises(ValueError):
        Pace(2.0, 1.0)


def _said(caplog: pytest.LogCaptureFixture, lease_id: str, level: int = logging.INFO) -> list[str]:
    """What the client logged about ``lease_id`` at ``level`` or above."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "bursar.providers.client"
        and r.levelno >= level
        and r.getMessage().startswith(f"lease {lease_id}:")
    ]


def _gave_up(caplog: pytest.LogCaptureFixture, lease_id: str) -> bool:
    return any("gave up" in m for m in _said(caplog, lease_id))


def test_a_refused_renewal_backs_off_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease whose campaign's burst was lowered below what it holds is refused every
    renewal (ABOVE_BURST, retry after the policy's 0.5 s minimum). Its holder, renewing 60 s
    before the expiry, tries at most 8 times in that last minute (the pace's floor is an
    eighth of the 60 s margin, 7.5 s), never sooner than the broker's retry_after, and
    logs two lines: the refusal, with when it is retried until, and giving up."""
    caplog.set_level(logging.DEBUG, logger="bursar.providers.client")

    async def scenario() -> None:
        # The broker's clock and the client's move together, but apart: what the client
        # sleeps for is on its own clock alone.
        clock, own = ManualClock(START), ManualClock(START)
        async with (
            serve(tmp_path, clock=clock) as c,
            AsyncBrokerClient(c.address, c.tokens["sci"], clock=own, rng=3) as sci,
            AsyncAdminClient(c.address, c.admin_token) as admin,
        ):
            async with sci.held_lease({"gpu": 16}, 600.0) as h:
                assert h.renew_margin_s == 60.0
                await admin.update_campaign(
                    CampaignSpec("sci", {"gpu": DimEnvelope(0, 8, 8, 100000)}, "batch")  # type: ignore[arg-type]
                )
                # Each time the holder sleeps, move both clocks to its wake-up: each wake
                # is one try, and each try one log record (most at DEBUG).
                while True:
                    await until(lambda: bool(own.deadlines()) or _gave_up(caplog, h.id), 10)
                    if not own.deadlines():
                        break
                    t = own.deadlines()[0]
                    assert t < START + 600.0, "a try planned past the expiry"
                    seen = len(_said(caplog, h.id, logging.DEBUG))
                    clock.set(t)
                    own.set(t)
                    await until(lambda seen=seen: len(_said(caplog, h.id, logging.DEBUG)) > seen)
                clock.set(START + 600.0)
                await until(h.ended.is_set)
                assert h.lease.state is LeaseState.EXPIRED and h.renewals == 0
            refused = await c.broker.ListDecisions(
                pb.ListDecisionsRequest(lease_id=h.id, kinds=[pb.DECISION_KIND_REJECT], limit=1000),
                metadata=c.as_("admin"),
            )
            at = [d.at for d in refused.decisions]
            assert 2 <= len(at) <= 8, at
            assert all(START + 540.0 <= t < START + 600.0 for t in at)
            gaps = [b - a for a, b in itertools.pairwise(at)]
            assert all(g >= 7.5 for g in gaps), gaps  # the floor, above the 0.5 s retry_after
            lines = _said(caplog, h.id)
            assert len(lines) == 2, lines
            assert (
                "renewal refused (ABOVE_BURST" in lines[0]
                and "retrying every ~7.5-30 s" in lines[0]
            )
            assert lines[1].startswith(
                f"lease {h.id}: gave up renewing after {len(at)} refused tries"
            )

    run(scenario(), timeout_s=60)


def test_a_renewal_refused_until_past_the_expiry_gives_up_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """BUCKET_EMPTY with a retry_after as long as the lease has left: the broker says no
    renewal can come before the expiry, so the holder does not try again before it."""
    caplog.set_level(logging.INFO, logger="bursar.providers.client")

    async def scenario() -> None:
        clock = ManualClock(START)
        async with (
            serve(tmp_path, clock=clock) as c,
            AsyncBrokerClient(c.address, c.tokens["sci"], clock=clock, rng=3) as sci,
            AsyncAdminClient(c.address, c.admin_token) as admin,
        ):
            await admin.update_campaign(
                CampaignSpec("sci", {"gpu": DimEnvelope(0, 8, 24, 5000)}, "batch")  # type: ignore[arg-type]
            )
            async with sci.held_lease({"gpu": 16}, 600.0) as h:
                await until(lambda: START + 540.0 in clock.deadlines())
                clock.set(START + 540.0)
                await until(lambda: len(_said(caplog, h.id)) == 1)
                (line,) = _said(caplog, h.id)
                assert "gave up renewing after 1 refused tries (BUCKET_EMPTY)" in line
                # Nothing sleeps before the expiry any more (the broker's own timer is it).
                assert min(clock.deadlines()) >= START + 600.0

    run(scenario())


def test_unreachable_broker_retries_log_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="bursar.providers.client")

    async def scenario() -> None:
        clock = ManualClock(START)
        client = AsyncBrokerClient(
            "127.0.0.1:1",
            None,
            clock=clock,
            rng=1,
            backoff=Backoff(initial_s=0.05, max_s=0.2),
            retry_timeout_s=2.0,
        )
        call = asyncio.ensure_future(client.status())
        while not call.done():
            await until(lambda: call.done() or bool(clock.deadlines()), 10)
            if clock.deadlines():
                clock.set(min(clock.deadlines()))
        with pytest.raises(Exception, match=r"(?i)unavailable|connect"):
            call.result()
        await client.close()

    run(scenario())
    info = [
        r for r in caplog.records if r.levelno >= logging.INFO and "GetStatus" in r.getMessage()
    ]
    tries = [r for r in caplog.records if "GetStatus" in r.getMessage()]
    assert len(info) == 1 and len(tries) > 5, [r.getMessage() for r in tries]
