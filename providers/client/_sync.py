"""Synchronous facades, for hosts whose plugin APIs are synchronous (Parsl's providers,
Ray's ``NodeProvider``): :class:`BrokerClient`, :class:`AdminClient`,
:class:`SyncLeaseHandle`.

Each sync client owns a private event loop on a daemon thread and one async client on
that loop; every method submits the async client's coroutine there and waits for it.
So there is one implementation of retries, renewal and watch resumption, the sync
objects are safe to call from any number of threads at once, and nothing is both sync
and async. A sync client may not be called from its own
loop thread (from inside an ``on_preempt`` callback, say): that would deadlock, and it
raises RuntimeError instead.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, TypeVar

from bursar.broker.clock import SYSTEM, Clock
from bursar.providers.client._aio import AsyncAdminClient, AsyncBrokerClient
from bursar.providers.client._backoff import Backoff
from bursar.providers.client._channel import DEFAULT_TARGET, Tls
from bursar.providers.client._intent import Intent
from bursar.providers.client._lease import LeaseHandle
from bursar.providers.client._loop import LoopThread
from bursar.providers.client._policy import PolicyApplied, PolicyState
from bursar.providers.client._token import check_token
from bursar.providers.client._types import (
    BrokerStatus,
    Campaign,
    CampaignSpec,
    CreatedCampaign,
    Lease,
    LeaseClass,
    LeaseEvent,
    MeterResult,
    PendingRequest,
    Shape,
    Supply,
    WhatIfResult,
)

__all__ = ["AdminClient", "BrokerClient", "SyncLeaseHandle"]

T = TypeVar("T")


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


class _SyncClient:
    def __init__(self, name: str) -> None:
        self._loop = LoopThread(name, owner="a sync Bursar client")

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._loop.call(coro, timeout)

    def _iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    item = self._run(_anext(agen))
                except StopAsyncIteration:
                    return
                yield item
        finally:
            with contextlib.suppress(RuntimeError):
                self._run(agen.aclose())  # type: ignore[attr-defined]


class BrokerClient(_SyncClient):
    """The synchronous twin of :class:`AsyncBrokerClient`: the same constructor, methods
    and errors, blocking the calling thread; iterators instead of async iterators, and
    :class:`SyncLeaseHandle` for :meth:`held_lease`. Close it (or use ``with``) to stop
    its loop thread::

        with BrokerClient("127.0.0.1:50051", token) as client:
            with client.held_lease({"gpu": 8}, 300) as h:
                h.active.wait()
                run_on(h.lease.nodes)
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
        if token:
            check_token(token)  # before the loop thread starts: a refusal leaves nothing behind
        super().__init__(f"bursar-client {target}")
        self._aio = AsyncBrokerClient(
            target,
            token,
            tls=tls,
            campaign=campaign,
            backoff=backoff,
            rng=rng,
            retry_timeout_s=retry_timeout_s,
            call_timeout_s=call_timeout_s,
            channel_options=channel_options,
            clock=clock,
        )

    @property
    def target(self) -> str:
        return self._aio.target

    @property
    def campaign(self) -> str | None:
        return self._aio.campaign

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel and stop the loop thread. Held leases' handles stop too
        (release them first; otherwise they expire)."""
        if not self._loop.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._run(self._aio.close())
            self._loop.close()

    def acquire(
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
        """See :meth:`AsyncBrokerClient.acquire`. ``on_queued`` is called on the client's
        event-loop thread: keep it short (log, set a status), or hand the update on."""
        return self._run(
            self._aio.acquire(
                size,
                duration_s,
                blocking=blocking,
                timeout=timeout,
                lease_class=lease_class,
                labels=labels,
                idempotency_key=idempotency_key,
                shape=shape,
                nodes=nodes,
                per_node=per_node,
                exclusive=exclusive,
                cpus_per_gpu=cpus_per_gpu,
                mem_per_gpu=mem_per_gpu,
                intent=intent,
                on_queued=on_queued,
                queued_poll_s=queued_poll_s,
            )
        )

    def whatif_acquire(
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
    ) -> WhatIfResult:
        """See :meth:`AsyncBrokerClient.whatif_acquire`."""
        return self._run(
            self._aio.whatif_acquire(
                size,
                duration_s,
                blocking=blocking,
                timeout=timeout,
                lease_class=lease_class,
                labels=labels,
                shape=shape,
                nodes=nodes,
                per_node=per_node,
                exclusive=exclusive,
                cpus_per_gpu=cpus_per_gpu,
                mem_per_gpu=mem_per_gpu,
            )
        )

    def whatif_envelope(self, spec: CampaignSpec) -> WhatIfResult:
        """See :meth:`AsyncBrokerClient.whatif_envelope` (the admin token only)."""
        return self._run(self._aio.whatif_envelope(spec))

    def renew(self, lease_id: str, duration_s: float) -> Lease:
        return self._run(self._aio.renew(lease_id, duration_s))

    def release(self, lease_id: str) -> Lease:
        return self._run(self._aio.release(lease_id))

    def get_lease(self, lease_id: str) -> Lease:
        return self._run(self._aio.get_lease(lease_id))

    def list_leases(self, campaign: str | None = None) -> list[Lease]:
        return self._run(self._aio.list_leases(campaign))

    def list_pending(
        self,
        campaign: str | None = None,
        *,
        request_id: str = "",
        idempotency_key: str = "",
    ) -> list[PendingRequest]:
        """See :meth:`AsyncBrokerClient.list_pending`."""
        return self._run(
            self._aio.list_pending(campaign, request_id=request_id, idempotency_key=idempotency_key)
        )

    def watch(
        self, lease_id: str | Iterable[str] | None = None, *, reconnect: bool = True
    ) -> Iterator[LeaseEvent]:
        """See :meth:`AsyncBrokerClient.watch`; a plain iterator (close it, or break out
        of the loop, to end the stream)."""
        return self._iterate(self._aio.watch(lease_id, reconnect=reconnect))

    def supply(self, units: float = 0.0, dim: str = "gpu") -> Supply:
        return self._run(self._aio.supply(units, dim))

    def watch_supply(
        self,
        *,
        min_interval_s: float = 1.0,
        max_interval_s: float = 30.0,
        units: float = 0.0,
        dim: str = "gpu",
        reconnect: bool = True,
    ) -> Iterator[Supply]:
        """See :meth:`AsyncBrokerClient.watch_supply`."""
        return self._iterate(
            self._aio.watch_supply(
                min_interval_s=min_interval_s,
                max_interval_s=max_interval_s,
                units=units,
                dim=dim,
                reconnect=reconnect,
            )
        )

    def meter(self, dim: str, amount: float) -> MeterResult:
        return self._run(self._aio.meter(dim, amount))

    def status(self) -> BrokerStatus:
        return self._run(self._aio.status())

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
    ) -> SyncLeaseHandle:
        """See :meth:`AsyncBrokerClient.held_lease`. ``on_preempt`` is called in a worker
        thread (never on the loop thread), so it may block and may call this client."""
        return SyncLeaseHandle(
            self,
            size,
            duration_s,
            renew_margin_s=renew_margin_s,
            on_preempt=on_preempt,
            blocking=blocking,
            timeout=timeout,
            lease_class=lease_class,
            labels=labels,
            shape=shape,
            intent=intent,
        )


class SyncLeaseHandle:
    """A lease held for the life of a ``with`` block (see :class:`LeaseHandle`): the
    renewal and watching run on the client's loop thread; ``active``, ``preempted`` and
    ``ended`` are ``threading.Event`` s, so a worker thread may wait on them."""

    def __init__(
        self,
        client: BrokerClient,
        size: Mapping[str, float],
        duration_s: float,
        *,
        on_preempt: Callable[[LeaseEvent], Any] | None = None,
        **kw: Any,
    ) -> None:
        self._client = client
        loop = client._loop.loop

        def in_thread(ev: LeaseEvent) -> Any:
            assert on_preempt is not None
            return loop.run_in_executor(None, on_preempt, ev)

        self._handle = LeaseHandle(
            client._aio,
            size,
            duration_s,
            on_preempt=in_thread if on_preempt is not None else None,
            **kw,
        )
        self.active = threading.Event()
        self.preempted = threading.Event()
        self.ended = threading.Event()
        self._handle.add_listener(self._mirror)

    def _mirror(self, h: LeaseHandle) -> None:
        for mine, theirs in (
            (self.active, h.active),
            (self.preempted, h.preempted),
            (self.ended, h.ended),
        ):
            if theirs.is_set():
                mine.set()

    @property
    def lease(self) -> Lease:
        return self._handle.lease

    @property
    def id(self) -> str:
        return self._handle.id

    @property
    def preempt_event(self) -> LeaseEvent | None:
        return self._handle.preempt_event

    @property
    def preempt_deadline(self) -> float | None:
        return self._handle.preempt_deadline

    @property
    def end_event(self) -> LeaseEvent | None:
        return self._handle.end_event

    @property
    def renewals(self) -> int:
        return self._handle.renewals

    @property
    def resize_warning(self) -> LeaseEvent | None:
        """An elastic lease's latest RESIZE_WARNING (``deadline``, ``resize_to``)."""
        return self._handle.resize_warning

    @property
    def warnings(self) -> int:
        return self._handle.warnings

    @property
    def resizes(self) -> int:
        """RESIZED events seen so far (``lease.size`` is the whole lease's)."""
        return self._handle.resizes

    @property
    def error(self) -> BaseException | None:
        return self._handle.error

    def __enter__(self) -> SyncLeaseHandle:
        self._client._run(self._handle.start())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client._run(self._handle.__aexit__(exc_type, exc, tb))

    def release(self) -> Lease:
        """Release now (idempotent); the block's exit then does nothing more."""
        return self._client._run(self._handle.release())


class AdminClient(_SyncClient):
    """The synchronous twin of :class:`AsyncAdminClient`."""

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
        if admin_token:
            check_token(
                admin_token
            )  # before the loop thread starts: a refusal leaves nothing behind
        super().__init__(f"bursar-admin {target}")
        self._aio = AsyncAdminClient(
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
        return self._aio.target

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._loop.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._run(self._aio.close())
            self._loop.close()

    def create_campaign(self, spec: CampaignSpec) -> CreatedCampaign:
        return self._run(self._aio.create_campaign(spec))

    def update_campaign(self, spec: CampaignSpec) -> Campaign:
        return self._run(self._aio.update_campaign(spec))

    def whatif_envelope(self, spec: CampaignSpec) -> WhatIfResult:
        """See :meth:`AsyncAdminClient.whatif_envelope`."""
        return self._run(self._aio.whatif_envelope(spec))

    def get_campaign(self, name: str) -> Campaign:
        return self._run(self._aio.get_campaign(name))

    def list_campaigns(self) -> list[Campaign]:
        return self._run(self._aio.list_campaigns())

    def rotate_token(self, campaign: str) -> str:
        return self._run(self._aio.rotate_token(campaign))

    def revoke_lease(self, lease_id: str, reason: str) -> Lease:
        return self._run(self._aio.revoke_lease(lease_id, reason))

    def apply_policy(
        self, *, spec_json: str | None = None, toml: str | None = None, dry_run: bool = False
    ) -> PolicyApplied:
        return self._run(self._aio.apply_policy(spec_json=spec_json, toml=toml, dry_run=dry_run))

    def get_policy(self) -> PolicyState:
        return self._run(self._aio.get_policy())
