"""Broker.WhatIf over real gRPC: it decides on a copy of the committed state, so nothing
changes and nothing is journaled; its answer is what the real call then decides; it
refuses what Acquire and Admin.UpdateCampaign refuse, the same way."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import gc
import json
import types
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from service_support import START, Client, fails, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.broker.service.convert import AcquireArgs
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

KIND = pb.DecisionKind


def _state(c: Client) -> tuple[Any, ...]:
    """What no WhatIf may change: the engine's state, the journal's bytes and length."""
    journal = c.core.runtime.journal
    return c.core.engine.state_digest(), journal.sha256(), journal.last_seq


async def _leases(c: Client) -> list[bytes]:
    got = await c.broker.ListLeases(pb.ListLeasesRequest(), metadata=c.as_("admin"))
    return [x.SerializeToString(deterministic=True) for x in got.leases]


def _ask(campaign: str = "", gpus: float = 8, duration_s: float = 30.0, **kw: Any) -> Any:
    return pb.WhatIfRequest(
        acquire=pb.AcquireRequest(
            campaign=campaign, size={"gpu": gpus}, duration_s=duration_s, **kw
        )
    )


def _envelope(name: str, burst: float, lease_class: int = pb.LEASE_CLASS_BATCH) -> Any:
    spec = pb.CampaignSpec(name=name, lease_class=lease_class)
    spec.envelopes["gpu"].CopyFrom(pb.DimEnvelope(sustained=8, burst=burst, bucket=100000))
    return spec


async def _queue_behind_burst(c: Client) -> tuple[asyncio.Task[Any], str]:
    """sci, its burst lowered to 16, holds 8 warm GPUs and waits (blocking) for 16 more."""
    lower = admin_pb2.UpdateCampaignRequest(spec=_envelope("sci", 16))
    await c.admin.UpdateCampaign(lower, metadata=c.as_("admin"))
    await c.acquire("sci", 8)
    waiting = asyncio.create_task(c.acquire("sci", 16, timeout_s=600))
    await until(lambda: len(c.core.engine.pending) == 1)
    return waiting, next(iter(c.core.engine.pending))


def _last_entry(c: Client) -> list[dict[str, Any]]:
    journal = c.core.runtime.journal
    [(_, decisions)] = journal.decisions_from(journal.last_seq, 1)
    return decisions


def test_whatif_changes_nothing_whatever_it_would_decide(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            await c.acquire("backfill", 8)
            waiting, queued = await _queue_behind_burst(c)
            before, leases = _state(c), await _leases(c)
            pending = dict(c.core.engine.pending)

            grant = await c.broker.WhatIf(_ask(gpus=8), metadata=c.as_("other"))
            assert grant.outcome == KIND.DECISION_KIND_GRANT and grant.lease.lease_id
            queue = await c.broker.WhatIf(_ask(gpus=24, timeout_s=60), metadata=c.as_("other"))
            assert queue.outcome == KIND.DECISION_KIND_QUEUE
            assert queue.reason == pb.REASON_POOL_FULL and not queue.HasField("lease")
            reject = await c.broker.WhatIf(_ask(gpus=24), metadata=c.as_("other"))
            assert reject.outcome == KIND.DECISION_KIND_REJECT
            assert reject.reason == pb.REASON_POOL_FULL and reject.estimated_wait_s > 0
            # Raising sci's burst would let its queued request in, reclaiming backfill's GPUs.
            env = await c.broker.WhatIf(
                pb.WhatIfRequest(envelope=_envelope("sci", 32)), metadata=c.as_("admin")
            )
            assert env.outcome == KIND.DECISION_KIND_CAMPAIGN
            kinds = [x.kind for x in env.decisions]
            assert kinds[0] == KIND.DECISION_KIND_CAMPAIGN
            assert KIND.DECISION_KIND_GRANT in kinds
            assert KIND.DECISION_KIND_PREEMPT_WARNING in kinds
            assert {x.lease_id for x in env.decisions if x.kind == KIND.DECISION_KIND_GRANT} == {
                queued
            }
            assert all(x.seq == 0 for x in [*grant.decisions, *env.decisions])

            assert _state(c) == before
            assert await _leases(c) == leases
            assert dict(c.core.engine.pending) == pending and not waiting.done()

            # The real change then decides just what the WhatIf listed.
            update = admin_pb2.UpdateCampaignRequest(spec=_envelope("sci", 32))
            await c.admin.UpdateCampaign(update, metadata=c.as_("admin"))
            assert _last_entry(c) == [json.loads(x.json) for x in env.decisions]
            granted = await waiting
            assert granted.lease.lease_id == queued

    run(scenario())


@pytest.mark.parametrize(
    ("held", "gpus", "timeout_s", "outcome"),
    [
        (0, 8, 0.0, KIND.DECISION_KIND_GRANT),  # warm
        (16, 8, 0.0, KIND.DECISION_KIND_GRANT),  # cold: every warm GPU is held
        (24, 8, 0.0, KIND.DECISION_KIND_REJECT),  # the pool is full
        (24, 8, 60.0, KIND.DECISION_KIND_QUEUE),
    ],
    ids=["warm", "cold", "reject", "queue"],
)
def test_whatif_answers_what_the_real_acquire_then_decides(
    tmp_path: Path, held: float, gpus: float, timeout_s: float, outcome: int
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            if held:
                await c.acquire("other", held)
            asked = _ask("sci", gpus, 45, timeout_s=timeout_s, labels={"job": "a"})
            # The admin sees every decision, a booting node's included.
            what = await c.broker.WhatIf(asked, metadata=c.as_("admin"))
            assert what.outcome == outcome
            entries = c.journal_len()
            if outcome == KIND.DECISION_KIND_GRANT:
                got = await c.acquire("sci", gpus, duration_s=45, labels={"job": "a"})
                assert what.lease == got.lease  # path, size, nodes, times, state: all of it
            elif outcome == KIND.DECISION_KIND_REJECT:
                refused = await fails(c.acquire("sci", gpus, duration_s=45, labels={"job": "a"}))
                assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert refused.reason == pb.ReasonCode.Name(what.reason).removeprefix("REASON_")
                assert refused.retry_after_s == pytest.approx(what.estimated_wait_s, abs=1e-3)
            else:
                waiting = asyncio.create_task(
                    c.acquire("sci", gpus, duration_s=45, timeout_s=60, labels={"job": "a"})
                )
                await until(lambda: c.journal_len() > entries)
                waiting.cancel()
            # The request's journal entry holds exactly the decisions WhatIf listed.
            assert c.journal_len() == entries + 1
            journal = c.core.runtime.journal
            [(_, real)] = journal.decisions_from(entries + 1, 1)
            assert [json.loads(x.json) for x in what.decisions] == real

    run(scenario())


def test_whatif_catches_up_timers_on_its_copy_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path, clock=clock) as c:
            await c.acquire("other", 16, duration_s=10)  # every warm GPU, for 10 s
            core = c.core
            # Past the lease's end, before the timer task has run (nothing awaited yet):
            # the live engine still holds it, the copy ends it first, and then has the 16
            # warm GPUs (the cold node alone has 8).
            clock.set(START + 10.5)
            before = _state(c)
            args = AcquireArgs("sci", {"gpu": 16}, 30.0, 0.0, None, {})
            outcome, copy = await core.what_if_acquire(args)
            assert type(outcome.own).__name__ == "Granted"
            assert _state(c) == before and len(core.engine.leases) == 1
            assert copy.now == START + 10.5 and list(copy.leases) == ["L2"]  # the new one
            got, _ = await core.acquire(args)
            assert got == outcome.own

    run(scenario())


def test_a_campaign_token_sees_its_own_decisions_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            await c.acquire("backfill", 16)  # every warm GPU, preemptible
            mine = await c.broker.WhatIf(_ask(gpus=16), metadata=c.as_("sci"))
            every = await c.broker.WhatIf(_ask("sci", gpus=16), metadata=c.as_("admin"))
            assert mine.outcome == every.outcome == KIND.DECISION_KIND_GRANT
            assert mine.lease == every.lease
            assert {x.campaign for x in every.decisions} >= {"sci", "backfill"}
            assert {x.campaign for x in mine.decisions} == {"sci"}
            assert [x for x in every.decisions if x.campaign == "sci"] == list(mine.decisions)

    run(scenario())


def test_whatif_refuses_as_acquire_and_update_campaign_do(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            before = _state(c)
            # A campaign token acting for another campaign: as Acquire.
            other = await fails(c.broker.WhatIf(_ask("other"), metadata=c.as_("sci")))
            real = await fails(c.acquire("sci", 8, campaign="other"))
            assert other == real and other.code == grpc.StatusCode.PERMISSION_DENIED
            # The admin naming no campaign: as Acquire.
            nobody = await fails(c.broker.WhatIf(_ask(), metadata=c.as_("admin")))
            assert nobody == await fails(c.acquire("admin", 8))
            # An envelope is the admin's: as Admin.UpdateCampaign refuses a campaign token.
            env = pb.WhatIfRequest(envelope=_envelope("sci", 32))
            denied = await fails(c.broker.WhatIf(env, metadata=c.as_("sci")))
            assert denied.code == grpc.StatusCode.PERMISSION_DENIED
            assert denied.reason == "ADMIN_ONLY" and "WhatIf" in denied.message
            update = admin_pb2.UpdateCampaignRequest(spec=_envelope("sci", 32))
            real = await fails(c.admin.UpdateCampaign(update, metadata=c.as_("sci")))
            assert (real.code, real.reason) == (denied.code, denied.reason)
            # An unknown campaign, or a bad spec: as UpdateCampaign.
            for spec in (_envelope("nope", 32), _envelope("sci", -1), _envelope("", 8)):
                what = await fails(
                    c.broker.WhatIf(pb.WhatIfRequest(envelope=spec), metadata=c.as_("admin"))
                )
                real = await fails(
                    c.admin.UpdateCampaign(
                        admin_pb2.UpdateCampaignRequest(spec=spec), metadata=c.as_("admin")
                    )
                )
                assert what == real
            assert what.code == grpc.StatusCode.INVALID_ARGUMENT
            missing = await fails(c.broker.WhatIf(pb.WhatIfRequest(), metadata=c.as_("admin")))
            assert missing.code == grpc.StatusCode.INVALID_ARGUMENT
            assert missing.field_violations == [("change", "required: an acquire or an envelope")]
            assert _state(c) == before

    run(scenario())


def test_whatif_of_an_unknown_campaign_is_not_found_as_in_update_campaign(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            env = pb.WhatIfRequest(envelope=_envelope("nope", 32))
            what = await fails(c.broker.WhatIf(env, metadata=c.as_("admin")))
            assert what.code == grpc.StatusCode.NOT_FOUND and "nope" in what.message

    run(scenario())


BAD_ACQUIRES: list[dict[str, Any]] = [
    {"size": {}},
    {"size": {"gpu": -1}},
    {"size": {"tpu": 1}},
    {"size": {"inference": 1}},
    {"size": {"gpu": 25}},  # above the burst ceiling
    {"size": {"gpu": 8}, "duration_s": 0},
    {"size": {"gpu": 8}, "duration_s": 7200},  # past the pool's longest lease
    {"size": {"gpu": 8}, "timeout_s": 1e9},
    {"size": {"gpu": 8}, "timeout_s": float("nan")},
    {"size": {"gpu": 8}, "lease_class": 9},
    {"size": {"gpu": 8}, "lease_class": pb.LEASE_CLASS_INTERACTIVE},  # above the campaign's
    {"size": {"gpu": 8}, "labels": {f"k{i}": "v" for i in range(17)}},
    {"size": {"gpu": 8}, "shape": pb.Shape(nodes=9)},
    {"size": {"gpu": 8}, "shape": pb.Shape(cpus_per_gpu=-1)},
    {"size": {"gpu": 8}, "campaign": "nope"},
]


@pytest.mark.parametrize("fields", BAD_ACQUIRES, ids=lambda f: ",".join(f"{k}" for k in f))
def test_bad_input_is_refused_as_acquire_refuses_it(tmp_path: Path, fields: Any) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            who = "admin" if "campaign" in fields else "sci"
            req = pb.AcquireRequest(**{"duration_s": 30.0, **fields})
            before = _state(c)
            what = await fails(c.broker.WhatIf(pb.WhatIfRequest(acquire=req), metadata=c.as_(who)))
            real = await fails(c.broker.Acquire(req, metadata=c.as_(who)))
            assert what == real
            assert what.code != grpc.StatusCode.RESOURCE_EXHAUSTED
            assert _state(c) == before

    run(scenario())


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["sci", "other", "backfill"]),
            st.sampled_from([1, 4, 8, 12, 16]),
            st.sampled_from([5.0, 30.0, 300.0]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_each_answer_is_the_next_real_decision(tmp_path: Path, asks: list[Any]) -> None:
    """Whatever the state, a WhatIf's answer is what the same Acquire then decides, and
    only the real call changes anything."""

    async def scenario() -> None:
        clock = ManualClock(START)
        async with serve(tmp_path / str(len(list(tmp_path.iterdir()))), clock=clock) as c:
            for step, (who, gpus, duration) in enumerate(asks):
                clock.set(START + 2.0 * step)
                # A call that catches the live engine up (leases expire as the clock
                # moves), so that the timer task has nothing left to journal meanwhile.
                await c.broker.GetSupply(pb.SupplyRequest(), metadata=c.as_("admin"))
                before = _state(c)
                what = await c.broker.WhatIf(
                    _ask(gpus=gpus, duration_s=duration), metadata=c.as_(who)
                )
                assert _state(c) == before
                entries = c.journal_len()
                try:
                    got = await c.acquire(who, gpus, duration_s=duration)
                except grpc.aio.AioRpcError as err:
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert what.outcome == KIND.DECISION_KIND_REJECT
                else:
                    assert what.outcome == KIND.DECISION_KIND_GRANT and what.lease == got.lease
                real = _last_entry(c)
                mine = [d for d in real if d.get("campaign") == who]
                assert [json.loads(x.json) for x in what.decisions] == mine
                assert c.journal_len() == entries + 1

    run(scenario())


_CONSTANT = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset, range)


def _mutable_reachable(root: object) -> dict[int, object]:
    """Every object reachable from ``root`` that could be changed in place: containers
    and instances, but not constants, enum members, classes, functions or modules (shared
    by design: a copy refers to the same ones). Frozen dataclasses are walked into, and
    not counted themselves."""
    out: dict[int, object] = {}
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type | types.ModuleType | types.FunctionType | enum.Enum):
            continue
        if isinstance(obj, types.BuiltinFunctionType | types.MethodWrapperType):
            continue
        frozen = dataclasses.is_dataclass(obj) and type(obj).__dataclass_params__.frozen
        if not isinstance(obj, _CONSTANT) and not frozen:
            out[id(obj)] = obj
        stack.extend(gc.get_referents(obj))
    return out


def test_the_copy_shares_no_mutable_state_with_the_live_engine(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            await c.acquire("backfill", 8)
            waiting, _ = await _queue_behind_burst(c)
            for i in range(3):
                lease = await c.acquire("other", 1, duration_s=5 + i)
                await c.broker.Release(
                    pb.ReleaseRequest(lease_id=lease.lease.lease_id), metadata=c.as_("other")
                )
            args = AcquireArgs("other", {"gpu": 4}, 30.0, 0.0, None, {})
            _, copy = await c.core.what_if_acquire(args)
            live = _mutable_reachable(c.core.engine)
            mine = _mutable_reachable(copy)
            assert len(live) > 100 and len(mine) > 100  # the walk sees the state
            shared = [type(live[i]).__name__ for i in live.keys() & mine.keys()]
            assert shared == []
            waiting.cancel()

    run(scenario())


def test_an_idempotency_key_is_not_used(tmp_path: Path) -> None:
    """A WhatIf is no retry: the key of an earlier Acquire neither replays its answer nor
    counts as reused for another request."""

    async def scenario() -> None:
        async with serve(tmp_path, clock=ManualClock(START)) as c:
            first = await c.acquire("sci", 8, idempotency_key="job-1")
            again = _ask(gpus=4, idempotency_key="job-1")
            what = await c.broker.WhatIf(again, metadata=c.as_("sci"))
            assert what.outcome == KIND.DECISION_KIND_GRANT
            assert what.lease.lease_id != first.lease.lease_id
            assert dict(what.lease.size) == {"gpu": 4.0}
            # The real call with that key is refused as a key reused for another request.
            refused = await fails(c.acquire("sci", 4, idempotency_key="job-1"))
            assert refused.code == grpc.StatusCode.INVALID_ARGUMENT

    run(scenario())
