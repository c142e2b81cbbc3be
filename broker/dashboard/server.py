"""The dashboard's web server: aiohttp on the service's own event loop.

It reads the broker only through the service core's read paths (the ones the RPCs use:
``list_leases``, ``supply_proto``'s conversion, ``list_decisions``, ``watch``,
``what_if_acquire``) and acts only through its admin paths (``revoke``,
``update_campaign``), so it never sees state an RPC could not.

Routes (every ``/api`` route wants ``Authorization: Bearer <token>`` or the session
cookie a one-time login link sets (``login``); the cookie is HttpOnly and SameSite=Strict,
a POST with it must come from this origin, and no route sends CORS headers but
``/api/role``, which takes no credentials, so another origin can neither call it with the
operator's credentials nor read its answers):

* ``GET /`` and ``/static/...``: the page and its assets (self-contained, no CDN).
  ``GET /?login=CODE`` trades a one-time code for the session cookie and redirects to
  ``/``; a wrong or used code gets 403 and no cookie.
* ``POST /api/login``: a fresh one-time login link for the caller (``bursar dashboard``
  asks with the admin token). ``POST /api/logout``: ends the cookie's session.
* ``GET /api/state``: every view at once (``views.state_view``), the pool-over-time
  series from the journal (``series``) among them.
* ``GET /api/lease/{id}``: one lease and its journal history.
* ``GET /api/events``: server-sent events. ``lease`` events are the Watch stream's lease
  events, each with id ``SEQ.INDEX`` (its journal position); ``state`` events carry the
  whole state after changes (at most one per ``STATE_INTERVAL_S``). A client that
  reconnects with ``Last-Event-ID`` gets every lease event after that position from the
  journal, then follows live, as Watch's ``from_seq``/``from_index`` would.
* ``GET /api/role`` (no token, readable from any origin): ``{"role", "leader",
  "dashboard"}``, where the lead is (``role_response``): a page whose broker
  stopped answering asks the journal's other brokers, and follows the leader.
* ``POST /api/whatif``: a WhatIf of an Acquire (``{"campaign", "size", "duration_s"}``).
* ``POST /api/revoke`` (admin): ``{"lease_id", "reason"}``, as Admin.RevokeLease.
* ``POST /api/pause`` (admin): ``{"campaign", "paused"}``. The engine has no pause: a
  pause sets the campaign's burst and guarantee to zero in every dimension through the
  campaign-update path (its leases keep running; new requests are refused, as above
  its burst), and a resume sets
  back the envelope it had when paused here (kept in this process only).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from bursar.broker.dashboard import series, views
from bursar.broker.dashboard.login import cookie_name, logins_of
from bursar.broker.decisions import Granted, Queued, Rejected
from bursar.broker.envelope import CampaignSpec, DimEnvelope
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.service import convert
from bursar.broker.service.auth import Principal, bearer_token
from bursar.broker.service.core import ServiceCore
from bursar.broker.service.errors import PermissionDenied, ServiceError, Unauthenticated
from bursar.protos.bursar.v1 import broker_pb2 as pb

__all__ = ["STATE_INTERVAL_S", "Dashboard"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).with_name("static")

STATE_INTERVAL_S = 0.25
"""Shortest time between two ``state`` events on one stream: a burst of decisions is
sent as one state, not one per decision. Lease events are not held back."""

FLUSH_S = 0.02
"""How long a stream holds a lease event for the ones that follow it, to send them in
one write (a page shows a grant this much later)."""

USABLE_INTERVAL_S = 2.0
"""How long a time-to-usable distribution is reused: it reads thousands of journal
decisions (tens of milliseconds with the loop waiting), and moves slowly."""

_BATCH = 256
"""Lease events sent in one write at most."""

_EVENT_CACHE = 512
"""Lease events kept encoded: every stream sends the same bytes for one event."""

_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}

_BAD_LINK = """<!doctype html><meta charset="utf-8"><title>Bursar: login link refused</title>
<p>This login link is not valid: it was used already, or it belongs to another broker or to
a run of this one that has stopped since. Get a fresh one with <code>bursar dashboard</code>
(it needs the admin token), or <a href="/">sign in</a> by pasting a token.</p>
"""

_HTTP_STATUS = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.FAILED_PRECONDITION: 409,
    ErrorCode.OUT_OF_RANGE: 416,
}


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(
        data, status=status, dumps=lambda x: json.dumps(x, allow_nan=False, default=str)
    )


def _error(exc: Exception) -> web.Response:
    if isinstance(exc, Unauthenticated):
        return _json({"error": str(exc), "reason": exc.reason}, 401)
    if isinstance(exc, PermissionDenied):
        return _json({"error": str(exc)}, 403)
    if isinstance(exc, RequestError):
        return _json({"error": str(exc), "field": exc.field}, _HTTP_STATUS.get(exc.code, 400))
    if isinstance(exc, ServiceError):
        return _json({"error": str(exc)}, 503)
    raise exc


def _sse(event: str, data: Any, ident: str = "") -> bytes:
    lines = [f"event: {event}"]
    if ident:
        lines.append(f"id: {ident}")
    lines.append("data: " + json.dumps(data, allow_nan=False, default=str))
    return ("\n".join(lines) + "\n\n").encode()


def parse_event_id(value: str) -> tuple[int, int]:
    """The journal position to resume after: ``SEQ.INDEX`` → (seq, index + 1); (0, 0):
    none (open with a fresh state)."""
    if not value:
        return 0, 0
    try:
        seq_text, _, index_text = value.partition(".")
        seq, index = int(seq_text), int(index_text or "-1")
    except ValueError:
        raise RequestError(
            ErrorCode.INVALID_ARGUMENT, "Last-Event-ID", f"not SEQ.INDEX: {value!r}"
        ) from None
    if seq < 1 or index < -1:
        raise RequestError(ErrorCode.INVALID_ARGUMENT, "Last-Event-ID", f"out of range: {value!r}")
    return seq, index + 1


def role_response(role: str, leader: str, dashboard: str) -> web.Response:
    """``GET /api/role``'s answer: readable from any origin (the pages of the journal's
    other brokers ask it), with no credentials and nothing but where the lead is."""
    body = {"role": role, "leader": leader, "dashboard": dashboard}
    return web.json_response(
        body, headers={"Access-Control-Allow-Origin": "*", "Cache-Control": "no-store"}
    )


async def listen(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port`` (0: a free port): its runner and the port bound."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host.strip("[]"), port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    server = site._server  # aiohttp keeps the asyncio server here; it knows the port
    assert server is not None
    return runner, int(server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


class Dashboard:
    """The dashboard of one service core; ``start`` binds it, ``stop`` closes it."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core
        self.series: series.Series | None = None
        self.logins = logins_of(core)
        self._cache: dict[str, tuple[float, dict[str, Any], bytes]] = {}
        self._encoded: dict[tuple[int, int], bytes] = {}
        self._usable: dict[str, tuple[float, dict[str, list[float]]]] = {}
        self._paused: dict[str, CampaignSpec] = {}
        self._streams: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        app = web.Application(client_max_size=64 * 1024)
        app.router.add_get("/", self._index)
        app.router.add_get("/favicon.ico", self._favicon)
        app.router.add_static("/static/", STATIC, show_index=False)
        app.router.add_post("/api/login", self._api(self._login))
        app.router.add_post("/api/logout", self._logout)
        app.router.add_get("/api/state", self._api(self._state))
        app.router.add_get("/api/lease/{lease_id}", self._api(self._lease))
        app.router.add_get("/api/events", self._events)
        app.router.add_get("/api/role", self._role)
        app.router.add_post("/api/whatif", self._api(self._whatif))
        app.router.add_post("/api/revoke", self._api(self._revoke, admin=True))
        app.router.add_post("/api/pause", self._api(self._pause, admin=True))
        self.app = app

    # ------------------------------------------------------------------ life cycle

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen on ``host:port`` (0: a free port); the port bound."""
        self._runner, self.port = await listen(self.app, host, port, ssl_context)
        # Before any call is served: the engine and the journal say the same.
        self.series = series.build(self.core)
        return self.port

    async def stop(self) -> None:
        """End the event streams (clients reconnect with Last-Event-ID), then close."""
        for task in list(self._streams):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ helpers

    @property
    def cookie(self) -> str:
        return cookie_name(self.port or 0)

    def _who(self, request: web.Request) -> Principal:
        header = request.headers.get("Authorization")
        if header is None and self.cookie in request.cookies:
            return self._session_who(request)
        token = bearer_token([("authorization", header)] if header is not None else [])
        return self.core.tokens.authenticate(token)

    def _session_who(self, request: web.Request) -> Principal:
        session = self.logins.session(request.cookies[self.cookie])
        if session is None:
            raise Unauthenticated(
                "UNKNOWN_SESSION",
                "this sign-in is not known to this broker (it restarted, or the cookie is "
                "another's): open a fresh login link (`bursar dashboard`) or paste a token",
            )
        self.core.check_token_generation(session.who.campaign, session.generation)
        # A cookie rides along with any request the browser sends: only this page's own
        # scripts may act with it (SameSite=Strict already keeps other sites' out).
        origin = request.headers.get("Origin")
        if request.method != "GET" and origin is not None and origin != self._origin(request):
            raise PermissionDenied(
                "CROSS_ORIGIN",
                f"a request from {origin} may not use this session",
                str(session.who),
            )
        return session.who

    def _origin(self, request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def _api(
        self,
        fn: Callable[[web.Request, Principal], Awaitable[Any]],
        *,
        admin: bool = False,
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            try:
                who = self._who(request)
                if admin:
                    who.require_admin(f"the dashboard's {request.path}")
                # Read committed state only, and answer only once what it shows is durable.
                await self.core.settled()
                out = await fn(request, who)
                await self.core.durable()
                return _json(out)
            except (ServiceError, RequestError) as exc:
                return _error(exc)

        return handler

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "(body)", "a JSON object is required")
        return body

    def state_for(self, who: Principal, *, fresh: bool = False) -> dict[str, Any]:
        """The state view for ``who``. A stream's periodic state is shared by that caller's
        streams for ``STATE_INTERVAL_S`` (ten open pages cost one build, not ten); it may
        then be older than lease events already sent, which the page re-applies (the view
        carries its journal position)."""
        key = str(who)
        now = time.monotonic()
        hit = self._cache.get(key)
        if not fresh and hit is not None and now - hit[0] < STATE_INTERVAL_S:
            return hit[1]
        if self.series is None:
            self.series = series.build(self.core)
        else:
            self.series.extend(self.core)
        usable = self._usable.get(key)
        if usable is None or now - usable[0] >= USABLE_INTERVAL_S:
            usable = (now, views.time_to_usable(self.core, who))
            self._usable[key] = usable
        view = views.state_view(self.core, who, self.series, usable[1])
        self._cache[key] = (now, view, _sse("state", view))
        return view

    def state_frame(self, who: Principal) -> bytes:
        """``state_for``'s view as an SSE frame, encoded once for the streams sharing it."""
        view = self.state_for(who)
        hit = self._cache[str(who)]
        return hit[2] if hit[1] is view else _sse("state", view)

    def _lease_event(self, ev: pb.LeaseEvent) -> bytes:
        """The SSE frame of a lease event, encoded once for every stream that sends it."""
        key = (ev.seq, ev.index)
        frame = self._encoded.get(key)
        if frame is None:
            frame = _sse("lease", views.message(ev), f"{ev.seq}.{ev.index}")
            if len(self._encoded) >= _EVENT_CACHE:
                self._encoded.pop(next(iter(self._encoded)))
            self._encoded[key] = frame
        return frame

    # ------------------------------------------------------------------ routes

    async def _index(self, request: web.Request) -> web.StreamResponse:
        code = request.query.get("login")
        if code is None:
            return web.FileResponse(STATIC / "index.html", headers=_NO_STORE)
        who = self.logins.take(code)
        if who is None:
            return web.Response(
                status=403, text=_BAD_LINK, content_type="text/html", headers=_NO_STORE
            )
        sid = self.logins.open(who, self.core.token_generation(who.campaign))
        resp = web.Response(status=303, headers={"Location": "/", **_NO_STORE})
        resp.set_cookie(
            self.cookie,
            sid,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.scheme == "https",
        )
        return resp

    async def _favicon(self, _request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "favicon.svg", headers={"Content-Type": "image/svg+xml"})

    async def _login(self, request: web.Request, who: Principal) -> dict[str, Any]:
        base = f"{self._origin(request)}/"
        return {"url": f"{base}?login={self.logins.code(who)}", "as": str(who)}

    async def _logout(self, request: web.Request) -> web.Response:
        sid = request.cookies.get(self.cookie)
        if sid is not None:
            self.logins.end(sid)
        resp = _json({"signed_out": sid is not None})
        resp.del_cookie(self.cookie, path="/")
        return resp

    async def _role(self, _request: web.Request) -> web.Response:
        top = self.core.topology
        if top is None:  # a broker alone on its journal (SQLite): it is the leader
            return role_response("leader", "", "")
        return role_response("leader", top.leader, top.leader_dashboard)

    async def _state(self, _request: web.Request, who: Principal) -> dict[str, Any]:
        return self.state_for(who, fresh=True)

    async def _lease(self, request: web.Request, who: Principal) -> dict[str, Any]:
        return views.lease_history(self.core, who, request.match_info["lease_id"])

    async def _whatif(self, request: web.Request, who: Principal) -> dict[str, Any]:
        body = await self._body(request)
        size = body.get("size") or {}
        if not isinstance(size, dict):
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "size", "a map of dimension to units")
        req = pb.AcquireRequest(
            campaign=str(body.get("campaign", "")),
            size={str(k): float(v) for k, v in size.items()},
            duration_s=float(body.get("duration_s") or 0.0),
        )
        args = convert.acquire_from_proto(req, who.acting_for(req.campaign))
        outcome, engine = await self.core.what_if_acquire(args)
        own = outcome.own
        out: dict[str, Any] = {"outcome": own.kind if own is not None else ""}
        if isinstance(own, Granted):
            lease = engine.leases[own.lease_id]
            out["lease"] = views.message(convert.lease_to_proto(engine, lease))
            out["path"] = own.path.value
            out["credits"] = own.credits
        elif isinstance(own, Queued):
            out["reason"] = own.reason.value
            out["estimated_wait_s"] = own.estimated_wait_s
        elif isinstance(own, Rejected):
            out["reason"] = own.reason.value
            out["retry_after_s"] = own.retry_after_s
        return out

    async def _revoke(self, request: web.Request, _who: Principal) -> dict[str, Any]:
        body = await self._body(request)
        lease = self.core.revoke(str(body.get("lease_id", "")), str(body.get("reason", "")))
        return {"lease": views.message(lease)}

    async def _pause(self, request: web.Request, _who: Principal) -> dict[str, Any]:
        body = await self._body(request)
        name = str(body.get("campaign", ""))
        self.core.require_campaign(name)
        current = self.core.engine.campaigns[name].spec
        if body.get("paused", True):
            if name not in self._paused:
                self._paused[name] = current
            zero = {
                d: DimEnvelope(guarantee=0.0, sustained=0.0, burst=0.0, bucket=e.bucket)
                for d, e in current.envelopes.items()
            }
            self.core.update_campaign(replace(current, envelopes=zero))
        else:
            before = self._paused.pop(name, None)
            if before is None:
                raise RequestError(
                    ErrorCode.FAILED_PRECONDITION,
                    "campaign",
                    f"campaign {name} was not paused from this dashboard since it started; "
                    "set its envelope with `bursar campaigns update`",
                )
            self.core.update_campaign(before)
        return {"campaign": name, "paused": name in self._paused}

    async def _events(self, request: web.Request) -> web.StreamResponse:
        try:
            who = self._who(request)
            seq, index = parse_event_id(request.headers.get("Last-Event-ID", ""))
            await self.core.settled()
            # From the current end when opened afresh: the state event carries what is.
            start = seq or self.core.runtime.journal.last_seq + 1
            sub = self.core.watch(who, "", [], start, index if seq else 0)
        except (ServiceError, RequestError) as exc:
            return _error(exc)
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        opened_with = self.core.token_generation(who.campaign)
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await resp.prepare(request)
            end = self.core.runtime.journal.last_seq
            state = self.state_for(who, fresh=True)
            await resp.write(_sse("state", state, f"{end + 1}.-1" if not seq else ""))
            for ev in sub.snapshot:
                await resp.write(self._lease_event(ev))
            await self._follow(resp, who, sub, opened_with)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        except ServiceError as exc:
            with contextlib.suppress(ConnectionResetError):
                await resp.write(_sse("end", {"error": str(exc)}))
        finally:
            self.core.unwatch(sub)
            self._streams.discard(task)
        return resp

    async def _follow(
        self, resp: web.StreamResponse, who: Principal, sub: Any, opened_with: int
    ) -> None:
        sent = -math.inf
        dirty = False
        next_ev: asyncio.Task[Any] = asyncio.ensure_future(sub.next())
        changed: asyncio.Task[Any] | None = None
        try:
            while True:
                if changed is None:
                    # Quiet, a state every half-minute keeps proxies from closing the stream.
                    wait = (
                        30.0 if not dirty else max(0.0, sent + STATE_INTERVAL_S - time.monotonic())
                    )
                    changed = asyncio.ensure_future(self.core.supply_changed(wait))
                done, _ = await asyncio.wait(
                    {next_ev, changed}, return_when=asyncio.FIRST_COMPLETED
                )
                self.core.check_token_generation(who.campaign, opened_with)
                if next_ev in done:
                    ev = next_ev.result()  # raises what closed the subscription
                    if ev is None:
                        return
                    # Gather what follows within FLUSH_S into the same write: under load a
                    # stream then costs the broker one wake-up and one send per batch, not
                    # per event.
                    await asyncio.sleep(FLUSH_S)
                    batch = [ev, *sub.ready(_BATCH)]
                    await self.core.durable()
                    await resp.write(b"".join(self._lease_event(e) for e in batch))
                    next_ev = asyncio.ensure_future(sub.next())
                    dirty = True
                if changed in done:
                    changed = None
                    dirty = True
                if dirty and time.monotonic() - sent >= STATE_INTERVAL_S:
                    await self.core.settled()
                    await resp.write(self.state_frame(who))
                    sent = time.monotonic()
                    dirty = False
        finally:
            next_ev.cancel()
            if changed is not None:
                changed.cancel()
