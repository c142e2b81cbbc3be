"""The service core: the ``Runtime`` (the shell around the engine) on the event loop, and
what calls wait for.

Everything here runs on one asyncio event loop: the engine is single-threaded, and
``Runtime.submit`` (engine, then journal commit, then backend) is called only from
coroutines on that loop, never from a thread. The core owns

* the clock (a ``bursar.broker.clock.Clock``, the wall clock unless a test gives a
  manual one): ``now()`` is ``max(clock.now(), engine.now)``, so time never goes back,
  also across a restart whose journal ends later than the clock reads;
* a background timer task that sleeps until the engine's next timer (expiry, revocation,
  wake-up) or the backend's next event (a node ready) and then catches up;
* the waiters of blocking Acquire calls (a future per queued request, resolved by the
  Granted decision the runtime's listener sees);
* the Watch subscriptions (lease events) and the supply-change signal for WatchSupply;
* the tokens, the per-client limits and the metrics;
* for a slow backend (Slurm), the leases whose placement is under way: the actuator makes
  their allocations on worker threads, off the event loop, so other calls go on meanwhile.
  The Acquire that got such a lease answers, and its Watch event (GRANTED or ACTIVATED) is
  sent, once the allocation is ready, so that both carry it; a failed allocation ends the
  lease (LeaseLost) and the answer is the revoked lease.

Its methods take and return engine values (events, decisions, leases) or proto
messages where a stream needs them; translating requests is the servicer's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from bursar.broker import codec, policy_apply, safe_pickle, snapshot, validation
from bursar.broker.acquisition import AcquireCall
from bursar.broker.actuator import actuator_for
from bursar.broker.backends.base import PoolBackend, placed_by
from bursar.broker.clock import SYSTEM, Clock, as_clock, wait_event_until
from bursar.broker.clock import wait_for as wait_for_clock
from bursar.broker.config import Config, default_config
from bursar.broker.decisions import (
    Allocated,
    Expired,
    Granted,
    Metered,
    Rejected,
    Released,
    Renewed,
    Revoked,
)
from bursar.broker.engine import Engine
from bursar.broker.envelope import CampaignSpec
from bursar.broker.errors import DISTRIBUTION, ErrorCode, JournalError, RequestError
from bursar.broker.events import (
    CancelRequest,
    CreateCampaign,
    Event,
    LeaseLost,
    Meter,
    Release,
    Renew,
    UpdateCampaign,
)
from bursar.broker.journal import JOURNAL_FILENAME, Journal, JournalStore
from bursar.broker.outcome import Outcome
from bursar.broker.policy import PolicySpec
from bursar.broker.policy_apply import Applied
from bursar.broker.runtime import Follower, Runtime
from bursar.broker.service import convert
from bursar.broker.service.auth import TOKENS_DB, Principal, TokenStore, load_admin_token
from bursar.broker.service.batcher import CommitBatcher
from bursar.broker.service.errors import (
    PermissionDenied,
    Refused,
    ShuttingDown,
    Unauthenticated,
)
from bursar.broker.service.limits import ClientLimits, LimitSettings
from bursar.broker.service.metrics import Metrics
from bursar.broker.service.watch import Subscription, WatchHub
from bursar.broker.snapshot import EVERY
from bursar.broker.state_lock import LOCK_FILE, try_lock
from bursar.broker.supply import supply
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = ["ServiceCore", "Subscription"]

log = logging.getLogger(__name__)

MAX_WAIT_S = convert.MAX_WAIT_S
"""Longest a blocking Acquire may wait (AcquireRequest.timeout_s)."""

INDEX_SLICE = 200
"""Journal entries the background task adds to the decision index at a time (about 0.7 ms)."""

CHECKPOINT_INTERVAL_S = 1.0
"""How often the journal's WAL is checkpointed, on a worker thread (see ``run_checkpoints``)."""

MAX_REVOKE_REASON = 200
"""Longest reason Admin.RevokeLease accepts (it is journaled and sent to the holder)."""


def _version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


@dataclass(slots=True)
class _Waiter:
    """The calls waiting for one queued request: the first, and any retries with its key."""

    future: asyncio.Future[Granted]
    queued_at: float
    estimate_s: float
    calls: int = 1


@dataclass(slots=True)
class _Placing:
    """A lease whose placement an asynchronous actuator is making, and what waits for it."""

    done: asyncio.Future[None]
    """Resolved by the lease's Allocated decision (or its end)."""

    def cut_off(self) -> None:
        """End the wait with UNAVAILABLE (a shutdown): the client retries, with its key,
        against the restarted server, which re-adopts the job."""
        if not self.done.done():
            self.done.set_exception(ShuttingDown("the wait for the allocation"))
            self.done.add_done_callback(lambda f: f.exception())


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
        self.version = _version()
        self._last = runtime.engine.now
        self.started_at = self.now()
        self._waiters: dict[str, _Waiter] = {}
        self.watches = WatchHub(runtime, self.now)
        """The open Watch streams."""
        self._wake = asyncio.Event()
        self._sleeping_until = -math.inf
        """When the timer task wakes unless woken earlier; -inf while it is not asleep."""
        self._sleeping_for: float | None = None
        """The timer it sleeps for (None: it sleeps for the one-minute cap)."""
        self._stop = asyncio.Event()
        self._supply_changed = asyncio.Event()
        self._supply_waiters = 0
        self._token_gen: dict[str, int] = {}
        """Token rotations per campaign while serving (see ``token_generation``)."""
        self._closing = False
        self._fatal: BaseException | None = None
        self._lock: int | None = None
        self._placing: dict[str, _Placing] = {}
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
        """Open (or create) the broker in ``state_dir``.

        ``store``: the journal when it is not ``state_dir``'s SQLite file (PostgreSQL,
        opened and led by the caller; ``state_dir`` keeps the snapshots and tokens);
        ``follower``: the standby's engine, current with it (see ``server.py``).

        A new state directory starts from ``config`` (default: the packaged demo pool)
        and creates its campaigns. An existing one resumes from its journal; ``config``
        may then be omitted (the journal holds the pool and policy it was written with),
        and if given, its pool and policy must match the journal's.
        """
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        lock = _lock_state_dir(state)
        try:
            return cls._open_locked(
                state,
                lock,
                config,
                durability,
                as_clock(clock),
                admin_token_file,
                limits,
                backend,
                snapshot_every,
                store,
                follower,
            )
        except BaseException:
            os.close(lock)
            raise

    @classmethod
    def _open_locked(
        cls,
        state: Path,
        lock: int,
        config: Config | None,
        durability: str,
        clock: Clock,
        admin_token_file: Path | None,
        limits: LimitSettings | None,
        backend: PoolBackend | None = None,
        snapshot_every: int = EVERY,
        store: JournalStore | None = None,
        follower: Follower | None = None,
    ) -> ServiceCore:
        journal_path = state / JOURNAL_FILENAME
        resumed = journal_path.exists() if store is None else store.last_seq > 0
        if config is None:
            if store is not None and resumed:
                config = Config(pool=store.pool, policy=store.current_policy)
            elif resumed:
                with Journal.open(journal_path) as j:
                    config = Config(pool=j.pool, policy=j.current_policy)
            else:
                config = default_config()
        # A slow backend (Slurm) is driven from worker threads, never from the event loop.
        broker = Runtime.open(
            state,
            config,
            backend,
            at=clock.now(),
            durability=durability,
            snapshot_every=snapshot_every,
            actuator=lambda pool: actuator_for(pool, clock),
            journal=store,
            engine=follower,
        )
        broker.coalesce_ticks = True
        try:
            if resumed:
                _withdraw_orphans(broker)
                # The downtime, before serving: the leases that ended meanwhile are ended
                # by the time anyone can ask.
                broker.catch_up(clock.now())
            admin_token, admin_path, _ = load_admin_token(state, admin_token_file)
            if hasattr(store, "share_tokens"):
                _pull_tokens(state, store)
            tokens = TokenStore(state, admin_token)
            issued = tokens.issue_missing(sorted(broker.engine.campaigns), clock.now())
            if hasattr(store, "share_tokens"):
                _push_tokens(state, store)
        except BaseException:
            broker.close()
            raise
        core = cls(
            broker,
            tokens,
            limits=limits or LimitSettings(),
            clock=clock,
            state_dir=state,
            admin_token_path=admin_path,
            issued_at_start=sorted(issued),
        )
        core._lock = lock
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
        loop = asyncio.get_running_loop()

        def reported() -> None:  # from an actuator thread: a report is waiting
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to wake
                loop.call_soon_threadsafe(self._wake.set)

        self.runtime.actuator.on_report(reported)
        try:
            await self._run_timers()
        finally:
            self.runtime.actuator.on_report(None)

    async def _run_timers(self) -> None:
        while not self._stop.is_set():
            if self._fatal is not None:
                raise self._fatal
            self._wake.clear()
            self._sleeping_until = -math.inf  # awake: decisions need not wake it
            due = self._next_due()
            wall = self._clock.now()
            if due is not None and due <= wall:
                self._submit_catch_up()
                continue
            # Until the next timer on the clock or a decision's wake-up; a minute at most, as
            # a backend's next event may move without one.
            until = wall + 60.0 if due is None else min(wall + 60.0, due)
            self._sleeping_until = until
            self._sleeping_for = due if until == due else None
            try:
                await wait_event_until(self._clock, self._wake, until)
            finally:
                self._sleeping_until = -math.inf
        if self._fatal is not None:
            raise self._fatal

    async def run_metrics(self, interval_s: float = 1.0) -> None:
        """Refresh the metrics, and the journal's decision index (in bulk, off the requests'
        path, so that a ListDecisions after a busy spell has little left to index)."""
        while not self._stop.is_set():
            self.metrics.refresh(self.runtime, self.now(), self.limits.open_streams)
            try:
                # In slices, yielding between them: one second of a busy broker's entries
                # at once would hold up its requests for milliseconds.
                while self.runtime.journal.update_index(INDEX_SLICE) == INDEX_SLICE:
                    await asyncio.sleep(0)
            except JournalError as exc:  # the next query tries again (and says why)
                log.warning("could not update the journal's decision index: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval_s)

    async def run_checkpoints(self, interval_s: float = CHECKPOINT_INTERVAL_S) -> None:
        """Checkpoint the journal's WAL on a worker thread, instead of inside whichever
        commit takes it past SQLite's threshold: a checkpoint fsyncs, and on a busy disk the
        commit doing it held the event loop, and every call, for up to seconds."""
        journal = self.runtime.journal
        journal.manual_checkpoints()
        while not self._stop.is_set():
            try:
                await asyncio.to_thread(journal.checkpoint)
            except JournalError as exc:  # the next round tries again; appends go on
                log.warning("journal checkpoint failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), interval_s)

    def _next_due(self) -> float | None:
        times = [self.engine.next_timer(), self.runtime.actuator.next_report_time()]
        present = [t for t in times if t is not None]
        return min(present) if present else None

    def begin_shutdown(self) -> None:
        """Stop taking new work: blocking Acquires and streams end with UNAVAILABLE."""
        self._closing = True
        for w in self._waiters.values():
            if not w.future.done():
                w.future.set_exception(ShuttingDown("the queued request"))
        self.watches.close_all(ShuttingDown("the stream"))
        for placing in self._placing.values():
            placing.cut_off()  # an Acquire waiting for its allocation, like a queued one
        self._placing.clear()
        self._notify_supply()

    def stop_background(self) -> None:
        self._stop.set()
        self.batcher.hurry = True
        self._wake.set()
        self._notify_supply()

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

    def _submit_catch_up(self) -> None:
        try:
            self.runtime.catch_up(self.now())
        except JournalError as exc:
            self._failed(exc)
            raise

    def _failed(self, exc: BaseException) -> None:
        # An append the journal refused was rolled back (the engine is as the journal has
        # it): that call fails, the next may work. Only a broker that could not roll back
        # stops the service.
        if not self.runtime.broken:
            return
        if self._fatal is None:
            log.error("journal write failed; the broker stops taking requests: %s", exc)
            self._fatal = exc
            self._wake.set()

    def _on_decisions(self, _event: Event, outcome: Outcome) -> None:
        """The runtime's listener: called after each applied event's journal commit."""
        self.metrics.on_decisions(outcome)
        asynchronous = self.runtime.actuator.asynchronous
        for index, d in enumerate(outcome.decisions):
            if isinstance(d, Granted):
                w = self._waiters.get(d.lease_id)
                if w is not None and not w.future.done():
                    w.future.set_result(d)
            lease_id = placed_by(d) if asynchronous else None
            if lease_id is not None and lease_id not in self._placing:
                # Its allocation is being made: its Acquire answers once it is ready.
                placing = _Placing(asyncio.get_running_loop().create_future())
                if self._closing:
                    # The shutdown began while this grant was being committed, after it cut
                    # off the waits under way: cut this one off too, as it would have.
                    placing.cut_off()
                self._placing[lease_id] = placing
            if isinstance(d, Allocated | Revoked | Expired | Released):
                self._placed(d.lease_id)  # allocated, or ended first (the allocation failed)
            self.watches.publish(d, outcome.seq, index)

    def _after_commit(self, outcomes: list[Outcome]) -> None:
        """Once per commit batch, not per event: count it, wake the timer task if it must,
        tell the supply streams."""
        self.metrics.on_commit(len(outcomes))
        # Wake the timer task only if what is due next moved: earlier than it sleeps until,
        # or away from the timer it sleeps for (that one died: a renewal, a release). Most
        # requests move neither, and a wake-up costs more (a task and a timer on the loop)
        # than looking.
        if self._sleeping_until > -math.inf:
            due = self._next_due()
            if (due is not None and due < self._sleeping_until) or (
                self._sleeping_for is not None and due != self._sleeping_for
            ):
                self._wake.set()
        self._notify_supply()

    def _placed(self, lease_id: str) -> None:
        """A lease's placement is over (allocated, or the lease ended first): let its
        Acquire answer."""
        placing = self._placing.pop(lease_id, None)
        if placing is not None and not placing.done.done():
            placing.done.set_result(None)

    async def _until_placed(self, lease_id: str) -> None:
        """Wait until the lease's placement is over (at once if none is under way)."""
        placing = self._placing.get(lease_id)
        if placing is not None:
            await asyncio.shield(placing.done)

    def _notify_supply(self) -> None:
        if not self._supply_waiters:
            return  # nobody waits: no new event per decision
        ev, self._supply_changed = self._supply_changed, asyncio.Event()
        ev.set()

    async def supply_changed(self, timeout_s: float) -> None:
        """Wait until a decision changes the pool (or ``timeout_s`` passes)."""
        self._supply_waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._supply_changed.wait(), timeout_s)
        finally:
            self._supply_waiters -= 1

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
        for value, name in ((request_id, "request_id"), (key, "idempotency_key")):
            if len(value) > 128 or not value.isprintable():
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT, name, "at most 128 printable characters"
                )
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
        engine = self.engine
        queue = engine.queue
        pending = engine.pending
        if request_id or key:
            # One request (an on_queued poll, every second per waiting client): its place
            # is counted, not sorted for.
            if request_id:
                picked = [pending[request_id]] if request_id in pending else []
            else:
                picked = list(pending.values())
            if key:
                picked = [p for p in picked if p.key == key]
            if only is not None:
                picked = [p for p in picked if p.campaign == only]
            places = []
            for p in picked:
                mine = queue.key(p)
                places.append((1 + sum(queue.key(q) < mine for q in pending.values()), p))
        else:
            places = [
                (i, p)
                for i, p in enumerate(queue.ordered(), start=1)
                if only is None or p.campaign == only
            ]
        return convert.pending_to_proto(engine, now, places)

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
            await self._until_placed(first.lease_id)
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
        await self._until_placed(grant.lease_id)
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
        reason = reason.strip()
        if not reason:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                "reason",
                "required: say why the lease is revoked (it is journaled and sent to its holder)",
            )
        if len(reason) > MAX_REVOKE_REASON or not reason.isprintable():
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                "reason",
                f"at most {MAX_REVOKE_REASON} printable characters (got {len(reason)})",
            )
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
        """Decide the event ``make(now)`` on a copy of the engine's committed state: its
        outcome, and the copy as it would be after it. The live engine, the journal and
        everything listening to them are left as they were. Bad input raises as it would
        for the real call.

        The copy first catches up with the timers due by now, as ``Runtime.catch_up``
        would before the real call, so that the event meets the state that call would
        meet; backend reports not yet delivered are not anticipated (the timer task
        delivers them as they fall due)."""
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
        now = self.now()
        event = make(now)
        # Bad input is refused before the copy is paid for. Whether a request or a spec is
        # valid does not depend on the timers the copy catches up with first; the copy's
        # engine checks it again anyway.
        validation.validate(self.engine, event)
        engine = _engine_copy(self.engine)
        self.runtime.catch_up_timers(engine, now)
        return engine.apply(event), engine

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
        self._token_gen[name] = self._token_gen.get(name, 0) + 1
        self.watches.end_holder(name, _rotated(name))
        self._notify_supply()
        return token, now

    def _share_tokens(self) -> None:
        """On a shared (PostgreSQL) journal: the tokens issued here, for the standbys."""
        journal = self.runtime.journal
        if hasattr(journal, "share_tokens"):
            _push_tokens(self.state_dir, journal)

    def token_generation(self, campaign: str | None) -> int:
        """How many times ``campaign``'s token was rotated while serving (0 for the admin):
        a stream compares it with the value it opened with."""
        return 0 if campaign is None else self._token_gen.get(campaign, 0)

    def check_token_generation(self, campaign: str | None, opened_with: int) -> None:
        """Raise UNAUTHENTICATED if ``campaign``'s token was rotated since ``opened_with``."""
        if self.token_generation(campaign) != opened_with:
            assert campaign is not None
            raise _rotated(campaign)


def _update_event(spec: CampaignSpec, at: float) -> UpdateCampaign:
    # The spec as a replay will decode it (see Runtime.open): the engine that decides it
    # now and one replaying the journal see the same spec, down to its keys' order.
    return UpdateCampaign(at=at, spec=codec.campaign_from_dict(codec.plain(spec)))


def _engine_copy(engine: Engine) -> Engine:
    """A copy of ``engine`` sharing no mutable state with it: the snapshot's own capture
    (its ``__getstate__`` leaves the per-pass caches out) read back. About twice as fast
    as ``copy.deepcopy``, which walks the same state object by object in Python
    (``benchmarks/bench_whatif.py``)."""
    return safe_pickle.loads(snapshot.capture(engine))


def _rotated(campaign: str) -> Unauthenticated:
    return Unauthenticated(
        "TOKEN_ROTATED",
        f"campaign {campaign}'s token was rotated: reconnect with the new token",
    )


def _pull_tokens(state: Path, store: Any) -> None:
    """Copy the brokers' shared token digests into this broker's token store (before it
    opens it), so that it accepts the tokens another leader issued."""
    rows = store.shared_tokens()
    if not rows:
        return
    with contextlib.closing(sqlite3.connect(state / TOKENS_DB)) as conn, conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS tokens (campaign TEXT PRIMARY KEY, "
            "sha256 TEXT NOT NULL UNIQUE, issued_at REAL NOT NULL)"
        )
        # A token rotated elsewhere replaces this broker's copy; its old digest goes first,
        # so that the UNIQUE digest never clashes.
        conn.executemany("DELETE FROM tokens WHERE campaign = ?", [(c,) for c, _, _ in rows])
        conn.executemany("INSERT INTO tokens (campaign, sha256, issued_at) VALUES (?, ?, ?)", rows)


def _push_tokens(state: Path, store: Any) -> None:
    with contextlib.closing(sqlite3.connect(state / TOKENS_DB)) as conn:
        rows = conn.execute("SELECT campaign, sha256, issued_at FROM tokens").fetchall()
    store.share_tokens(rows)


def _lock_state_dir(state: Path) -> int:
    """Hold the state directory's lock while serving (``broker/state_lock.py``): one server
    per state directory."""
    fd = try_lock(state)
    if fd is None:
        raise ValueError(
            f"another bursar serve is using {state} (it holds {state / LOCK_FILE}); stop it "
            "or choose another --state-dir"
        )
    return fd


def _result(fut: asyncio.Future[Granted]) -> Granted | None:
    """The future's grant, if it has one."""
    if fut.done() and not fut.cancelled() and fut.exception() is None:
        return fut.result()
    return None


def _withdraw_orphans(broker: Runtime) -> None:
    """Cancel the requests that were queued when the last server stopped.

    Each belonged to a blocking Acquire call that the stop cut off: nobody is waiting for
    its grant any more (the client retries against the new server), and a grant nobody
    hears of would hold capacity until it expired.
    """
    # Withdrawn as of the last journaled instant, when the old server was still alive:
    # first catching up on the downtime could grant one of them (a lease ending then frees
    # capacity) to nobody. All in one step, so that withdrawing one cannot grant the next.
    ids = [p.id for p in sorted(broker.engine.pending.values(), key=lambda p: p.seq)]
    if ids:
        broker.submit(CancelRequest(at=broker.engine.now, request_id=ids[0], also=tuple(ids[1:])))
