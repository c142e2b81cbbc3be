"""What a standby's dashboard port serves until the broker leads: a page naming the
leader, with a link to its dashboard, instead of the state of an engine that only follows.

A standby has no service core (its engine applies what the leader commits; it serves no
call), so it has nothing the dashboard's views could show that the leader's do not show
better. Every route answers: ``GET /`` (any page) the banner, with HTTP 503 so that a
health probe does not take a standby for a serving dashboard; ``/api/...`` 503 with
``{"error": "standby", "leader": ADDRESS, "dashboard": URL}``, so that a page left open
on this port stops showing old state. Once the broker takes the lead, the server stops
this and starts the real dashboard on the same port.

``GET /api/role`` is the one route without a token, on this page and on the real
dashboard alike (``server.role_response``): the broker's role, the leader and its
dashboard's URL, and nothing else, with ``Access-Control-Allow-Origin: *``. It is what a
page left open on a broker that stopped answering asks the other brokers of its journal,
so that it can follow the lead to whichever took it (``static/app.js``: ``findLeader``);
the same facts a standby's banner already shows anyone, and its gRPC health.

The leader's address is the journal's leadership record; its dashboard's URL is what
the leader reports to the store with its role (``journal_pg.Topology.leader_dashboard``:
its advertised host, its dashboard port). A leader without a dashboard gets no link.
"""

from __future__ import annotations

import html
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bursar.broker.dashboard.server import listen, role_response

__all__ = ["StandbyPage"]


class StandbyPage:
    """The standby's answer on the dashboard port (see the module doc)."""

    def __init__(self, leader: Callable[[], tuple[str, str]]) -> None:
        self._leader = leader
        """The leader's address and its dashboard's URL (each empty when not known)."""
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        """Listen on ``host:port`` (0: a free port); the port bound."""
        self._runner, self.port = await listen(self.app, host, port, ssl_context)
        return self.port

    async def stop(self) -> None:
        """Close the port (the real dashboard takes it)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        leader, url = self._leader()
        if request.path == "/api/role":
            return role_response("standby", leader, url)
        if request.path.startswith("/api/"):
            body: dict[str, Any] = {"error": "standby", "leader": leader, "dashboard": url}
            return web.json_response(body, status=503, headers={"Retry-After": "1"})
        if leader and url:
            where = (
                f"The leader is <b>{html.escape(leader)}</b>: "
                f'<a href="{html.escape(url)}">open its dashboard</a>.'
            )
        elif leader:
            where = f"The leader is <b>{html.escape(leader)}</b> (it serves no dashboard)."
        else:
            where = "No broker leads yet; this page reloads until one does."
        page = _PAGE.format(where=where)
        return web.Response(
            text=page, status=503, content_type="text/html", headers={"Retry-After": "1"}
        )


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Bursar: standby</title>
<meta http-equiv="refresh" content="5">
<style>body{{font:16px system-ui,sans-serif;margin:2em}}
.banner{{padding:1em;border:2px solid #b58900;background:#fdf6e3}}</style></head>
<body><div class="banner" role="alert"><p>This broker is a <b>standby</b>: it follows
the journal and serves nothing until it takes the lead.</p><p>{where}</p></div></body>
</html>
"""
