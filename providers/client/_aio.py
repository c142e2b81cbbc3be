"""The async clients: :class:`AsyncBrokerClient` (what campaigns call) and
:class:`AsyncAdminClient` (campaigns and tokens, with the admin token)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from bursar.broker.clock import SYSTEM, Clock
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.providers.client._backoff import Backoff
from bursar.providers.client._channel import (
    DEFAULT_TARGET,
    Connection,
    Tls,
    retryable,
)
from bursar.providers.client._errors import (
    BursarClientError,
    OutOfRange,
    from_rpc_error,
)
from bursar.providers.client._intent import Intent
from bursar.providers.client._lease import LeaseHandle
from bursar.providers.client._policy import PolicyApplied, PolicyState
from bursar.providers.client._types import (
    BrokerStatus,
    Campaign,
    CampaignSpec,
    CreatedCampaign,
    DecisionKind,
    DecisionRecord,
    Lease,
    LeaseClass,
    LeaseEvent,
    MeterResult,
    PendingRequest,
    Shape,
    Supply,
    WhatIfResult,
    shape_to_proto,
)
from bursar.providers.client._watcher import LeaseWatcher

_RESUME_METADATA = "bursar-resume-seq"
"""Initial metadata of a Watch stream: the journal entry its live events start after."""

__all__ = ["MAX_WAIT_S", "AsyncAdminClient", "AsyncBrokerClient"]

MAX_WAIT_S = 3600.0
"""The longest a blocking acquire waits (the server's limit on AcquireRequest.timeout_s)."""

log = logging.getLogger("bursar.providers.client")


def _wait(blocking: bool, timeout: float | None) -> float:
    """The AcquireRequest's timeout_s: 0 for a request that may not wait."""
    return 0.0 if not blocking else MAX_WAIT_S if timeout is None else timeout


async def _whatif_envelope(conn: Connection, spec: CampaignSpec) -> WhatIfResult:
    # Broker.WhatIf is read-only: retried after UNAVAILABLE like any read.
    resp = await conn.unary("broker", "WhatIf", pb.WhatIfRequest(envelope=spec.to_proto()))
    return WhatIfResult.from_proto(resp)


def _ids(lease_id: str | Iterable[str] | None) -> list[str]:
    if lease_id is None:
        return []
    if isinstance(lease_id, str):
        return [lease_id]
    return list(lease_id)


class AsyncBrokerClient:
    """An async client of the ``bursar.v1.Broker`` service.

    ``target`` is ``host:port`` (``bursar serve`` listens on 127.0.0.1:50051); ``token``
    the campaign's token (or the admin token, acting for ``campaign``). Calls are
    retried with ``backoff`` for up to ``retry_timeout_s`` (None: forever) while the
    broker is unreachable or restarting; the jitter comes from ``rng`` (a
    ``random.Random``, or a seed). Each unary call has a deadline of
    ``call_timeout_s`` (a blocking acquire: its wait plus that). ``clock`` (default: the
    wall clock) times retries and held leases' renewals; a test may pass a
    ``ManualClock`` to drive them.

    The client is bound to the event loop it is first used on. Use it as ``async with``,
    or call :meth:`close`::

        async with AsyncBrokerClient("127.0.0.1:50051", token) as client:
            async with client.held_lease({"gpu": 8}, duration_s=300) as lease:
                ...  # lease.lease.nodes; renewed in the background, released on exit
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        token: str | None = None,
        *,
        tls: Tls = None,
        campaign: str | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | int | None = None,
        retry_timeout_s: float | None = 30.0,
        call_timeout_s: float = 30.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        clock: Clock = SYSTEM,
    ) -> None:
        self.campaign = campaign
        self.clock = clock
        self._watcher: LeaseWatcher | None = None
        self._conn = Connection(
            target,
            token,
            tls=tls,
            backoff=backoff,
            rng=rng,
            retry_timeout_s=retry_timeout_s,
            call_timeout_s=call_timeout_s,
            channel_options=channel_options,
            clock=clock,
        )

    @property
    def target(self) -> str:
        return self._conn.target

    async def __aenter__(self) -> AsyncBrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; open streams end. Leases are not released (they are the
        broker's: release them, or let them expire)."""
        if self._watcher is not None:
            await self._watcher.aclose()
        await self._conn.close()

    async def _call(self, method: str, request: Any, **kw: Any) -> Any:
        return await self._conn.unary("broker", method, request, **kw)

    def _lease_watcher(self) -> LeaseWatcher:
        """The Watch stream shared by this client's held leases."""
        if self._watcher is None:
            self._watcher = LeaseWatcher(self)
        return self._watcher

    # ---------------------------------------------------------------- leases

    async def acquire(
        self,
        size: Mapping[str, float],
        duration_s: float,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        lease_class: LeaseClass | str | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        shape: Shape | None = None,
        nodes: int | None = None,
        per_node: Mapping[str, float] | None = None,
        exclusive: bool = False,
        cpus_per_gpu: float | None = None,
        mem_per_gpu: float | None = None,
        intent: Intent | None = None,
        on_queued: Callable[[PendingRequest], Any] | None = None,
        queued_poll_s: float = 1.0,
    ) -> Lease:
        """Ask for a lease of ``size`` (e.g. ``{"gpu": 8}``) for ``duration_s`` seconds.

        Every piece of a lease fits one node. How it may be cut, in Slurm's terms (a
        :class:`Shape`, or its fields as keywords; not both): by default any split in which
        each piece keeps the size's ratios; ``nodes=N, per_node={"gpu": 4}``: exactly N
        equal pieces on N nodes (``size`` may then be ``{}``); ``exclusive=True``: N whole
        nodes (``size`` ``{}``); ``cpus_per_gpu``, ``mem_per_gpu``: cores and GB added per
        GPU of a request that names GPUs only.

        ``blocking=False``: granted now or :class:`Refused` at once (``reason`` says why,
        ``retry_after`` when to try again). ``blocking=True``: the request queues and
        the call waits up to ``timeout`` seconds (None: the server's maximum,
        ``MAX_WAIT_S``) for the grant, else raises :class:`Refused` with the last
        reason. ``timeout`` is the proto's ``AcquireRequest.timeout_s`` under the name the
        Python API has always used: sent as given, 0 for ``blocking=False``, ``MAX_WAIT_S``
        for None, and on a retry after UNAVAILABLE only what is left of it. A grant on the reclaim or cold path returns at once in state STARTING,
        usable from ``starts_at``. ``lease_class`` may lower the campaign's class for
        this lease ("opportunistic", ...), never raise it.

        Every call carries an idempotency key (a fresh random one unless
        ``idempotency_key`` is given), and its retries after UNAVAILABLE carry the same
        key: a reply lost on the way back never leaves a second, orphaned lease. Pass your
        own key to make a retry of your own (e.g. after this process restarts) safe too.

        ``intent`` (an :class:`Intent`; ``size`` then ``{}``): an elastic, deadline-aware
        lease, granted at ``intent.min`` and resized by the broker; its Watch stream hears
        RESIZED and RESIZE_WARNING, and ``Lease.elastic`` shows the allocator's view.

        ``on_queued`` (a function or coroutine function; blocking calls only): told why the
        request waits while it does. It receives a :class:`PendingRequest` (``reason``,
        ``estimated_wait_s``, ``position``, ``reserved_at``) when the request is first seen
        in the queue and whenever that changes, read every ``queued_poll_s`` seconds with
        ListPending by the call's idempotency key; never for a request granted at once.
        An exception it raises is logged and does not end the call.
        """
        wire = shape_to_proto(shape, nodes, per_node, exclusive, cpus_per_gpu, mem_per_gpu)
        lease, _ = await self._acquire(
            size,
            duration_s,
            blocking,
            timeout,
            lease_class,
            labels,
            idempotency_key,
            wire,
            None if intent is None else intent.to_proto(),
            on_queued=on_queued,
            queued_poll_s=queued_poll_s,
        )
        return lease

    async def _acquire(
        self,
        size: Mapping[str, float],
        duration_s: float,
        blocking: bool,
        timeout: float | None,
        lease_class: LeaseClass | str | None,
        labels: Mapping[str, str] | None,
        idempotency_key: str | None = None,
        shape: pb.Shape | None = None,
        intent: pb.Intent | None = None,
        *,
        on_queued: Callable[[PendingRequest], Any] | None = None,
        queued_poll_s: float = 1.0,
    ) -> tuple[Lease, pb.AcquireResponse]:
        wait = _wait(blocking, timeout)
        key = idempotency_key or uuid.uuid4().hex
        request = self._acquire_request(
            size, duration_s, wait, lease_class, labels, key, shape, intent
        )
        if on_queued is None or not wait:
            return await self._acquire_call(request, wait)
        if not queued_poll_s > 0:
            raise ValueError(f"queued_poll_s must be > 0, not {queued_poll_s!r}")
        watcher = asyncio.ensure_future(self._follow_queued(key, on_queued, queued_poll_s))
        try:
            return await self._acquire_call(request, wait)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _follow_queued(
        self, key: str, on_queued: Callable[[PendingRequest], Any], poll_s: float
    ) -> None:
        """Read the keyed request's place in the queue every ``poll_s`` and tell
        ``on_queued`` of each change, until cancelled (the Acquire call ended).

        The Acquire call stays a unary one (its retry, cancellation and idempotency rules
        unchanged); the engine decides a request's QUEUE once and changes its reason
        silently afterwards, so a stream from the server would sample the same state."""
        last: PendingRequest | None = None
        while True:
            await self.clock.sleep_until(self.clock.now() + poll_s)
            try:
                found = await self.list_pending(idempotency_key=key)
            except BursarClientError as exc:  # the Acquire call reports the broker's state
                log.debug("reading the queue for request key %s failed: %s", key, exc)
                continue
            if not found or found[0].same_wait(last):
                continue
            last = found[0]
            try:
                out = on_queued(last)
                if inspect.isawaitable(out):
                    await out
            except Exception:
                log.exception("on_queued callback failed")

    async def _acquire_call(
        self, request: pb.AcquireRequest, wait: float
    ) -> tuple[Lease, pb.AcquireResponse]:
        t0 = self.clock.now()

        def attempt() -> tuple[pb.AcquireRequest, float]:
            # A retry waits only for what is left of the timeout (0: answer at once).
            request.timeout_s = max(0.0, wait - (self.clock.now() - t0)) if wait else 0.0
            return request, request.timeout_s + self._conn.call_timeout_s

        # Retrying an Acquire that failed UNAVAILABLE is safe: every attempt carries the
        # same idempotency key, so a grant whose reply was lost is returned to the retry
        # instead of a second lease; the broker withdraws a request whose call is cancelled
        # or cut (freeing its key), refuses new ones while it shuts down, and withdraws, on
        # restart, the requests that were queued when it stopped.
        resp = await self._call("Acquire", attempt)
        return Lease.from_proto(resp.lease), resp

    def _acquire_request(
        self,
        size: Mapping[str, float],
        duration_s: float,
        timeout_s: float,
        lease_class: LeaseClass | str | None,
        labels: Mapping[str, str] | None,
        idempotency_key: str = "",
        shape: pb.Shape | None = None,
        intent: pb.Intent | None = None,
    ) -> pb.AcquireRequest:
        """The wire's AcquireRequest, for Acquire and for WhatIf alike."""
        return pb.AcquireRequest(
            campaign=self.campaign or "",
            size=dict(size),
            duration_s=duration_s,
            timeout_s=timeout_s,
            lease_class=LeaseClass.parse(lease_class).to_proto(pb.LeaseClass),
            labels=dict(labels or {}),
            idempotency_key=idempotency_key,
            shape=shape,
            intent=intent,
        )

    async def whatif_acquire(
        self,
        size: Mapping[str, float],
        duration_s: float,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        lease_class: LeaseClass | str | None = None,
        labels: Mapping[str, str] | None = None,
        shape: Shape | None = None,
        nodes: int | None = None,
        per_node: Mapping[str, float] | None = None,
        exclusive: bool = False,
        cpus_per_gpu: float | None = None,
        mem_per_gpu: float | None = None,
        intent: Intent | None = None,
    ) -> WhatIfResult:
        """What :meth:`acquire` with these arguments would get if it arrived now, decided
        by the broker on a copy of its state: nothing is requested, held or journaled.

        ``outcome`` is GRANT (``lease``: the lease it would be), QUEUE (a blocking
        request: ``reason`` and ``estimated_wait_s``) or REJECT (``blocking=False``:
        ``reason``, and the retry-after in ``estimated_wait_s``); ``decisions``: every
        decision the request would cause, its campaign's only for a campaign token.
        Nothing waits: ``timeout`` (sent as ``timeout_s``, as in acquire) only makes the
        request a blocking one.
        Bad arguments raise as :meth:`acquire` would. The answer holds for now only: the
        next request, or the clock, may change it."""
        wire = shape_to_proto(shape, nodes, per_node, exclusive, cpus_per_gpu, mem_per_gpu)
        request = self._acquire_request(
            size,
            duration_s,
            _wait(blocking, timeout),
            lease_class,
            labels,
            shape=wire,
            intent=None if intent is None else intent.to_proto(),
        )
        resp = await self._call("WhatIf", pb.WhatIfRequest(acquire=request))
        return WhatIfResult.from_proto(resp)

    async def whatif_envelope(self, spec: CampaignSpec) -> WhatIfResult:
        """What replacing campaign ``spec.name``'s spec with ``spec`` would do now (the
        admin token only): ``outcome`` CAMPAIGN and every decision it would cause
        (queued requests granted, leases reclaimed). Nothing is changed. See
        :meth:`AsyncAdminClient.update_campaign`."""
        return await _whatif_envelope(self._conn, spec)

    async def renew(self, lease_id: str, duration_s: float) -> Lease:
        """Extend the lease so that it ends no earlier than now + ``duration_s``.

        Renewal is an admission decision: :class:`Refused` (ABOVE_BURST, BUCKET_EMPTY),
        :class:`FailedPrecondition` (LEASE_PREEMPTING, or the lease has ended)."""
        return await self._renew(lease_id, duration_s)

    async def _renew(
        self, lease_id: str, duration_s: float, give_up_at: float | None = None
    ) -> Lease:
        resp = await self._call(
            "Renew",
            pb.RenewRequest(lease_id=lease_id, duration_s=duration_s),
            give_up_at=give_up_at,
        )
        return Lease.from_proto(resp.lease)

    async def release(self, lease_id: str) -> Lease:
        """End the lease early (unused prepaid tokens and credits are refunded) and
        return it in its final state. Idempotent: releasing an ended lease returns its
        final state (RELEASED, EXPIRED or REVOKED) and changes nothing."""
        return (await self._release(lease_id))[0]

    async def _release(self, lease_id: str) -> tuple[Lease, bool]:
        """The lease in its final state, and whether it had ended before this call."""
        resp = await self._call("Release", pb.ReleaseRequest(lease_id=lease_id))
        return Lease.from_proto(resp.lease), resp.already_ended

    async def get_lease(self, lease_id: str) -> Lease:
        """One lease, live or ended; :class:`NotFound` if the broker never granted it."""
        return Lease.from_proto(await self._call("GetLease", pb.GetLeaseRequest(lease_id=lease_id)))

    async def list_leases(self, campaign: str | None = None) -> list[Lease]:
        """The live leases (STARTING, ACTIVE, PREEMPTING) of the caller's campaign,
        oldest first; with the admin token, every campaign's or ``campaign``'s."""
        resp = await self._call(
            "ListLeases", pb.ListLeasesRequest(campaign=campaign or self.campaign or "")
        )
        return [Lease.from_proto(m) for m in resp.leases]

    async def list_pending(
        self,
        campaign: str | None = None,
        *,
        request_id: str = "",
        idempotency_key: str = "",
    ) -> list[PendingRequest]:
        """The requests waiting in the queue, in admission order, each with why it waits,
        its expected wait, its place and its reservation: the caller's campaign's; with
        the admin token, every campaign's or ``campaign``'s. ``request_id`` or
        ``idempotency_key`` pick one request."""
        resp = await self._call(
            "ListPending",
            pb.ListPendingRequest(
                campaign=campaign or self.campaign or "",
                request_id=request_id,
                idempotency_key=idempotency_key,
            ),
        )
        return [PendingRequest.from_proto(m) for m in resp.requests]

    def held_lease(
        self,
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
    ) -> LeaseHandle:
        """A lease held for the life of an ``async with`` block: acquired on entry,
        renewed ``renew_margin_s`` before it would expire (default: half its duration,
        at most 60 s), watched (preemption warnings set ``handle.preempted`` and call
        ``on_preempt``, which may be a coroutine function), and released on exit,
        also when the block raises. ``shape``, ``intent`` (``size`` then ``{}``) and
        ``timeout`` (the proto's ``timeout_s``), ``on_queued`` and ``queued_poll_s`` as in
        :meth:`acquire`;
        an elastic lease's RESIZE_WARNING and RESIZED events reach the handle's
        listeners. See :class:`LeaseHandle`."""
        return LeaseHandle(
            self,
            dict(size),
            duration_s,
            renew_margin_s=renew_margin_s,
            on_preempt=on_preempt,
            blocking=blocking,
            timeout=timeout,
            lease_class=lease_class,
            labels=labels,
            shape=shape,
            intent=intent,
            on_queued=on_queued,
            queued_poll_s=queued_poll_s,
        )

    def adopted_lease(
        self,
        lease_id: str,
        duration_s: float,
        *,
        renew_margin_s: float | None = None,
        on_preempt: Callable[[LeaseEvent], Any] | None = None,
    ) -> LeaseHandle:
        """A lease this client did not acquire (granted to a process of the caller's
        campaign that is gone, e.g. a restarted autoscaler's predecessor), taken over
        without acquiring a new one: entering the handle reads the lease (GetLease) and,
        unless it is being reclaimed, renews it for ``duration_s`` (Renew); from then on
        it is held like one from :meth:`held_lease`: renewed, watched, released on
        exit. Entering raises :class:`NotFound`, :class:`FailedPrecondition` (it ended:
        ``LEASE_ENDED``) or :class:`Refused` (its renewal was refused) when it cannot
        be held; nothing is held then. A PREEMPTING lease is held as preempted
        (``handle.preempted`` set; revoked at its deadline)."""
        return LeaseHandle(
            self,
            {},
            duration_s,
            renew_margin_s=renew_margin_s,
            on_preempt=on_preempt,
            adopt=lease_id,
        )

    # ---------------------------------------------------------------- watch

    def watch(
        self,
        lease_id: str | Iterable[str] | None = None,
        *,
        reconnect: bool = True,
    ) -> AsyncIterator[LeaseEvent]:
        """What happens to leases, as it is decided: an async iterator of
        :class:`LeaseEvent`.

        ``lease_id`` (one id or several): those leases; the iterator ends once all of
        them have ended. None: every lease of the caller's campaign (the admin's: every
        campaign's, or ``campaign``'s), including later ones; it runs until closed
        (``break``, or ``aclose()``). The stream opens when iteration starts, with one
        snapshot event per matching lease (``snapshot=True``). If the stream drops (UNAVAILABLE: the broker
        restarted, the network failed) and ``reconnect`` is true, it is reopened with
        backoff and resumes: only what changed meanwhile is reported (as snapshot
        events), including the ends of leases that ended while it was away.
        """
        return self._watch(_ids(lease_id), reconnect, self._conn.retry_timeout_s)

    async def _watch(
        self,
        ids: list[str],
        reconnect: bool,
        give_up_s: float | None,
        on_open: Callable[[], None] | None = None,
    ) -> AsyncIterator[LeaseEvent]:
        conn = self._conn
        request = pb.WatchRequest(lease_ids=ids, campaign=self.campaign or "")
        delays, give_up_at = None, 0.0
        while True:
            call = conn.broker.Watch(request, metadata=conn.metadata)
            try:
                # The server sends the headers once the stream is registered: from here
                # on, no decision is missed. They say where in the journal the stream's
                # live events begin, so that a stream lost before any event resumes there.
                headers = await call.initial_metadata()
                delays = None  # (re)connected: a later drop starts a fresh backoff
                resume = dict(headers or ()).get(_RESUME_METADATA)
                if resume is not None and not request.from_seq:
                    request.from_seq, request.from_index = int(resume), 0
                if on_open is not None:
                    on_open()
                async for msg in call:
                    if msg.seq:
                        # Resume after this event: the journal replays exactly what follows.
                        request.from_seq, request.from_index = msg.seq, msg.index + 1
                    yield LeaseEvent.from_proto(msg)
                return  # every watched lease has ended
            except grpc.aio.AioRpcError as err:
                exc: BursarClientError = from_rpc_error(err)
            finally:
                call.cancel()
            if isinstance(exc, OutOfRange) and request.from_seq:
                # The broker's journal no longer reaches back to where this stream left
                # off (or it was reset): reopen with a snapshot of the leases' state.
                log.warning("Watch on %s: cannot resume (%s); reopening", conn.target, exc)
                request.from_seq, request.from_index = 0, 0
                continue
            if not (reconnect and retryable(exc)):
                raise exc
            if delays is None:
                delays, give_up_at = conn.backoff.delays(conn.rng), conn.deadline(give_up_s)
            await conn.pause(exc, delays, give_up_at, f"Watch on {conn.target}")

    # ---------------------------------------------------------------- supply, meter

    async def supply(self, units: float = 0.0, dim: str = "gpu") -> Supply:
        """Supply signals now. With ``units`` > 0, ``time_to`` says how soon that many
        units of ``dim`` are usable on each path."""
        return Supply.from_proto(
            await self._call("GetSupply", pb.SupplyRequest(units=units, dim=dim if units else ""))
        )

    def watch_supply(
        self,
        *,
        min_interval_s: float = 1.0,
        max_interval_s: float = 30.0,
        units: float = 0.0,
        dim: str = "gpu",
        reconnect: bool = True,
    ) -> AsyncIterator[Supply]:
        """Supply signals as they change: one snapshot at once, then one whenever a
        decision changed the pool, at most every ``min_interval_s`` and at least every
        ``max_interval_s``. Reopened with backoff if it drops (``reconnect``)."""
        request = pb.WatchSupplyRequest(
            min_interval_s=min_interval_s,
            max_interval_s=max_interval_s,
            units=units,
            dim=dim if units else "",
        )
        return self._watch_supply(request, reconnect)

    async def _watch_supply(
        self, request: pb.WatchSupplyRequest, reconnect: bool
    ) -> AsyncIterator[Supply]:
        conn = self._conn
        delays, give_up_at = None, 0.0
        while True:
            call = conn.broker.WatchSupply(request, metadata=conn.metadata)
            try:
                async for msg in call:
                    delays = None
                    yield Supply.from_proto(msg)
                return
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err)
            finally:
                call.cancel()
            if not (reconnect and retryable(exc)):
                raise exc
            if delays is None:
                delays, give_up_at = (
                    conn.backoff.delays(conn.rng),
                    conn.deadline(conn.retry_timeout_s),
                )
            await conn.pause(exc, delays, give_up_at, f"WatchSupply on {conn.target}")

    async def meter(self, dim: str, amount: float) -> MeterResult:
        """Consume ``amount`` of a rate dimension ("fs_bw": MB, "inference": tokens):
        use ``granted`` now, ask for the rest after ``wait_s``. Never refused for lack
        of tokens (``granted`` may be 0)."""
        resp = await self._call(
            "Meter", pb.MeterRequest(campaign=self.campaign or "", dim=dim, amount=amount)
        )
        return MeterResult(resp.requested, resp.granted, resp.wait_s)

    async def status(self) -> BrokerStatus:
        """The broker's state in a few numbers, and who it thinks the caller is."""
        return BrokerStatus.from_proto(await self._call("GetStatus", pb.GetStatusRequest()))

    async def list_decisions(
        self,
        *,
        lease_id: str = "",
        kinds: Sequence[DecisionKind] = (),
        campaign: str | None = None,
        limit: int = 1000,
    ) -> list[DecisionRecord]:
        """Journaled decisions, oldest first: about ``lease_id`` (a lease or a request),
        of these ``kinds``, of ``campaign`` (a campaign token sees its own campaign's
        only); at most ``limit`` (the broker reads a bounded number of journal entries
        per call: this pages on until it has them or the journal ends)."""
        out: list[DecisionRecord] = []
        start = 0
        while len(out) < limit:
            resp = await self._call(
                "ListDecisions",
                pb.ListDecisionsRequest(
                    start_seq=start,
                    campaign=campaign or self.campaign or "",
                    kinds=[k.to_proto() for k in kinds],
                    lease_id=lease_id,
                    limit=min(1000, limit - len(out)),
                ),
            )
            out.extend(DecisionRecord.from_proto(m) for m in resp.decisions)
            if not resp.next_seq:
                break
            start = resp.next_seq
        return out


class AsyncAdminClient:
    """An async client of the ``bursar.v1.Admin`` service (the admin token only):
    campaigns and their tokens. Options as for :class:`AsyncBrokerClient`."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        admin_token: str | None = None,
        *,
        tls: Tls = None,
        backoff: Backoff | None = None,
        rng: random.Random | int | None = None,
        retry_timeout_s: float | None = 30.0,
        call_timeout_s: float = 30.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        clock: Clock = SYSTEM,
    ) -> None:
        self._conn = Connection(
            target,
            admin_token,
            tls=tls,
            backoff=backoff,
            rng=rng,
            retry_timeout_s=retry_timeout_s,
            call_timeout_s=call_timeout_s,
            channel_options=channel_options,
            clock=clock,
        )

    @property
    def target(self) -> str:
        return self._conn.target

    async def __aenter__(self) -> AsyncAdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._conn.close()

    async def _call(self, method: str, request: Any, *, retry: bool = True) -> Any:
        return await self._conn.unary("admin", method, request, retry=retry)

    async def create_campaign(self, spec: CampaignSpec) -> CreatedCampaign:
        """Create a campaign; its token is returned once, here. :class:`AlreadyExists`
        if the name is taken, :class:`FailedPrecondition` if the guarantees would add up
        to more than the pool. Not retried (a retry after a lost answer would find the
        campaign created and its token gone): on :class:`Unavailable`, check with
        :meth:`get_campaign` and :meth:`rotate_token`."""
        resp = await self._call(
            "CreateCampaign", admin_pb2.CreateCampaignRequest(spec=spec.to_proto()), retry=False
        )
        return CreatedCampaign(Campaign.from_proto(resp.campaign), resp.token)

    async def update_campaign(self, spec: CampaignSpec) -> Campaign:
        """Replace a campaign's envelopes, class and preemptible flag (its leases stay).
        :meth:`whatif_envelope` says first what it would do."""
        return Campaign.from_proto(
            await self._call(
                "UpdateCampaign", admin_pb2.UpdateCampaignRequest(spec=spec.to_proto())
            )
        )

    async def whatif_envelope(self, spec: CampaignSpec) -> WhatIfResult:
        """What :meth:`update_campaign` with ``spec`` would do now, decided on a copy of
        the broker's state (nothing changes): ``outcome`` CAMPAIGN, and every decision it
        would cause (queued requests granted, leases warned and reclaimed).
        :class:`NotFound` for an unknown campaign, as update_campaign."""
        return await _whatif_envelope(self._conn, spec)

    async def get_campaign(self, name: str) -> Campaign:
        return Campaign.from_proto(
            await self._call("GetCampaign", admin_pb2.GetCampaignRequest(name=name))
        )

    async def list_campaigns(self) -> list[Campaign]:
        resp = await self._call("ListCampaigns", admin_pb2.ListCampaignsRequest())
        return [Campaign.from_proto(m) for m in resp.campaigns]

    async def rotate_token(self, campaign: str) -> str:
        """Issue a new token for ``campaign``; the old one stops working at once. Not
        retried (a lost answer would leave no working token known: rotate again)."""
        resp = await self._call(
            "RotateToken", admin_pb2.RotateTokenRequest(campaign=campaign), retry=False
        )
        return resp.token

    async def revoke_lease(self, lease_id: str, reason: str) -> Lease:
        """End a live lease at once, as a revocation with the cause "revoked by an
        administrator: <reason>" (its holder's watch reports it). :class:`NotFound` for an
        unknown lease, :class:`FailedPrecondition` if it has already ended. Not retried: a
        retry after a lost answer would find the lease ended (check with ``get_lease``)."""
        resp = await self._call(
            "RevokeLease",
            admin_pb2.RevokeLeaseRequest(lease_id=lease_id, reason=reason),
            retry=False,
        )
        return Lease.from_proto(resp)

    async def apply_policy(
        self, *, spec_json: str | None = None, toml: str | None = None, dry_run: bool = False
    ) -> PolicyApplied:
        """Put a new policy in force (one of ``spec_json``: every setting in the journal's
        spelling, or ``toml``: a ``[policy]`` table whose settings change, the others kept).
        With ``dry_run`` the broker only answers the diff. :class:`InvalidArgument` names
        the setting refused and what is allowed. Retried: applying the same policy twice
        changes nothing the second time."""
        if (spec_json is None) == (toml is None):
            raise ValueError("give exactly one of spec_json and toml")
        req = (
            admin_pb2.ApplyPolicyRequest(spec_json=spec_json, dry_run=dry_run)
            if spec_json is not None
            else admin_pb2.ApplyPolicyRequest(toml=toml, dry_run=dry_run)
        )
        return PolicyApplied.from_proto(await self._call("ApplyPolicy", req))

    async def get_policy(self) -> PolicyState:
        """The policy in force and the journal entry of its last change."""
        return PolicyState.from_proto(await self._call("GetPolicy", admin_pb2.GetPolicyRequest()))
