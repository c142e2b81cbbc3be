"""Building, running and stopping the grpc.aio server.

``create_server(address, core)`` builds a server with the Broker and Admin services, the
standard health service and server reflection, and binds it (port 0: any free port),
returning ``(server, port)``; tests use it directly. ``running(settings)`` is the whole
life cycle as an async context manager: open the state directory, start the server,
the timer, metrics and journal-checkpoint tasks (in one ``asyncio.TaskGroup``) and the
metrics port; on exit, stop in order. ``serve(settings)`` runs until SIGTERM or SIGINT.

Stopping (SIGTERM): health turns NOT_SERVING, the server stops accepting calls, blocking
Acquires withdraw their queued requests and streams end (UNAVAILABLE, retry against the
restarted server), unary calls in flight get ``grace_s`` to finish, the background
tasks stop, and the journal is closed. Every decision was committed before it was
acknowledged, so nothing needs flushing; a restart on the same state directory replays
the journal and every lease is as it was (expiries that fell due while the server was
down are applied when it catches up).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import ipaddress
import logging
import shutil
import signal
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from bursar.broker.backends.base import PoolBackend
from bursar.broker.clock import SYSTEM, Clock, as_clock
from bursar.broker.config import Config, default_config
from bursar.broker.errors import JournalError
from bursar.broker.journal import JournalStore
from bursar.broker.runtime import Follower
from bursar.broker.service import stalls
from bursar.broker.service.auth import bearer_token, load_admin_token
from bursar.broker.service.core import ServiceCore
from bursar.broker.service.errors import Unauthenticated
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.metrics import Metrics
from bursar.broker.service.opening import version_string as core_version
from bursar.broker.service.servicer import (
    AdminServicer,
    BrokerServicer,
    generic_handler,
    status_message,
)
from bursar.broker.snapshot import EVERY
from bursar.protos.bursar.v1 import admin_pb2, broker_pb2

__all__ = ["Running", "Settings", "create_server", "is_loopback", "running", "serve"]

log = logging.getLogger(__name__)

SERVICE_NAMES = (
    broker_pb2.DESCRIPTOR.services_by_name["Broker"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name,
)


@dataclass(frozen=True)
class Settings:
    """What ``bursar serve`` is started with (see its --help)."""

    state_dir: Path
    config: Config | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int | None = 9464
    """None: no metrics port; 0: any free port."""
    dashboard_port: int | None = None
    """The live dashboard's port (``broker/dashboard``); None: none; 0: any free port.
    Off here, on in ``bursar serve``: tests and embedders start many servers at once."""
    admin_token_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_remote: bool = False
    durability: str = "normal"
    snapshot_every: int = EVERY
    """Journal entries between snapshots (0: none); see ``broker/snapshot.py``."""
    limits: LimitSettings = field(default_factory=LimitSettings)
    grace_s: float = 5.0
    """Seconds in-flight unary calls get to finish on shutdown."""
    max_message_bytes: int = 1 << 20
    """Largest request accepted (RESOURCE_EXHAUSTED beyond)."""
    backend: PoolBackend | None = None
    """The pool backend; None: the simulated pool of the config."""
    clock: Clock = SYSTEM
    """The service's clock (timers, lease times, rate limits); tests pass a ManualClock."""
    journal: str | None = None
    """A PostgreSQL journal (``postgresql://...``) shared with other brokers, instead of
    ``state_dir``'s SQLite file: this broker leads or stands by (see ``_stand_by``)."""
    advertise: str | None = None
    """The address other brokers name as this one's when it leads (default host:port)."""
    takeover: Takeover = field(default_factory=lambda: Takeover())


@dataclass(frozen=True)
class Takeover:
    """How brokers on one PostgreSQL journal hand the lead over (see ``docs/operators/
    standby.md``). A standby tries the lead every ``poll_s``; once it holds the lock (the
    last leader's session has ended) it bumps the epoch, so that nothing more of the last
    leader commits, then waits ``grace_s`` before it serves. A leader checks its lock
    session about every ``check_s / 2``, each check given ``check_s``: it stops answering
    at a check that fails, or once no check has succeeded for ``2 * check_s`` (one slow
    check on a busy machine is not a lost lead). So a leader cut off from the store stops
    within ``3.5 * check_s`` of losing its session; ``grace_s`` must exceed ``4 * check_s``.
    The takeover after a leader's death takes at most about ``bound_s``."""

    poll_s: float = 0.5
    grace_s: float = 2.0
    check_s: float = 0.4

    def __post_init__(self) -> None:
        if min(self.poll_s, self.check_s) <= 0:
            raise ValueError("takeover poll and check intervals must be positive")
        if self.grace_s <= 4 * self.check_s:
            raise ValueError(
                f"takeover grace ({self.grace_s:g} s) must exceed four times the leader's "
                f"check ({4 * self.check_s:g} s): a cut-off leader must have stopped before "
                "another serves"
            )

    @property
    def bound_s(self) -> float:
        """The longest a takeover takes once the last leader's lock is free: a poll, the
        grace, and a second for catching up and starting to serve."""
        return self.poll_s + self.grace_s + 1.0


class LostLead(JournalError):
    """This broker no longer holds the lead (its store session failed or was ended)."""


class _Gate(grpc.aio.ServerInterceptor):
    """While this broker is not the leader, every Broker and Admin call is answered
    UNAVAILABLE with the leader's address (message and ``bursar-leader`` trailing
    metadata), and health answers carry that address too. GetStatus with the admin token
    is the exception: an operator asking a standby sees its role, the leader and the lag
    (``standby_status``)."""

    def __init__(self) -> None:
        self.serving = False
        self.leader = ""
        self.topology: Any = None
        """The brokers on the journal as this standby's last poll read them."""
        self.standby_status: Callable[[str | None], broker_pb2.Status | None] | None = None
        """The Status this standby answers the bearer token given (None: not the admin's)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method = details.method
        if handler is None or self.serving or method.startswith("/grpc.reflection"):
            return handler
        if method.startswith("/grpc.health.v1.Health/Check"):
            return self._with_leader(handler)
        if method == "/bursar.v1.Broker/GetStatus" and self.standby_status is not None:
            return self._status(handler, self.standby_status)
        return self._refusing(handler)

    def _told(self) -> tuple[tuple[str, str], ...]:
        return (("bursar-leader", self.leader),)

    def _with_leader(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        inner = handler.unary_unary

        async def check(request: Any, context: grpc.aio.ServicerContext) -> Any:
            context.set_trailing_metadata(self._told())
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            check, handler.request_deserializer, handler.response_serializer
        )

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        where = f"; the leader is at {self.leader}" if self.leader else ""
        context.set_trailing_metadata(self._told())
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"this broker is a standby{where}")

    def _status(
        self,
        handler: grpc.RpcMethodHandler,
        answer: Callable[[str | None], broker_pb2.Status | None],
    ) -> grpc.RpcMethodHandler:
        async def status(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                got = answer(bearer_token(context.invocation_metadata()))
            except Unauthenticated:
                got = None
            if got is None:  # a campaign's call, or none: as every other call
                await self._refuse(context)
            context.set_trailing_metadata(self._told())
            return got

        return grpc.unary_unary_rpc_method_handler(
            status, handler.request_deserializer, handler.response_serializer
        )

    def _refusing(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        refuse = self._refuse

        if handler.unary_stream is not None:

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                await refuse(context)
                yield  # never reached: makes this an async generator, as streams are

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await refuse(context)

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )


class _LateCore:
    """Stands for the service core until this broker leads and opens it (the servicers are
    built with the server, before): every attribute is the core's once set."""

    def __init__(self) -> None:
        self.core: ServiceCore | None = None

    def __getattr__(self, name: str) -> Any:
        core = self.__dict__.get("core")
        if core is None:
            raise AttributeError(f"no service core yet (standby): {name}")
        return getattr(core, name)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def _port_free(host: str, port: int) -> OSError | None:
    """None if ``port`` on ``host`` can be bound now, else why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            return exc
    return None


def check_ports(settings: Settings) -> None:
    """Refuse to start, before anything is created, when a port to listen on is taken."""
    wanted = [(settings.port, "--port", "the gRPC port")]
    if settings.metrics_port is not None:
        wanted.append((settings.metrics_port, "--metrics-port", "the metrics port"))
    if settings.dashboard_port is not None:
        wanted.append((settings.dashboard_port, "--dashboard-port", "the dashboard port"))
    for port, flag, what in wanted:
        if port == 0:
            continue
        exc = _port_free(settings.host, port)
        if exc is not None:
            other = {
                "--metrics-port": " or --no-metrics",
                "--dashboard-port": " or --no-dashboard",
            }.get(flag, " (0 picks a free one)")
            raise ValueError(
                f"{what} {port} on {settings.host} cannot be bound ({exc.strerror or exc}): "
                f"pass {flag} with a free port{other}"
            )


def create_server(
    address: str,
    core: ServiceCore | _LateCore,
    *,
    credentials: grpc.ServerCredentials | None = None,
    max_message_bytes: int = 1 << 20,
    health_servicer: health.aio.HealthServicer | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server for ``core`` bound to ``address`` (port 0: any free port), not yet
    started; returns it and its port. ``health_servicer`` is the standard health service
    to register (a new one if None; set its statuses once started)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", 16 * max_message_bytes),
            # A second server on the same port must fail, not share the port.
            ("grpc.so_reuseport", 0),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ],
        interceptors=list(interceptors) or None,
    )
    broker_service = broker_pb2.DESCRIPTOR.services_by_name["Broker"]
    admin_service = admin_pb2.DESCRIPTOR.services_by_name["Admin"]
    server.add_generic_rpc_handlers(
        (
            generic_handler(BrokerServicer(core), broker_service),  # type: ignore[arg-type]
            generic_handler(AdminServicer(core), admin_service),  # type: ignore[arg-type]
        )
    )
    if health_servicer is None:
        health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    if credentials is not None:
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    return server, port


@dataclass(frozen=True)
class Running:
    """A started server: where it listens and the core behind it."""

    port: int
    metrics_port: int | None
    core: ServiceCore
    server: grpc.aio.Server
    address: str
    dashboard_port: int | None = None
    dashboard_url: str = ""


def _credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return grpc.ssl_server_credentials(
        [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())]
    )


def _ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The dashboard's TLS: the same certificate and key as the gRPC port's."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert, settings.tls_key)
    return context


@asynccontextmanager
async def running(
    settings: Settings, *, clock: Clock | Callable[[], float] | None = None
) -> AsyncIterator[Running]:
    """Start everything ``settings`` describes; stop it all, in order, on exit.

    ``clock`` overrides ``settings.clock`` (a bare ``() -> float`` is still accepted).
    """
    if not settings.allow_remote and not is_loopback(settings.host):
        raise ValueError(
            f"--host {settings.host} is not a loopback address; pass --allow-remote to serve "
            "other machines (with --tls-cert/--tls-key: tokens travel in the metadata)"
        )
    credentials = _credentials(settings)
    if settings.allow_remote and credentials is None and not is_loopback(settings.host):
        log.warning(
            "serving %s without TLS: bearer tokens cross the network in clear", settings.host
        )
    check_ports(settings)
    state = Path(settings.state_dir)
    # A start that fails leaves no state behind where there was none: no journal, no
    # tokens issued for a broker that never served.
    fresh = not state.exists() or not any(state.iterdir())
    the_clock = as_clock(settings.clock if clock is None else clock)

    def open_core(
        store: JournalStore | None = None, follower: Follower | None = None
    ) -> ServiceCore:
        return ServiceCore.open(
            settings.state_dir,
            settings.config,
            durability=settings.durability,
            snapshot_every=settings.snapshot_every,
            clock=the_clock,
            admin_token_file=settings.admin_token_file,
            limits=settings.limits,
            backend=settings.backend,
            store=store,
            follower=follower,
        )

    shared = settings.journal is not None
    advertise = settings.advertise or ""
    late = _LateCore()
    gate = _Gate() if shared else None
    store: Any = None
    core: ServiceCore | None = None if shared else open_core()
    started = False
    dashboard = None
    standby_page: Any = None
    standby_metrics: Metrics | None = None
    metrics_at = settings.metrics_port
    tls = credentials is not None
    dashboard_at = settings.dashboard_port
    health_servicer = health.aio.HealthServicer()
    server: grpc.aio.Server | None = None
    try:
        address = _address(settings.host, settings.port)
        server, port = create_server(
            address,
            core if core is not None else late,
            credentials=credentials,
            max_message_bytes=settings.max_message_bytes,
            health_servicer=health_servicer,
            interceptors=[gate] if gate is not None else (),
        )
        if core is None:
            assert settings.journal is not None and gate is not None
            state.mkdir(parents=True, exist_ok=True)
            store, follower = await asyncio.to_thread(_open_shared, settings)
            gate.standby_status = _standby_status(settings, follower, gate, the_clock)
            # A standby answers (NOT_SERVING, with the leader's address) while it follows.
            await server.start()
            started = True
            for name in ("", *SERVICE_NAMES):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            advertise = settings.advertise or _address(settings.host, port)
            own_dashboard = ""
            if settings.dashboard_port is not None:
                standby_page = await _standby_page(settings, gate)
                own_dashboard = _dashboard_url(advertise, standby_page.port, tls)
            if settings.metrics_port is not None:
                # A standby's own metrics (its role, the lag): the core's take the port later.
                standby_metrics = Metrics()
                metrics_at = _serve_metrics(standby_metrics, settings, settings.metrics_port)
            await _stand_by(
                store,
                follower,
                gate,
                advertise,
                settings.takeover,
                the_clock,
                own_dashboard,
                standby_metrics,
            )
            if standby_page is not None:
                # The real dashboard takes the same port.
                dashboard_at = standby_page.port
                await standby_page.stop()
            if standby_metrics is not None:
                standby_metrics.stop_http()
            gate.standby_status = None
            # On this thread: the token store's SQLite connection belongs to it.
            core = open_core(store, follower)
            # As a leader sees it (the standby's last read until the first lock check).
            core.topology = gate.topology
            with contextlib.suppress(JournalError):
                core.topology = await asyncio.to_thread(store.topology, the_clock.now())
            late.core = core
        if store is None:
            core.metrics.on_lead("single", 0)
        else:
            core.metrics.on_lead("leader", store.epoch or 0, took=True)
            _lag_metrics(core.metrics, core.topology)
        metrics_port = None
        if metrics_at is not None:
            metrics_port = _serve_metrics(core.metrics, settings, metrics_at)
        dashboard_port = None
        if settings.dashboard_port is not None:
            from bursar.broker.dashboard.server import Dashboard

            dashboard = Dashboard(core)
            try:
                dashboard_port = await dashboard.start(
                    settings.host, dashboard_at or 0, _ssl_context(settings)
                )
            except OSError as exc:
                raise ValueError(
                    f"the dashboard port {settings.dashboard_port} on {settings.host} cannot "
                    f"be bound ({exc.strerror or exc}): pass --dashboard-port with a free port "
                    "or --no-dashboard"
                ) from exc
        if not started:
            await server.start()
            started = True
        if gate is not None:
            gate.serving = True
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(core.run_timers(), name="bursar-timers")
            tg.create_task(core.run_metrics(), name="bursar-metrics")
            tg.create_task(core.run_checkpoints(), name="bursar-checkpoints")
            keeper = None
            if store is not None and gate is not None:
                shown = (
                    "" if dashboard_port is None else _dashboard_url(advertise, dashboard_port, tls)
                )
                keeper = tg.create_task(
                    _keep_lead(
                        store, gate, health_servicer, settings.takeover, core, advertise, shown
                    ),
                    name="bursar-lead",
                )
            probes = heartbeat = None
            if stalls.enabled():
                probes = stalls.StallLog()
                probes.install(core.runtime, core.metrics)
                heartbeat = tg.create_task(probes.run(), name="bursar-stall-log")
            try:
                url = ""
                if dashboard_port is not None:
                    scheme = "https" if credentials is not None else "http"
                    url = f"{scheme}://{_address(settings.host, dashboard_port)}/"
                yield Running(
                    port,
                    metrics_port,
                    core,
                    server,
                    _address(settings.host, port),
                    dashboard_port,
                    url,
                )
            finally:
                if dashboard is not None:
                    await dashboard.stop()
                await health_servicer.enter_graceful_shutdown()
                stopping = asyncio.ensure_future(server.stop(settings.grace_s))
                # Stop accepting first, then wake the waiters and streams so that they
                # withdraw and finish inside the grace period.
                await asyncio.sleep(0)
                core.begin_shutdown()
                await stopping
                core.stop_background()
                if keeper is not None:
                    keeper.cancel()
                if heartbeat is not None and probes is not None:
                    heartbeat.cancel()
                    probes.uninstall()
    finally:
        if standby_metrics is not None:
            standby_metrics.stop_http()  # a no-op once stopped
        if dashboard is not None:
            await dashboard.stop()  # a no-op once stopped; here for a start that failed
        if standby_page is not None:
            await standby_page.stop()  # a no-op once stopped
        if core is not None:
            core.close()
        elif server is not None and started:
            await server.stop(0)  # a standby stopped before it led
        if store is not None:
            store.close()
        if (not started or core is None) and fresh:
            shutil.rmtree(state, ignore_errors=True)


def _open_shared(settings: Settings) -> tuple[Any, Follower]:
    """Open the shared PostgreSQL journal (creating it from the config if the database
    holds none) and this broker's follower of it."""
    from bursar.broker.journal_pg import PgJournal

    assert settings.journal is not None
    config = settings.config
    if config is None and not PgJournal.holds_journal(settings.journal):
        config = default_config()
    store = PgJournal.open(
        settings.journal,
        config.pool if config is not None else None,
        config.policy if config is not None else None,
        durability=settings.durability,  # type: ignore[arg-type]
    )
    try:
        follower = Follower(store, Path(settings.state_dir))
        follower.follow()
    except BaseException:
        store.close()
        raise
    return store, follower


def _serve_metrics(metrics: Metrics, settings: Settings, port: int) -> int:
    """Serve ``metrics`` on ``port`` (0: a free one); the port, or a clear error."""
    try:
        return metrics.start_http(settings.host, port)
    except OSError as exc:
        raise ValueError(
            f"the metrics port {port} on {settings.host} cannot be bound "
            f"({exc.strerror or exc}): pass --metrics-port with a free port or --no-metrics"
        ) from exc


def _dashboard_url(advertise: str, port: int, tls: bool) -> str:
    """A broker's dashboard as other brokers' pages link it: its advertised host."""
    host = advertise.rpartition(":")[0] or advertise
    return f"{'https' if tls else 'http'}://{host}:{port}/"


async def _standby_page(settings: Settings, gate: _Gate) -> Any:
    """The page a standby's dashboard port shows: the leader, with a link to its dashboard."""
    from bursar.broker.dashboard.standby import StandbyPage

    def leader() -> tuple[str, str]:
        top = gate.topology
        return gate.leader, "" if top is None else top.leader_dashboard

    assert settings.dashboard_port is not None
    page = StandbyPage(leader)
    try:
        await page.start(settings.host, settings.dashboard_port, _ssl_context(settings))
    except OSError as exc:
        raise ValueError(
            f"the dashboard port {settings.dashboard_port} on {settings.host} cannot be bound "
            f"({exc.strerror or exc}): pass --dashboard-port with a free port or --no-dashboard"
        ) from exc
    return page


def _standby_status(
    settings: Settings, follower: Follower, gate: _Gate, clock: Clock
) -> Callable[[str | None], broker_pb2.Status | None]:
    """What a standby answers GetStatus with the admin token: its role, the engine it
    follows (as of the entries applied), and the brokers on the journal as its last poll
    read them."""
    admin, _, _ = load_admin_token(Path(settings.state_dir), settings.admin_token_file)
    started_at = clock.now()

    def answer(token: str | None) -> broker_pb2.Status | None:
        if token is None or not hmac.compare_digest(token.encode(), admin.encode()):
            return None
        return status_message(
            follower.engine,
            version=core_version(),
            now=max(clock.now(), follower.engine.now),
            started_at=started_at,
            journal_entries=follower.seq,
            open_streams=0,
            caller="admin",
            role="standby",
            topology=gate.topology,
        )

    return answer


async def _stand_by(
    store: Any,
    follower: Follower,
    gate: _Gate,
    advertise: str,
    takeover: Takeover,
    clock: Clock,
    dashboard: str = "",
    metrics: Metrics | None = None,
) -> None:
    """Follow the journal until this broker takes the lead, then wait out the grace
    (see :class:`Takeover`) and catch up with what the last leader committed. ``metrics``:
    the standby's own, kept up to date at every poll."""
    announced = ""
    while True:
        await asyncio.to_thread(follower.follow)
        await asyncio.to_thread(
            store.report, advertise, "standby", follower.seq, clock.now(), dashboard
        )
        # Read before the lead is tried, so that a broker that leads at once has one too.
        gate.topology = await asyncio.to_thread(store.topology, clock.now())
        if metrics is not None:
            metrics.on_lead("standby", gate.topology.epoch)
            _lag_metrics(metrics, gate.topology)
        epoch = await asyncio.to_thread(store.lead, advertise, clock.now())
        if epoch is not None:
            break
        gate.leader = gate.topology.leader
        if gate.leader != announced:
            announced = gate.leader
            log.warning(
                "standby: following the journal %s (entry %d); the leader is at %s",
                store.location,
                follower.seq,
                announced or "(none yet)",
            )
        await asyncio.sleep(takeover.poll_s)
    gate.leader = advertise
    log.warning("taking the lead (epoch %d) after %.1f s of grace", epoch, takeover.grace_s)
    await asyncio.sleep(takeover.grace_s)
    await asyncio.to_thread(follower.follow)


def _lag_metrics(metrics: Metrics, topology: Any) -> None:
    """The standbys' lag in ``metrics``, as the last read of the store says."""
    if topology is not None:
        metrics.on_topology(
            (p.address, p.lag_entries, p.lag_s) for p in topology.brokers if p.role == "standby"
        )


async def _keep_lead(
    store: Any,
    gate: _Gate,
    health_servicer: health.aio.HealthServicer,
    takeover: Takeover,
    core: ServiceCore,
    advertise: str,
    dashboard: str = "",
) -> None:
    """Check the lock session every ``check_s``; at the first check that fails or takes
    longer than ``check_s``, stop answering (the lock may pass to a standby) and raise.
    A leader whose journal writes failed for good (its other connection lost) gives the
    lead up the same way, instead of holding the lock while it can serve nothing."""
    last_ok = time.monotonic()
    while True:
        await asyncio.sleep(takeover.check_s / 2)
        now = core.now()

        def check(now: float = now) -> bool:
            held = bool(store.holds_lead())
            if held:
                with contextlib.suppress(JournalError):  # only what an operator reads
                    store.report(advertise, "leader", store.last_seq, now, dashboard)
                    core.topology = store.topology(now)
            return held

        try:
            # Off the event loop: a store cut off by the network may not answer at all.
            held: bool | None = await asyncio.wait_for(
                asyncio.to_thread(check), timeout=takeover.check_s
            )
        except TimeoutError:
            held = None  # no answer yet: lost only if none comes for 2 * check_s
        if held:
            last_ok = time.monotonic()
            _lag_metrics(core.metrics, core.topology)
        lost = (
            held is False
            or core.runtime.broken
            or time.monotonic() - last_ok > 2 * takeover.check_s
        )
        if lost:
            gate.serving = False
            gate.leader = ""
            for name in ("", *SERVICE_NAMES):
                await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
            raise LostLead(
                f"lost the lead: the session holding it on {store.location} failed; this "
                "broker stops serving (a standby takes over)"
            )


@asynccontextmanager
async def _lead_lost_unwrapped() -> AsyncIterator[None]:
    """A lost lead ends the server's task group: raise it as itself, not in a group."""
    try:
        yield
    except* LostLead as group:
        raise group.exceptions[0] from None


async def serve(settings: Settings, *, announce: Callable[[Running], None] | None = None) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with _lead_lost_unwrapped(), running(settings) as r:
            # Everything built so far (the engine's state replayed from the journal, the
            # modules) lives as long as the process: keep it out of the collector's full
            # passes, which otherwise walk all of it each time while every call waits (after
            # replaying 60,000 keyed Acquires, 0.3 s a pass). Only here, once per process:
            # tests start many servers in one process and must not pin theirs.
            gc.collect()
            gc.freeze()
            if announce is not None:
                announce(r)
            await stop.wait()
            log.info("signal received: stopping (grace %.1f s)", settings.grace_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
