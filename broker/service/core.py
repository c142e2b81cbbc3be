"""The service core: the lease operations on the ``Runtime`` (the shell around the
engine), on one asyncio event loop, and the parts each call goes through.

The engine is single-threaded: ``Runtime.submit`` is called only from coroutines on the
loop, never from a thread. The core holds the clock (``now()`` never goes back, also
across a restart whose journal ends later than the clock reads), the waiters of blocking
Acquire calls (resolved by the Granted decision the runtime's listener hears at its
commit), the tokens, the per-client limits and the metrics; and these parts, each in its
own module:

* ``opening.py``: the state directory's lock, the runtime resumed, the tokens;
* ``batcher.py``: the commit batches (every entry not yet committed, and who waits);
* ``watch.py``: the Watch streams (snapshot, replay from the journal, publish);
* ``placing.py``: the placements an asynchronous actuator (Slurm) is making;
* ``background.py``: the timer task, the metrics refresh, the WAL checkpoints;
* ``convert.py``: every outbound proto, built from engine values.

One Acquire: the servicer checks the request and calls :meth:`ServiceCore.acquire`; the
runtime catches up, the engine decides, the journal entry is appended and handed to the
batcher; the call awaits ``durable()`` once, the batch commits and the runtime hands the
decision on (backend, listeners: the Watch hub publishes it); the servicer builds the
answer from the Granted decision (``convert.granted_lease_to_proto``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker import codec, policy_apply
from bursar.broker.acquisition import AcquireCall
from bursar.broker.backends.base import PoolBackend
from bursar.broker.clock import SYSTEM, Clock, as_clock
from bursar.broker.clock import wait_for as wait_for_clock
from bursar.broker.config import Config
from bursar.broker.decisions import (
    Granted,
    Metered,
    Rejected,
    Released,
    Renewed,
)
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec
from bursar.broker.errors import ErrorCode, JournalError, RequestError
from bursar.broker.events import (
    CreateCampaign,
    Event,
    LeaseLost,
    Meter,
    Release,
    Renew,
    UpdateCampaign,
)
from bursar.broker.journal import JournalStore
from bursar.broker.outcome import Outcome
from bursar.broker.policy import PolicySpec
from bursar.broker.policy_apply import Applied
from bursar.broker.runtime import Follower, Runtime
from bursar.broker.service import convert
from bursar.broker.service.auth import Principal, Rotations, TokenStore
from bursar.broker.service.background import (
    CHECKPOINT_INTERVAL_S,
    Signal,
    TimerTask,
    checkpoints,
    refreshes,
)
from bursar.broker.service.batcher import CommitBatcher
from bursar.broker.service.errors import (
    PermissionDenied,
    Refused,
    ShuttingDown,
)
from bursar.broker.service.limits import ClientLimits, LimitSettings
from bursar.broker.service.metrics import Metrics
from bursar.broker.service.opening import open_state, push_tokens, version_string
from bursar.broker.service.placing import Placements
from bursar.broker.service.watch import Subscription, WatchHub
from bursar.broker.snapshot import EVERY
from bursar.broker.supply import supply
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = ["ServiceCore", "Subscription"]

log = logging.getLogger(__name__)

MAX_WAIT_S = convert.MAX_WAIT_S
"""Longest a blocking Acquire may wait (AcquireRequest.timeout_s)."""


@dataclass(slots=True)
class _Waiter:
    """The calls waiting for one queued request: the first, and any retries with its key."""

    future: asyncio.Future[Granted]
    queued_at: float
    estimate_s: float
    calls: int = 1


class ServiceCore:
    def __init__(
        self,
        runtime: Runtime,
        tokens: TokenStore,
        *,
        limits: LimitSettings,
        clock: Clock | Callable[[], float],
        state_dir: Path,
        admin_token_path: Path,
        issued_at_start: Sequence[str] = (),
    ) -> None:
        self.runtime = runtime
        self.tokens = tokens
        self._clock = as_clock(clock)
        self.limits = ClientLimits(limits, self._clock)
        self.metrics = Metrics()
        self.state_dir = state_dir
        self.admin_token_path = admin_token_path
        self.issued_at_start = tuple(issued_at_start)
        self.topology: Any = None
        """On a journal shared in PostgreSQL, the brokers on it as this leader's last lock
        check read them (``journal_pg.Topology``, set by the server); None on SQLite."""
        self.version = version_string()
        self._last = runtime.engine.now
        self.started_at = self.now()
        self._waiters: dict[str, _Waiter] = {}
        self.watches = WatchHub(runtime, self.now)
        """The open Watch streams."""
        self.timers = TimerTask(runtime, self._clock)
        self._wake = self.timers.wake
        self._stop = asyncio.Event()
        self.supply_signal = Signal()
        """Set by every commit batch and shutdown: WatchSupply streams send again."""
        self.rotations = Rotations()
        self._closing = False
        self._lock: int | None = None
        self.placements = Placements()
        self.batcher = CommitBatcher(
            runtime, self._clock, on_commit=self._after_commit, on_failure=self._failed
        )
        """Every entry is committed by a batch: the requests that arrive together share one
        commit instead of paying one each."""
        runtime.deferral = self.batcher
        runtime.listen(self._on_decisions)

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(
        cls,
        state_dir: str | Path,
        config: Config | None = None,
        *,
        durability: str = "normal",
        snapshot_every: int = EVERY,
        clock: Clock | Callable[[], float] = SYSTEM,
        admin_token_file: Path | None = None,
        limits: LimitSettings | None = None,
        backend: PoolBackend | None = None,
        store: JournalStore | None = None,
        follower: Follower | None = None,
    ) -> ServiceCore:
        """Open (or create) the broker in ``state_dir`` (see ``opening.open_state``).

        ``store``: the journal when it is not ``state_dir``'s SQLite file (PostgreSQL,
        opened and led by the caller; ``state_dir`` keeps the snapshots and tokens);
        ``follower``: the standby's engine, current with it (see ``server.py``). A new
        state directory starts from ``config`` (default: the packaged demo pool); an
        existing one resumes from its journal, whose pool and policy ``config`` (if given)
        must match."""
        clock = as_clock(clock)
        opened = open_state(
            Path(state_dir),
            config,
            durability=durability,
            snapshot_every=snapshot_every,
            clock=clock,
            admin_token_file=admin_token_file,
            backend=backend,
            store=store,
            follower=follower,
        )
        core = cls(
            opened.runtime,
            opened.tokens,
            limits=limits or LimitSettings(),
            clock=clock,
            state_dir=Path(state_dir),
            admin_token_path=opened.admin_token_path,
            issued_at_start=opened.issued,
        )
        core._lock = opened.lock
        return core

    @property
    def engine(self) -> Engine:
        return self.runtime.engine

    def now(self) -> float:
        """Wall-clock seconds since the epoch, never earlier than any time used before."""
        t = max(self._clock.now(), self.runtime.engine.now, self._last)
        self._last = t
        return t

    # ------------------------------------------------------------------ background tasks

    async def run_timers(self) -> None:
        """Catch up with the engine's timers and the backend's events as they fall due."""
        await self.timers.run(lambda: self._catch_up(self.now()))

    async def run_metrics(self, interval_s: float = 1.0) -> None:
        """Refresh the metrics and the journal's decision index until stopped."""

        def refresh() -> None:
            self.metrics.refresh(self.runtime, self.now(), self.limits.open_streams)

        await refreshes(self.runtime.journal, refresh, self._stop, interval_s)

    async def run_checkpoints(self, interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        """Checkpoint the journal's WAL on a worker thread until stopped."""
        await checkpoints(self.runtime.journal, self._stop, interval_s)

    def begin_shutdown(self) -> None:
        """Stop taking new work: blocking Acquires and streams end with UNAVAILABLE."""
        self._closing = True
        for w in self._waiters.values():
            if not w.future.done():
                w.future.set_exception(ShuttingDown("the queued request"))
        self.watches.close_all(ShuttingDown("the stream"))
        self.placements.cut_off()
        self.supply_signal.notify()

    def stop_background(self) -> None:
        self._stop.set()
        self.batcher.hurry = True
        self.timers.stop()
        self.supply_signal.notify()

    def close(self) -> None:
        """Close the journal (what is left uncommitted is committed first) and the token
        store."""
        b = self.batcher
        if b.commits:
            log.info(
                "%d journal entries in %d commits (%.2f per commit)",
                b.committed,
                b.commits,
                b.committed / b.commits,
            )
        self.metrics.stop_http()
        self.tokens.close()
        self.runtime.close()
        if self._lock is not None:
            os.close(self._lock)  # releases the state directory
            self._lock = None

    @property
    def closing(self) -> bool:
        return self._closing

    # ------------------------------------------------------------------ submitting

    def _submit(self, event: Event) -> Outcome:
        try:
            return self.runtime.submit(event)
        except JournalError as exc:
            self._failed(exc)
            raise

    async def durable(self) -> None:
        """Return once every journal entry appended so far is committed (see
        ``CommitBatcher.durable``)."""
        await self.batcher.durable()

    async def settled(self) -> None:
        """Return with nothing left uncommitted (see ``CommitBatcher.settled``)."""
        await self.batcher.settled()

    def _failed(self, exc: BaseException) -> None:
        # An append the journal refused was rolled back (the engine is as the journal has
        # it): that call fails, the next may work. Only a broker that could not roll back
        # stops the service.
        if not self.runtime.broken:
            return
        if self.timers.fatal is None:
            log.error("journal write failed; the broker stops taking requests: %s", exc)
            self.timers.fail(exc)

    def _on_decisions(self, _event: Event, outcome: Outcome) -> None:
        """The runtime's listener: called after each applied event's journal commit."""
        self.metrics.on_decisions(outcome)
        asynchronous = self.runtime.actuator.asynchronous
        for index, d in enumerate(outcome.decisions):
            if isinstance(d, Granted):
                w = self._waiters.get(d.lease_id)
                if w is not None and not w.future.done():
                    w.future.set_result(d)
            if asynchronous:
                self.placements.heard(d)
            self.watches.publish(d, outcome.seq, index)

    def _after_commit(self, outcomes: list[Outcome]) -> None:
        """Once per commit batch, not per event: count it, wake the timer task if it must,
        tell the supply streams."""
        self.metrics.on_commit(len(outcomes))
        self.timers.moved()
        self.supply_signal.notify()

    async def supply_changed(self, timeout_s: float) -> None:
        """Wait until a decision changes the pool (or ``timeout_s`` passes)."""
        await self.supply_signal.wait(timeout_s)

    # ------------------------------------------------------------------ leases

    def lease_proto(self, lease_id: str) -> pb.Lease:
        """The lease as it is now, live or ended."""
        out = convert.lease_by_id(self.engine, lease_id, self.runtime.backend.allocation)
        if out is None:
            raise RequestError(ErrorCode.NOT_FOUND, "lease_id", f"no lease {lease_id!r}")
        return out

    def _lease_campaign(self, lease_id: str) -> str | None:
        ls = self.engine.leases.get(lease_id)
        if ls is not None and lease_id not in self.engine.elastic.parent_of:
            return ls.campaign
        ended = self.engine.ended.get(lease_id)
        return ended.campaign if ended is not None else None

    def own_lease(self, principal: Principal, lease_id: str) -> str:
        """The campaign of ``lease_id``, if the caller may act on it."""
        convert.check_id(lease_id, "lease_id")
        campaign = self._lease_campaign(lease_id)
        if campaign is None:
            raise RequestError(ErrorCode.NOT_FOUND, "lease_id", f"no lease {lease_id!r}")
        if not principal.may_see(campaign):
            raise PermissionDenied(
                "OTHER_CAMPAIGN", f"lease {lease_id} belongs to another campaign", str(principal)
            )
        return campaign

    def list_leases(self, principal: Principal, campaign: str) -> list[pb.Lease]:
        if campaign and not principal.admin:
            principal.acting_for(campaign)
        only = principal.campaign or campaign or None
        leases = sorted(self.engine.holders_leases(), key=lambda ls: int(ls.id[1:]))
        allocation = self.runtime.backend.allocation
        return [
            convert.live_lease_to_proto(self.engine, ls, allocation(ls.id))
            for ls in leases
            if only is None or ls.campaign == only
        ]

    def list_pending(
        self, principal: Principal, campaign: str, request_id: str, key: str
    ) -> pb.ListPendingResponse:
        """The waiting requests the caller may see, in admission order (ListPending)."""
        convert.check_pending_filters(request_id, key)
        if campaign:
            principal.acting_for(campaign)
            self.require_campaign(campaign)
        only = principal.campaign or campaign or None
        if key and only is None:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                "idempotency_key",
                "a key is a campaign's own: name the campaign (or use its token)",
            )
        now = self.now()
        self._catch_up(now)
        places = convert.pending_places(self.engine, only, request_id, key)
        return convert.pending_to_proto(self.engine, now, places)

    async def acquire(self, args: convert.AcquireArgs) -> tuple[Granted, float]:
        """Request a lease; return the grant and the seconds it waited in the queue, once
        every entry the answer reports is committed (one ``durable`` on each way out; a
        queued request's grant is heard of at its commit).

        With an idempotency key (``args.key``) already used by this campaign, nothing is
        submitted: the call gets the first one's answer (its grant or refusal), or waits
        for the same queued request (see ``broker/acquisition.py``)."""
        if self._closing:
            raise ShuttingDown("the request")
        self._check_elastic(args)
        t0 = time.monotonic()
        campaign, timeout_s = args.campaign, args.timeout_s
        call = AcquireCall(self._submit, lambda: self.runtime.engine, args.event(self.now()))
        first = call.start()
        if isinstance(first, Granted):
            # Answered only once journaled; the listeners, which see the grant's placement
            # begin, hear of it at that commit too.
            await self.durable()
            if not call.replayed:
                self._observe_grant(first, t0)
            await self.placements.until_placed(first.lease_id)
            return first, first.at - call.request.at if not call.replayed else 0.0
        if isinstance(first, Rejected):
            await self.durable()
            raise Refused(
                first.reason, first.retry_after_s, campaign=campaign, request_id=first.request_id
            )
        rid = first.request_id
        waiter = self._waiters.get(rid)
        if waiter is not None:
            waiter.calls += 1  # a keyed retry joins the call already waiting
        else:
            loop = asyncio.get_running_loop()
            waiter = _Waiter(loop.create_future(), first.queued_at, first.estimated_wait_s)
            self._waiters[rid] = waiter
        try:
            # The wait is on the service's clock (a test's manual clock decides when it ends).
            grant = await wait_for_clock(
                self._clock, asyncio.shield(waiter.future), self.now() + timeout_s
            )
        except (TimeoutError, ShuttingDown, asyncio.CancelledError) as exc:
            waiter.calls -= 1
            gone = isinstance(exc, asyncio.CancelledError)
            if waiter.calls > 0 and not isinstance(exc, ShuttingDown):
                grant = None  # another call still waits for this request: leave it queued
            else:
                withdrawn = call.withdraw(self.now())
                if not gone or (not withdrawn and not waiter.future.done()):
                    # The answer waits for the withdrawal's commit; or the request was
                    # granted in a batch not committed yet: the waiter hears of it at
                    # the commit, and the grant is this call's (or given back, below).
                    await self.durable()
                grant = call.live(_result(waiter.future))
            if gone:
                # The caller is gone: a grant that raced with its leaving is given back.
                if grant is not None and waiter.calls <= 0:
                    self._release_quietly(grant.lease_id)
                raise
            if grant is None:
                if isinstance(exc, ShuttingDown):
                    raise
                reason, retry, waited = call.refusal(self.now(), self.engine.policy.min_retry_s)
                raise Refused(
                    reason, retry, campaign=campaign, request_id=rid, waited_s=waited
                ) from None
        finally:
            if waiter.calls <= 0 or waiter.future.done():
                self._waiters.pop(rid, None)
        self._observe_grant(grant, t0)
        await self.placements.until_placed(grant.lease_id)
        return grant, grant.at - waiter.queued_at

    def _release_quietly(self, lease_id: str) -> None:
        with contextlib.suppress(RequestError):  # ended meanwhile
            self._submit(Release(at=self.now(), lease_id=lease_id))

    def _observe_grant(self, grant: Granted, t0: float) -> None:
        self.metrics.observe_grant(grant.path.value, time.monotonic() - t0)

    def renew(self, lease_id: str, duration_s: float) -> Renewed:
        own = self._submit(Renew(at=self.now(), lease_id=lease_id, duration_s=duration_s)).own
        if isinstance(own, Renewed):
            return own
        if isinstance(own, Rejected):
            raise Refused(own.reason, own.retry_after_s, campaign=own.campaign, request_id=lease_id)
        raise self._ended_error(lease_id)

    def release(self, lease_id: str) -> tuple[pb.Lease, bool, float, float]:
        """(final lease, already ended, refunded tokens, refunded credits). Idempotent."""
        now = self.now()
        self._catch_up(now)
        if lease_id in self.engine.ended:
            return self.lease_proto(lease_id), True, 0.0, 0.0
        own = self._submit(Release(at=now, lease_id=lease_id)).own
        if isinstance(own, Released):
            return self.lease_proto(lease_id), False, own.refund_tokens, own.refund_credits
        return self.lease_proto(lease_id), True, 0.0, 0.0

    def revoke(self, lease_id: str, reason: str) -> pb.Lease:
        """An operator ends a live lease at once (Admin.RevokeLease). Checked before
        anything is journaled, so a refused call leaves state and journal as they were."""
        convert.check_id(lease_id, "lease_id")
        reason = convert.revoke_reason(reason)
        now = self.now()
        self._catch_up(now)
        if lease_id not in self.engine.leases:
            if self._lease_campaign(lease_id) is None:
                raise RequestError(ErrorCode.NOT_FOUND, "lease_id", f"no lease {lease_id!r}")
            raise self._ended_error(lease_id)
        # The same event a backend sends when a lease's resources vanish: the engine ends
        # the lease as REVOKED with this cause, refunds it, and the backend unplaces it.
        self._submit(
            LeaseLost(at=now, lease_id=lease_id, cause=f"revoked by an administrator: {reason}")
        )
        return self.lease_proto(lease_id)

    def apply_policy(self, policy: PolicySpec, dry_run: bool) -> Applied:
        """Put ``policy`` in force now (Admin.ApplyPolicy), or with ``dry_run`` only say
        what it would change. Checked by the engine before anything is journaled; the same
        policy again journals nothing."""
        now = self.now()
        self._catch_up(now)
        event, changes = policy_apply.check(self.engine, policy, now)
        if dry_run or not changes:
            return Applied(changes, 0, event.policy if changes else self.engine.policy)
        outcome = self._submit(event)
        return Applied(changes, outcome.seq, self.engine.policy)

    def _catch_up(self, now: float) -> None:
        try:
            self.runtime.catch_up(now)
        except JournalError as exc:
            self._failed(exc)
            raise

    def _ended_error(self, lease_id: str) -> RequestError:
        ended = self.engine.ended.get(lease_id)
        state = ended.state.value if ended is not None else "ended"
        return RequestError(
            ErrorCode.FAILED_PRECONDITION,
            "lease_id",
            f"lease {lease_id} already ended ({state}); request a new lease",
        )

    # ------------------------------------------------------------------ what if

    async def what_if_acquire(self, args: convert.AcquireArgs) -> tuple[Outcome, Engine]:
        """What the engine would decide if this Acquire arrived now (see ``what_if``).
        Its idempotency key is left out: a WhatIf is no retry of an earlier Acquire, and
        reusing a key that one used would be refused."""
        self._check_elastic(args)
        return await self.what_if(dataclasses.replace(args, key="").event)

    def _check_elastic(self, args: convert.AcquireArgs) -> None:
        """An elastic lease grows and shrinks where it is: only a backend that can resize a
        placed lease (the simulated pool) serves one."""
        backend = self.runtime.backend
        if args.intent is not None and not backend.resizes:
            raise RequestError(
                ErrorCode.FAILED_PRECONDITION,
                "intent",
                f"this broker's backend ({type(backend).__name__}) cannot resize a lease where "
                "it is; ask for a fixed size",
            )

    async def what_if_update(self, spec: CampaignSpec) -> tuple[Outcome, Engine]:
        """What the engine would decide if ``spec`` replaced its campaign's now."""
        return await self.what_if(lambda at: _update_event(spec, at))

    async def what_if(self, make: Callable[[float], Event]) -> tuple[Outcome, Engine]:
        """Decide the event ``make(now)`` on a copy of the engine's committed state
        (``Runtime.what_if``): its outcome, and the copy as it would be after it. Backend
        reports not yet delivered are not anticipated (the timer task delivers them)."""
        if self._closing:
            raise ShuttingDown("the request")
        # Committed state only: an entry of an open batch may yet be rolled back. Nothing
        # awaits between here and the copy, so no other call appends meanwhile.
        await self.settled()
        if self.runtime.broken:
            raise JournalError(
                "the broker stopped after a journal write failed; restart it to resume "
                "from the journal"
            )
        return self.runtime.what_if(make(self.now()))

    # ------------------------------------------------------------------ watch

    def watch(
        self,
        principal: Principal,
        campaign: str,
        lease_ids: Iterable[str],
        from_seq: int = 0,
        from_index: int = 0,
    ) -> Subscription:
        """Register a Watch stream and compute what it opens with, atomically: a snapshot of
        the watched leases' state, or (``from_seq`` > 0) every event the journal holds from
        entry ``from_seq``, position ``from_index`` on. Events decided after this call are
        pushed to the subscription, so nothing falls between the two."""
        if self._closing:
            raise ShuttingDown("the stream")
        if campaign and not principal.admin:
            principal.acting_for(campaign)
        scope = principal.campaign or campaign or None
        ids = list(dict.fromkeys(lease_ids))
        for lid in ids:
            owner = self.own_lease(principal, lid)
            if scope is not None and owner != scope:
                raise PermissionDenied(
                    "OTHER_CAMPAIGN", f"lease {lid} is not campaign {scope}'s", str(principal)
                )
        return self.watches.open(scope, ids, principal.campaign, from_seq, from_index)

    def unwatch(self, sub: Subscription) -> None:
        self.watches.unwatch(sub)

    # ------------------------------------------------------------------ supply, meter

    def supply_proto(self, principal: Principal, units: float, dim: str) -> pb.Supply:
        now = self.now()
        self._catch_up(now)
        visible = None if principal.admin else {principal.campaign or ""}
        return convert.supply_to_proto(supply(self.engine), self.engine, now, visible, units, dim)

    def meter(self, campaign: str, dim: str, amount: float) -> Metered:
        if self._closing:
            raise ShuttingDown("the request")
        own = self._submit(Meter(at=self.now(), campaign=campaign, dim=dim, amount=amount)).own
        assert isinstance(own, Metered), own
        return own

    # ------------------------------------------------------------------ journal, status

    def list_decisions(
        self,
        principal: Principal,
        *,
        start_seq: int,
        campaign: str,
        kinds: set[str],
        lease_id: str,
        since: float,
        limit: int,
    ) -> tuple[list[tuple[int, int, dict[str, Any]]], int]:
        """A page of journal decisions matching the filters (from the journal's decision
        index), and the seq the next page starts at (0: no more)."""
        if not principal.admin:
            campaign = principal.acting_for(campaign)
        return self.runtime.journal.find_decisions(
            start_seq=start_seq,
            campaign=campaign,
            kinds=kinds,
            ref=lease_id,
            since=since,
            limit=limit,
        )

    # ------------------------------------------------------------------ admin

    def create_campaign(self, spec: CampaignSpec) -> str:
        # As a replay will decode it (see Runtime.open).
        spec = codec.campaign_from_dict(codec.plain(spec))
        self._submit(CreateCampaign(at=self.now(), spec=spec))
        token = self.tokens.issue(spec.name, self.now())
        self._share_tokens()
        return token

    def update_campaign(self, spec: CampaignSpec) -> None:
        self._submit(_update_event(spec, self.now()))

    def require_campaign(self, name: str) -> None:
        if name not in self.engine.campaigns:
            known = ", ".join(sorted(self.engine.campaigns)[:10]) or "none yet"
            raise RequestError(
                ErrorCode.NOT_FOUND, "campaign", f"unknown campaign {name!r} (known: {known})"
            )

    def rotate_token(self, name: str) -> tuple[str, float]:
        self.require_campaign(name)
        now = self.now()
        token = self.tokens.rotate(name, now)
        self._share_tokens()
        # The old token stops working at once, streams it opened included.
        self.watches.end_holder(name, self.rotations.rotated(name))
        self.supply_signal.notify()
        return token, now

    def _share_tokens(self) -> None:
        """On a shared (PostgreSQL) journal: the tokens issued here, for the standbys."""
        journal = self.runtime.journal
        if hasattr(journal, "share_tokens"):
            push_tokens(self.state_dir, journal)

    def token_generation(self, campaign: str | None) -> int:
        """How many times ``campaign``'s token was rotated while serving (0 for the admin):
        a stream compares it with the value it opened with."""
        return self.rotations.generation(campaign)

    def check_token_generation(self, campaign: str | None, opened_with: int) -> None:
        """Raise UNAUTHENTICATED if ``campaign``'s token was rotated since ``opened_with``."""
        self.rotations.check(campaign, opened_with)


def _update_event(spec: CampaignSpec, at: float) -> UpdateCampaign:
    # The spec as a replay will decode it (see Runtime.open): the engine that decides it
    # now and one replaying the journal see the same spec, down to its keys' order.
    return UpdateCampaign(at=at, spec=codec.campaign_from_dict(codec.plain(spec)))


def _result(fut: asyncio.Future[Granted]) -> Granted | None:
    """The future's grant, if it has one."""
    if fut.done() and not fut.cancelled() and fut.exception() is None:
        return fut.result()
    return None
