"""One connection to a broker: the grpc.aio channel, the bearer token, and unary calls
retried with backoff while the broker is unreachable.

A call is retried when it fails with UNAVAILABLE (the broker is down, restarting, or
shutting down: ``SHUTTING_DOWN`` says the request was withdrawn, nothing is left
pending) or with RESOURCE_EXHAUSTED ``RATE_LIMITED`` (the service's per-client rate
limit; waited out for its RetryInfo delay). Every other status is raised at once, as a
typed :class:`~bursar.providers.client.BursarClientError`.

The channel is created on first use, inside the event loop that uses it (grpc.aio
channels belong to one loop), with gRPC's own reconnect backoff set to the same bounds
as the client's, so that a restarted broker is found again within ``Backoff.max_s``.

Several brokers on one shared journal (one leads, the others stand by): the target is
their addresses, comma-separated (``"a:50051,b:50051"``). Calls go to one at a time; an
UNAVAILABLE answer moves the connection to the leader a standby names (its message says
"the leader is at ADDRESS"), or else to the next address, and the call is retried there
with the usual backoff. Each address keeps its own channel, so that moving never cancels
the calls and streams still open on another.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from bursar.broker.clock import SYSTEM, Clock
from bursar.protos.bursar.v1 import admin_pb2_grpc
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg
from bursar.providers.client._backoff import Backoff
from bursar.providers.client._errors import BursarClientError, Refused, Unavailable, from_rpc_error
from bursar.providers.client._token import check_token

__all__ = ["DEFAULT_TARGET", "Connection", "Tls", "channel_credentials", "retryable"]

log = logging.getLogger("bursar.providers.client")

DEFAULT_TARGET = "127.0.0.1:50051"
"""Where ``bursar serve`` listens by default."""

MOVE_MIN_S = 0.5
"""Seconds after moving to another broker before an unreachable one moves the connection
again (see :meth:`Connection.follow`)."""

Tls: TypeAlias = bool | bytes | str | os.PathLike[str] | grpc.ChannelCredentials | None
"""How to secure the channel: None or False: plaintext (loopback); True: TLS with the
system's root certificates; bytes: PEM root certificates; a str or path: a PEM file of
root certificates; or ready-made ``grpc.ChannelCredentials``."""


def channel_credentials(tls: Tls) -> grpc.ChannelCredentials | None:
    if tls is None or tls is False:
        return None
    if tls is True:
        return grpc.ssl_channel_credentials()
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if isinstance(tls, bytes):
        return grpc.ssl_channel_credentials(root_certificates=tls)
    return grpc.ssl_channel_credentials(root_certificates=Path(tls).read_bytes())


def retryable(exc: BursarClientError) -> bool:
    """Whether waiting and calling again is the right answer to ``exc``."""
    return isinstance(exc, Unavailable) or (
        isinstance(exc, Refused) and exc.reason == "RATE_LIMITED"
    )


def _rng(rng: random.Random | int | None) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


class Connection:
    """The channel, credentials and retry policy shared by one client's calls.

    Retry deadlines and the pauses between attempts are on ``clock``: with a manual clock
    a test decides when the next attempt is made. A call's own gRPC deadline stays in
    real seconds (it bounds the network, not the protocol).
    """

    def __init__(
        self,
        target: str,
        token: str | None,
        *,
        tls: Tls = None,
        backoff: Backoff | None = None,
        rng: random.Random | int | None = None,
        retry_timeout_s: float | None = 30.0,
        call_timeout_s: float = 30.0,
        channel_options: Sequence[tuple[str, Any]] = (),
        clock: Clock = SYSTEM,
    ) -> None:
        self.targets = tuple(t.strip() for t in target.split(",") if t.strip())
        """The brokers' addresses (one, or those sharing one journal)."""
        if not self.targets:
            raise ValueError(f"no broker address in target {target!r}")
        self._current = 0
        self._moved_at = -math.inf
        self.clock = clock
        self.backoff = backoff or Backoff()
        self.rng = _rng(rng)
        self.retry_timeout_s = retry_timeout_s
        self.call_timeout_s = call_timeout_s
        self._told: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        """Per retry sequence (its delays iterator), the failure last logged at INFO: a
        broker that stays down is one line, not one per try."""
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {check_token(token)}"),) if token else ()
        )
        self._credentials = channel_credentials(tls)
        self._options = [
            ("grpc.initial_reconnect_backoff_ms", max(1, int(self.backoff.initial_s * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(self.backoff.max_s * 1000))),
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            *channel_options,
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broker: pbg.BrokerStub | None = None
        self._admin: admin_pb2_grpc.AdminStub | None = None
        self._stubs_for = ""
        self._closed = False

    @property
    def target(self) -> str:
        """The address calls go to now."""
        return self.targets[self._current]

    def follow(self, exc: BursarClientError) -> None:
        """After a retryable failure: move to the leader a standby named, or (the broker
        unreachable) to the next address. Several calls failing together move once: a
        move within ``MOVE_MIN_S`` of the last is not repeated unless a standby names
        the leader."""
        if len(self.targets) < 2 or not isinstance(exc, Unavailable):
            return
        named = str(exc).partition("the leader is at ")[2].split()
        leader = named[0].rstrip(".;,") if named else ""
        now = self.clock.now()
        if leader in self.targets:
            to = self.targets.index(leader)
        elif now - self._moved_at >= MOVE_MIN_S:
            to = (self._current + 1) % len(self.targets)
        else:
            return
        if to != self._current:
            log.info("moving from %s to %s (%s)", self.target, self.targets[to], exc)
            self._current = to
            self._moved_at = now

    # -------------------------------------------------------------------- channel

    def _ensure(self) -> grpc.aio.Channel:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise RuntimeError("the client is closed")
        if self._channels and self._loop is not loop:
            raise RuntimeError(
                "this client was first used on another event loop; create one client per "
                "loop (or use the sync BrokerClient, which owns its loop)"
            )
        target = self.target
        channel = self._channels.get(target)
        if channel is None:
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(target, options=self._options)
            else:
                channel = grpc.aio.secure_channel(target, self._credentials, options=self._options)
            self._channels[target] = channel
            self._loop = loop
        if self._stubs_for != target:
            self._broker = pbg.BrokerStub(channel)
            self._admin = admin_pb2_grpc.AdminStub(channel)
            self._stubs_for = target
        return channel

    @property
    def broker(self) -> pbg.BrokerStub:
        self._ensure()
        assert self._broker is not None
        return self._broker

    @property
    def admin(self) -> admin_pb2_grpc.AdminStub:
        self._ensure()
        assert self._admin is not None
        return self._admin

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = self._channels, {}
        self._broker = self._admin = None
        self._stubs_for = ""
        for channel in channels.values():
            await channel.close()

    # -------------------------------------------------------------------- calls

    def deadline(self, timeout_s: float | None) -> float:
        """The clock's time ``timeout_s`` from now (None: never)."""
        return math.inf if timeout_s is None else self.clock.now() + timeout_s

    async def pause(
        self, exc: BursarClientError, delays: Any, give_up_at: float, what: str
    ) -> None:
        """Sleep before the next attempt, or raise ``exc`` if that would pass
        ``give_up_at``."""
        delay = next(delays)
        if exc.retry_after is not None and math.isfinite(exc.retry_after):
            # Never sooner than the broker asked: a retry before its retry_after would be
            # refused again (RATE_LIMITED) and spend its rate limit for nothing.
            delay = max(delay, exc.retry_after)
        now = self.clock.now()
        if now + delay > give_up_at:
            raise exc
        self.follow(exc)
        state = f"{exc.code.name} {exc.reason}"
        if self._told.get(delays) != state:
            self._told[delays] = state
            log.info(
                "%s: %s; retrying with backoff (up to %g s apart)", what, exc, self.backoff.max_s
            )
        else:
            log.debug("%s: %s; retrying in %.2f s", what, exc, delay)
        await self.clock.sleep_until(now + delay)

    async def unary(
        self,
        stub: str,
        method: str,
        request: Any,
        *,
        timeout_s: float | None = None,
        retry: bool = True,
        give_up_at: float | None = None,
    ) -> Any:
        """Call ``stub.method(request)``; retry while :func:`retryable`; raise typed.

        ``request`` may be a function returning ``(request, timeout_s)`` for each
        attempt (a blocking Acquire waits only for what is left of its timeout)."""
        deadline = self.deadline(self.retry_timeout_s) if give_up_at is None else give_up_at
        delays = self.backoff.delays(self.rng)
        while True:
            fn = getattr(self.broker if stub == "broker" else self.admin, method)
            message, timeout = request() if callable(request) else (request, timeout_s)
            try:
                return await fn(
                    message,
                    metadata=self._metadata,
                    timeout=self.call_timeout_s if timeout is None else timeout,
                )
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err)
            if not (retry and retryable(exc)):
                raise exc
            await self.pause(exc, delays, deadline, f"{method} to {self.target}")
