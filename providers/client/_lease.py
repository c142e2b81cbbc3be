"""A lease held for the life of a block: acquired, renewed before it expires, watched for
preemption, released on exit.

Times to renew are measured on the client's clock (``AsyncBrokerClient(clock=...)``,
the wall clock by default), never by comparing the server's timestamps with the
client's (the two clocks may disagree): a lease granted or renewed by a call sent at
client time ``t`` lasts at least until
``t + (expires_at - granted_at)`` (for a renewal: ``t + duration_s``), because the
server decided after ``t``. Renewal happens ``renew_margin_s`` before that lower bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import math
import random
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from bursar.broker.clock import wait_event_until
from bursar.providers.client._backoff import Pace
from bursar.providers.client._errors import (
    FailedPrecondition,
    NotFound,
    Refused,
    Unavailable,
)
from bursar.providers.client._types import (
    Lease,
    LeaseClass,
    LeaseEvent,
    LeaseEventKind,
    LeaseState,
    PendingRequest,
    Shape,
    shape_to_proto,
)
from bursar.providers.client._watcher import LeaseWatcher

if TYPE_CHECKING:
    from bursar.providers.client._aio import AsyncBrokerClient
    from bursar.providers.client._intent import Intent

__all__ = ["LeaseHandle"]

log = logging.getLogger("bursar.providers.client")

MAX_DEFAULT_MARGIN_S = 60.0

MIN_RENEW_RETRY_S = 0.05
"""The least time between two tries of a refused renewal, however short the lease."""


def default_margin(duration_s: float) -> float:
    """Renew at half-life, but no earlier than 60 s before expiry."""
    return min(duration_s / 2.0, MAX_DEFAULT_MARGIN_S)


class _Refusals:
    """One spell of refused renewals: when to try next, and what to say about it (a
    line when the spell starts or its reason changes, not one per try)."""

    def __init__(self, pace: Pace, rng: random.Random) -> None:
        self.pace = pace
        self.tries = 0
        self._delays: Iterator[float] = pace.delays(rng)
        self._said: str | None = None

    def next_wait(self, exc: Refused, left_s: float) -> float | None:
        """Seconds until the next try, or None when no try can come before the lease
        expires (``left_s`` from now): never sooner than the broker's ``retry_after``
        nor the pace's floor; a jittered delay that would land past the expiry is pulled
        in to the last try before it."""
        self.tries += 1
        least = max(exc.retry_after, self.pace.floor_s)
        wait = max(least, next(self._delays))
        if wait >= left_s:
            wait = max(least, left_s - self.pace.floor_s / 2.0)
        return wait if wait < left_s else None

    def tell(self, lease_id: str, exc: Refused, wait: float | None, expires_at: float) -> None:
        reason = exc.reason or "REFUSED"
        if wait is None:
            log.warning(
                "lease %s: gave up renewing after %d refused tries (%s); it expires at %s",
                lease_id,
                self.tries,
                reason,
                _hhmmss(expires_at),
            )
        elif reason != self._said:
            log.warning(
                "lease %s: renewal refused (%s: %s); retrying every ~%s s until %s",
                lease_id,
                reason,
                exc.message,
                f"{self.pace.floor_s:.3g}-{self.pace.ceiling_s:.3g}",
                _hhmmss(expires_at),
            )
        else:
            log.debug(
                "lease %s: renewal refused again (%s); next try in %.2f s", lease_id, reason, wait
            )
        self._said = reason


def _hhmmss(t: float) -> str:
    """A server timestamp for a log line: the time of day in UTC, as the CLI writes times."""
    if not math.isfinite(t):
        return "never"
    return datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M:%S UTC")


class LeaseHandle:
    """A lease held while a block runs; create it with
    :meth:`AsyncBrokerClient.held_lease`::

        async with client.held_lease({"gpu": 8}, 300, on_preempt=drain) as h:
            await h.active.wait()          # usable (at once on the warm path)
            run_on(h.lease.nodes)
            if h.preempted.is_set(): ...   # or await h.preempted.wait()

    Attributes:

    * ``lease``: the lease as last reported (renewals and Watch events update it);
    * ``active``, ``preempted``, ``ended``: ``asyncio.Event`` s, set when the lease
      becomes usable, when the broker warns that it will reclaim it (renewal stops; the
      lease is revoked at ``preempt_deadline``: drain before), and when it ends (revoked,
      expired or released);
    * ``preempt_event``, ``end_event``: the Watch events behind those, if any;
    * for an elastic lease (``intent``): ``warnings`` and ``resizes``, the RESIZE_WARNING
      and RESIZED events seen so far (counts, so that a listener that joins late still
      learns that one came), ``resize_warning`` the latest warning (``deadline``: when the
      lease shrinks to ``resize_to``) and ``resize_event`` the latest RESIZED; ``lease``
      follows both (its ``size`` and ``nodes`` are the whole lease's);
    * ``renewals``: successful renewals so far; ``error``: an unexpected failure of the
      background work (raised again when the block exits);
    * ``released_here``: whether this handle's release ended the lease (False when it
      had ended before: released by someone else, expired, revoked).

    Events come from the client's one shared Watch stream (opened before the Acquire is
    sent, so none is missed), however many leases the client holds: the broker limits
    the streams a client may keep open.

    Renewal failures are handled: a refusal (BUCKET_EMPTY, ...) is retried with
    decorrelated jitter between an eighth and a half of the renewal margin, never sooner
    than its ``retry_after``, while time is left (one warning when refusals start or
    change reason, one when renewed or given up); an unreachable broker is retried with backoff
    (the client's); a lease that is being reclaimed or has ended stops renewal. Leaving
    the block releases the lease, once, whatever happened; if the broker cannot be
    reached then, a warning is logged and the lease expires on its own.
    """

    def __init__(
        self,
        client: AsyncBrokerClient,
        size: Mapping[str, float],
        duration_s: float,
        *,
        renew_margin_s: float | None = None,
        on_preempt: Callable[[LeaseEvent], Any] | None = None,
        blocking: bool = True,
        timeout: float | None = None,
        lease_class: LeaseClass | str | None = None,
        labels: Mapping[str, str] | None = None,
        shape: Shape | None = None,
        intent: Intent | None = None,
        on_queued: Callable[[PendingRequest], Any] | None = None,
        queued_poll_s: float = 1.0,
        adopt: str | None = None,
    ) -> None:
        margin = default_margin(duration_s) if renew_margin_s is None else renew_margin_s
        if not 0 <= margin < duration_s:
            raise ValueError(
                f"renew_margin_s must be in [0, duration_s) (got {margin!r} for a "
                f"{duration_s!r} s lease)"
            )
        self._client = client
        self._request = (dict(size), duration_s, blocking, timeout, lease_class, labels)
        self._shape = shape_to_proto(shape)
        self._intent = None if intent is None else intent.to_proto()
        self.duration_s = duration_s
        self.renew_margin_s = margin
        self._on_preempt = on_preempt
        self._on_queued = on_queued
        self._queued_poll_s = queued_poll_s
        self.active = asyncio.Event()
        self.preempted = asyncio.Event()
        self.ended = asyncio.Event()
        self.preempt_event: LeaseEvent | None = None
        self.end_event: LeaseEvent | None = None
        self.resize_warning: LeaseEvent | None = None
        self.resize_event: LeaseEvent | None = None
        self.warnings = 0
        self.resizes = 0
        self.renewals = 0
        self.released_here = False
        self.error: BaseException | None = None
        self._lease: Lease | None = None
        self._expires_local = 0.0
        self._renew_at = 0.0
        self._stop_renewing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._callbacks: set[asyncio.Task[Any]] = set()
        self._listeners: list[Callable[[LeaseHandle], None]] = []
        self._releasing: asyncio.Future[Lease] | None = None
        self._watcher: LeaseWatcher | None = None
        self._adopt = adopt
        """The id of a lease to take over (:meth:`AsyncBrokerClient.adopted_lease`)."""

    # ------------------------------------------------------------------ state

    @property
    def lease(self) -> Lease:
        if self._lease is None:
            raise RuntimeError("the lease has not been acquired yet: use `async with`")
        return self._lease

    @property
    def id(self) -> str:
        return self.lease.id

    @property
    def preempt_deadline(self) -> float | None:
        """When a preempted lease is revoked (server clock, seconds since the epoch)."""
        return self.preempt_event.deadline if self.preempt_event is not None else None

    def add_listener(self, fn: Callable[[LeaseHandle], None]) -> None:
        """Call ``fn(handle)`` (on the event loop) whenever the handle's state changes."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        for fn in self._listeners:
            fn(self)

    def _update(self, lease: Lease) -> None:
        old = self._lease
        if (
            old is not None
            and lease.state is old.state
            and lease.expires_at < old.expires_at
            and not lease.ended
        ):
            return  # a stale snapshot (e.g. a Watch event older than a renewal's answer)
        if old is not None and old.ended and not lease.ended:
            return
        if old is not None and old.allocation and not lease.allocation and not lease.ended:
            # An event decided before the allocation was made (a GRANTED read after the
            # Acquire's answer): the allocation stays what the broker last said.
            lease = dataclasses.replace(lease, allocation=old.allocation)
        if old is not None and lease.ended and not lease.size:
            # The broker describes an ended lease by its end only: keep what it was.
            lease = dataclasses.replace(
                old,
                state=lease.state,
                ended_at=lease.ended_at,
                end_cause=lease.end_cause,
            )
        self._lease = lease
        if lease.state is LeaseState.ACTIVE:
            self.active.set()
        if lease.ended:
            self._stop_renewing.set()
            self.ended.set()

    # ------------------------------------------------------------------ life cycle

    async def __aenter__(self) -> LeaseHandle:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except Unavailable as err:
            log.warning(
                "could not release lease %s (%s); it expires on its own at %.3f",
                self.lease.id,
                err,
                self.lease.expires_at,
            )
        finally:
            # on_preempt coroutines still running end with the block (after the release,
            # which one of them may be awaiting).
            for t in list(self._callbacks):
                t.cancel()
            for t in list(self._callbacks):
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        if exc is None and self.error is not None:
            raise self.error

    async def start(self) -> Lease:
        """Acquire the lease and start renewing and watching it."""
        if self._lease is not None:
            raise RuntimeError("a LeaseHandle is entered once")
        if self._adopt is not None:
            return await self._take_over(self._adopt)
        size, duration_s, blocking, timeout, lease_class, labels = self._request
        # The client's shared Watch stream is open before the Acquire is sent: no event
        # about the new lease can be missed.
        watcher = self._client._lease_watcher()
        await watcher.hold(self._client._conn.call_timeout_s)
        t_send = self._client.clock.now()
        try:
            lease, resp = await self._client._acquire(
                size,
                duration_s,
                blocking,
                timeout,
                lease_class,
                labels,
                shape=self._shape,
                intent=self._intent,
                on_queued=self._on_queued,
                queued_poll_s=self._queued_poll_s,
            )
        except BaseException:
            watcher.unhold()
            raise
        self._update(lease)
        self._expires_local = t_send + resp.waited_s + (lease.expires_at - lease.granted_at)
        self._renew_at = self._expires_local - self.renew_margin_s
        self._watcher = watcher
        watcher.subscribe(lease.id, self._on_event, self._on_error)
        self._tasks = [
            asyncio.create_task(self._guard(self._renew_loop()), name=f"renew {lease.id}")
        ]
        self._changed()
        return lease

    async def _take_over(self, lease_id: str) -> Lease:
        """Hold ``lease_id`` from now on, as if this handle had acquired it: the lease
        must be live (STARTING, ACTIVE or PREEMPTING); a live one that is not being
        reclaimed is renewed at once (so the holder's clock knows when it expires, and
        a lease of another campaign is refused before anything is held). Raises
        :class:`NotFound` (never granted), :class:`FailedPrecondition` (ended,
        ``LEASE_ENDED``; or its renewal says it cannot be held), :class:`Refused` (the
        renewal was refused: it is not held)."""
        watcher = self._client._lease_watcher()
        # Open before the lease is read, as for an Acquire: no later event is missed.
        await watcher.hold(self._client._conn.call_timeout_s)
        clock = self._client.clock
        try:
            lease = await self._client.get_lease(lease_id)
            if lease.ended:
                cause = f" ({lease.end_cause})" if lease.end_cause else ""
                raise FailedPrecondition(
                    f"lease {lease_id} is {lease.state.value}{cause}: there is nothing to adopt",
                    reason="LEASE_ENDED",
                )
            t_send = clock.now()
            if lease.state is LeaseState.PREEMPTING:
                # Not renewable: it runs until its revocation, which the broker decides.
                expires_local = t_send
            else:
                lease = await self._client._renew(lease_id, self.duration_s)
                expires_local = t_send + self.duration_s
        except BaseException:
            watcher.unhold()
            raise
        self._update(lease)
        self._expires_local = expires_local
        self._renew_at = expires_local - self.renew_margin_s
        self._watcher = watcher
        watcher.subscribe(lease.id, self._on_event, self._on_error)
        if lease.state is LeaseState.PREEMPTING and not self.preempted.is_set():
            self._preempted(
                LeaseEvent(
                    LeaseEventKind.PREEMPT_WARNING,
                    at=clock.now(),
                    lease=lease,
                    deadline=lease.preempt_deadline,
                    snapshot=True,
                )
            )
        self._tasks = [
            asyncio.create_task(self._guard(self._renew_loop()), name=f"renew {lease.id}")
        ]
        self._changed()
        return lease

    async def release(self) -> Lease:
        """Stop renewing and release the lease; return its final state. Idempotent and
        safe to call concurrently: every call gets the same answer."""
        if self._releasing is None:
            self._releasing = asyncio.ensure_future(self._release())
        return await asyncio.shield(self._releasing)

    async def _release(self) -> Lease:
        self._stop_renewing.set()
        try:
            if self.ended.is_set():
                final = self.lease
            else:
                lease, already_ended = await self._client._release(self.lease.id)
                self.released_here = not already_ended
                self._update(lease)
                final = self.lease
        finally:
            if self._watcher is not None:
                self._watcher.unsubscribe(self.lease.id)
            for t in self._tasks:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._changed()
        return final

    async def _guard(self, work: Any) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported at exit, not swallowed
            log.error("lease %s: background work failed: %r", self._lease and self._lease.id, exc)
            if self.error is None:
                self.error = exc
            self._changed()

    # ------------------------------------------------------------------ renewal

    def _pace(self) -> Pace:
        """How a refused renewal is retried: no sooner than an eighth of the renewal
        margin apart (at most 8 tries between the first refusal and the expiry, 7.5 s
        apart for the default 60 s margin), no later than half of it."""
        floor = max(self.renew_margin_s / 8.0, MIN_RENEW_RETRY_S)
        return Pace(floor, max(floor, self.renew_margin_s / 2.0))

    async def _renew_loop(self) -> None:
        lease_id, duration = self.lease.id, self.duration_s
        clock = self._client.clock
        refusals: _Refusals | None = None
        while True:
            if self._renew_at > clock.now():
                await wait_event_until(clock, self._stop_renewing, self._renew_at)
            if self._stop_renewing.is_set():
                return
            t_send = clock.now()
            # Retry an unreachable broker until the lease would have expired; after that,
            # keep trying without a bound: the answer says whether the lease survived.
            give_up_at = self._expires_local if t_send < self._expires_local else None
            try:
                lease = await self._client._renew(lease_id, duration, give_up_at=give_up_at)
            except Refused as exc:
                if refusals is None:
                    refusals = _Refusals(self._pace(), self._client._conn.rng)
                wait = refusals.next_wait(exc, self._expires_local - clock.now())
                refusals.tell(lease_id, exc, wait, self.lease.expires_at)
                if wait is None:
                    return  # it expires; the Watch stream reports the end
                self._renew_at = clock.now() + wait
                continue
            except (FailedPrecondition, NotFound) as exc:
                log.info("lease %s: not renewable: %s", lease_id, exc)
                await self._refresh()
                return
            except Unavailable:
                self._renew_at = clock.now()
                continue
            if refusals is not None:
                log.warning("lease %s: renewed after %d refused tries", lease_id, refusals.tries)
                refusals = None
            self.renewals += 1
            self._update(lease)
            self._expires_local = max(self._expires_local, t_send + duration)
            self._renew_at = self._expires_local - self.renew_margin_s
            self._changed()

    async def _refresh(self) -> None:
        """Learn the lease's state after a renewal said it is no longer renewable."""
        try:
            lease = await self._client.get_lease(self.lease.id)
        except (Unavailable, NotFound):
            return  # the Watch stream will report the end
        self._update(lease)
        if lease.state is LeaseState.PREEMPTING and not self.preempted.is_set():
            self._preempted(
                LeaseEvent(
                    LeaseEventKind.PREEMPT_WARNING,
                    at=self._client.clock.now(),
                    lease=lease,
                    deadline=lease.preempt_deadline,
                    snapshot=True,
                )
            )
        self._changed()

    # ------------------------------------------------------------------ watch

    def _on_event(self, ev: LeaseEvent) -> None:
        self._update(ev.lease)
        if ev.kind is LeaseEventKind.PREEMPT_WARNING and not self.preempted.is_set():
            self._preempted(ev)
        elif ev.kind is LeaseEventKind.RESIZE_WARNING:
            self.resize_warning = ev
            self.warnings += 1
        elif ev.kind is LeaseEventKind.RESIZED:
            self.resize_event = ev
            self.resizes += 1
        if ev.kind.ends_lease:
            self.end_event = ev
            self.ended.set()
            self._stop_renewing.set()
        self._changed()

    def _on_error(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self._changed()

    def _preempted(self, ev: LeaseEvent) -> None:
        self.preempt_event = ev
        self._stop_renewing.set()
        self.preempted.set()
        if self._on_preempt is None:
            return
        try:
            result = self._on_preempt(ev)
        except Exception as exc:  # the caller's bug: reported at exit
            log.exception("lease %s: on_preempt failed", ev.lease.id)
            if self.error is None:
                self.error = exc
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(self._guard(result))
            self._callbacks.add(task)
            task.add_done_callback(self._callbacks.discard)
