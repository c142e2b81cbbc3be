"""The dashboard's JSON and event-stream endpoints, over real HTTP on the service's loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from common import self_signed_cert
from hypothesis import given
from hypothesis import strategies as st
from server import Server
from service_support import LIFECYCLE, START, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.broker.colours import campaign_colour
from bursar.broker.dashboard import series
from bursar.broker.dashboard.login import cookie_name, login_link
from bursar.broker.dashboard.series import CHANGES
from bursar.broker.dashboard.server import parse_event_id
from bursar.protos.bursar.v1 import broker_pb2 as pb


def _h(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


async def _get(http: aiohttp.ClientSession, url: str, token: str) -> tuple[int, Any]:
    async with http.get(url, headers=_h(token)) as r:
        return r.status, await r.json()


async def _post(http: aiohttp.ClientSession, url: str, token: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, headers=_h(token), json=body) as r:
        return r.status, await r.json()


class Events:
    """An open /api/events stream, read one server-sent event at a time."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, timeout_s: float = 5.0) -> tuple[str, str, Any]:
        event, ident, data = "", "", ""
        async with asyncio.timeout(timeout_s):
            while True:
                line = (await self.resp.content.readline()).decode().rstrip("\n")
                if not line:
                    if data:
                        return event, ident, json.loads(data)
                    continue
                key, _, value = line.partition(": ")
                if key == "event":
                    event = value
                elif key == "id":
                    ident = value
                elif key == "data":
                    data += value

    async def next_lease(self, timeout_s: float = 5.0) -> tuple[str, Any]:
        while True:
            event, ident, data = await self.next(timeout_s)
            if event == "lease":
                return ident, data


def test_a_campaign_token_sees_its_own_campaign_and_the_public_supply(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0) as c:
            base = c.running.dashboard_url
            assert base.startswith("http://127.0.0.1:")
            lease = (await c.acquire("other", 2)).lease
            await c.acquire("sci", 1)
            async with aiohttp.ClientSession() as http:
                status, admin = await _get(http, base + "api/state", c.admin_token)
                assert status == 200
                assert [x["name"] for x in admin["campaigns"]] == ["backfill", "other", "sci"]
                # Each campaign's colour is the one every report gives it.
                assert {x["name"]: x["colour"] for x in admin["campaigns"]} == {
                    n: campaign_colour(n) for n in ("backfill", "other", "sci")
                }
                assert {x["campaign"] for x in admin["leases"]} == {"other", "sci"}
                status, sci = await _get(http, base + "api/state", c.tokens["sci"])
                assert status == 200 and sci["caller"] == "campaign:sci"
                assert [x["name"] for x in sci["campaigns"]] == ["sci"]
                assert {x["campaign"] for x in sci["leases"]} == {"sci"}
                assert {r["campaign"] for r in sci["journal"]} <= {"sci"}
                assert set(sci["supply"]["campaigns"]) == {"sci"}
                assert sci["supply"]["dims"]["gpu"]["capacity"] == 24
                assert set(sci["series"]["base"]) <= {"sci"}
                assert {p["campaign"] for p in sci["series"]["points"]} == {"sci"}
                # Another campaign's lease: refused, not merely empty.
                status, body = await _get(
                    http, base + f"api/lease/{lease.lease_id}", c.tokens["sci"]
                )
                assert status == 403 and "another campaign" in body["error"]
                status, _ = await _get(http, base + "api/state", "bsr_not-a-token")
                assert status == 401
                async with http.get(base + "api/state") as r:
                    assert r.status == 401
                # A campaign's stream carries none of another campaign's events.
                async with http.get(base + "api/events", headers=_h(c.tokens["sci"])) as r:
                    ev = Events(r)
                    await ev.next()
                    await c.acquire("other", 1)
                    mine = await c.acquire("sci", 1)
                    _, data = await ev.next_lease()
                    assert data["lease"]["lease_id"] == mine.lease.lease_id

    run(main())


def test_events_follow_live_and_resume_from_last_event_id(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0) as c:
            url = c.running.dashboard_url + "api/events"
            async with aiohttp.ClientSession() as http:
                async with http.get(url, headers=_h(c.admin_token)) as r:
                    assert r.headers["Content-Type"].startswith("text/event-stream")
                    ev = Events(r)
                    kind, first_id, state = await ev.next()
                    assert kind == "state" and state["leases"] == []
                    got = await c.acquire("sci", 2)
                    ident, data = await ev.next_lease(1.0)
                    assert data["kind"] == "LEASE_EVENT_KIND_GRANTED"
                    assert data["lease"]["lease_id"] == got.lease.lease_id
                    # A state may predate lease events already sent (streams share one):
                    # its journal_seq says which; the first one past the grant holds it.
                    kind, _, state = await ev.next()
                    while kind != "state" or state["journal_seq"] < int(data["seq"]):
                        kind, _, state = await ev.next()
                    assert [x["lease_id"] for x in state["leases"]] == [got.lease.lease_id]
                # Missed while disconnected: a release and a new grant.
                await c.broker.Release(
                    pb.ReleaseRequest(lease_id=got.lease.lease_id),
                    metadata=c.as_("sci"),
                )
                again = await c.acquire("sci", 1)
                async with http.get(
                    url, headers=_h(c.admin_token, **{"Last-Event-ID": ident})
                ) as r:
                    ev = Events(r)
                    _, a = await ev.next_lease()
                    _, b = await ev.next_lease()
                    assert (a["kind"], a["lease"]["lease_id"]) == (
                        "LEASE_EVENT_KIND_RELEASED",
                        got.lease.lease_id,
                    )
                    assert (b["kind"], b["lease"]["lease_id"]) == (
                        "LEASE_EVENT_KIND_GRANTED",
                        again.lease.lease_id,
                    )
                # From the opening state's id: the same two, nothing before them.
                async with http.get(
                    url, headers=_h(c.admin_token, **{"Last-Event-ID": first_id})
                ) as r:
                    ev = Events(r)
                    _, g = await ev.next_lease()
                    assert g["lease"]["lease_id"] == got.lease.lease_id
                async with http.get(url, headers=_h(c.admin_token, **{"Last-Event-ID": "x"})) as r:
                    assert r.status == 400

    run(main())


def test_revoke_and_pause_are_the_admins_only(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0) as c:
            base = c.running.dashboard_url
            lease = (await c.acquire("sci", 2)).lease
            async with aiohttp.ClientSession() as http:
                body = {"lease_id": lease.lease_id, "reason": "test"}
                status, _ = await _post(http, base + "api/revoke", c.tokens["sci"], body)
                assert status == 403
                status, out = await _post(http, base + "api/revoke", c.admin_token, body)
                assert status == 200 and out["lease"]["state"] == "LEASE_STATE_REVOKED"
                status, out = await _post(http, base + "api/revoke", c.admin_token, body)
                assert status == 409  # already ended
                status, _ = await _post(
                    http, base + "api/pause", c.tokens["sci"], {"campaign": "sci"}
                )
                assert status == 403
                status, out = await _post(
                    http, base + "api/pause", c.admin_token, {"campaign": "sci", "paused": True}
                )
                assert status == 200 and out["paused"]
                status, what = await _post(
                    http,
                    base + "api/whatif",
                    c.tokens["sci"],
                    {"size": {"gpu": 1}, "duration_s": 60},
                )
                # Paused: burst 0, so a new request can never be granted.
                assert status == 416 and "burst ceiling (0.0)" in what["error"], what
                status, out = await _post(
                    http, base + "api/pause", c.admin_token, {"campaign": "sci", "paused": False}
                )
                assert status == 200 and not out["paused"]
                status, what = await _post(
                    http,
                    base + "api/whatif",
                    c.tokens["sci"],
                    {"size": {"gpu": 1}, "duration_s": 60},
                )
                assert status == 200 and what["outcome"] == "grant", what
                # The what-if changed nothing.
                status, state = await _get(http, base + "api/state", c.admin_token)
                assert state["leases"] == []

    run(main())


def test_the_time_to_usable_pairs_grants_with_activations(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0) as c:
            await c.acquire("sci", 16)  # the warm nodes
            await c.acquire("other", 8, timeout_s=5)  # the cold node: boots 0.6 s
            for _ in range(50):
                if c.core.engine.pending == {} and all(
                    ls.state.value == "active" for ls in c.core.engine.leases.values()
                ):
                    break
                await asyncio.sleep(0.1)
            async with aiohttp.ClientSession() as http:
                _, state = await _get(http, c.running.dashboard_url + "api/state", c.admin_token)
            usable = state["time_to_usable"]
            assert usable["warm"] == [0.0]
            assert len(usable["cold"]) == 1 and usable["cold"][0] > 0

    run(main())


@given(st.integers(1, 10**9), st.integers(-1, 10**6))
def test_an_event_id_resumes_just_after_its_position(seq: int, index: int) -> None:
    assert parse_event_id(f"{seq}.{index}") == (seq, index + 1)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_with_tls_the_dashboard_is_https_only(tmp_path: Path) -> None:
    key, cert = self_signed_cert(tmp_path) or (None, None)
    assert key is not None and cert is not None

    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0, tls_cert=cert, tls_key=key) as c:
            url = c.running.dashboard_url
            assert url.startswith("https://")
            trust = ssl.create_default_context(cafile=str(cert))
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "api/state", headers=_h(c.admin_token), ssl=trust) as r:
                    assert r.status == 200
                with pytest.raises(aiohttp.ClientError):
                    async with http.get(url.replace("https", "http") + "api/state") as r:
                        await r.read()

    run(main())


def test_the_queue_and_the_elastic_table_are_shown(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0) as c:
            url = c.running.dashboard_url + "api/state"
            elastic = await c.broker.Acquire(
                pb.AcquireRequest(
                    duration_s=600,
                    intent=pb.Intent(
                        min={"gpu": 2},
                        max={"gpu": 16},
                        speedup=pb.Speedup(amdahl_serial_fraction=0.05),
                        remaining_work=20_000,
                        deadline_s=3_000,
                    ),
                ),
                metadata=c.as_("sci"),
            )
            await c.acquire("other", 8)  # the elastic lease has the warm nodes: the cold one
            waiting = asyncio.ensure_future(c.acquire("backfill", 8, timeout_s=10))
            async with aiohttp.ClientSession() as http:
                for _ in range(50):
                    _, state = await _get(http, url, c.admin_token)
                    if state["queue"]:
                        break
                    await asyncio.sleep(0.05)
                [q] = state["queue"]
                assert q["campaign"] == "backfill" and q["size"] == {"gpu": 8.0}
                assert q["reason"] and q["queued_at_iso"].endswith("Z")
                assert q["estimated_wait_s"] is None or q["estimated_wait_s"] >= 0
                [el] = [x for x in state["leases"] if x["lease_id"] == elastic.lease.lease_id]
                table = el["elastic"]
                # The chart ends where the engine's holdings are, elastic steps included.
                level = dict(state["series"]["base"])
                for p in state["series"]["points"]:
                    level[p["campaign"]] = p["held"]
                nonzero = lambda h: {d: v for d, v in h.items() if v}  # noqa: E731
                assert {x["name"]: nonzero(x["held"]) for x in state["campaigns"]} == {
                    n: nonzero(h) for n, h in level.items()
                }
                assert any(p["kind"] == "resize" for p in state["series"]["points"])
                assert table["units"] >= 2 and table["mode"]
                assert {"slack_s", "risk", "marginal_utility"} <= set(table)
                # Another campaign's token sees neither.
                _, mine = await _get(http, url, c.tokens["other"])
                assert mine["queue"] == [] and all("elastic" not in x for x in mine["leases"])
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)

    run(main())


def _journal_changes(core: Any) -> list[tuple[float, str, str, str]]:
    """(time, kind, campaign, lease) of every holdings-changing decision, from the journal."""
    rows, _ = core.runtime.journal.find_decisions(kinds=CHANGES, limit=10_000)
    return [(d["at"], d["kind"], d["campaign"], d["lease_id"]) for _s, _i, d in rows]


def _points(state: dict[str, Any]) -> list[tuple[float, str, str, str, float]]:
    return [
        (p["at"], p["kind"], p["campaign"], p["lease_id"], p["held"].get("gpu", 0.0))
        for p in state["series"]["points"]
    ]


def test_the_chart_is_every_change_from_the_journal_at_its_time_and_survives_a_restart(
    tmp_path: Path,
) -> None:
    clock = ManualClock(START)

    async def first_run() -> list[tuple[float, str, str, str, float]]:
        async with serve(tmp_path / "s", dashboard_port=0, clock=clock) as c:
            url = c.running.dashboard_url + "api/state"
            clock.advance(10)
            sci = (await c.acquire("sci", 2, duration_s=600)).lease
            clock.advance(5)
            other = (await c.acquire("other", 1, duration_s=30)).lease
            clock.advance(5)
            await c.broker.Release(pb.ReleaseRequest(lease_id=sci.lease_id), metadata=c.as_("sci"))
            clock.set(START + 45)  # other's lease expires
            await until(lambda: other.lease_id in c.core.engine.ended)
            async with aiohttp.ClientSession() as http:
                _, state = await _get(http, url, c.admin_token)
            points = _points(state)
            assert points == [
                (START + 10, "grant", "sci", sci.lease_id, 2.0),
                (START + 15, "grant", "other", other.lease_id, 1.0),
                (START + 20, "release", "sci", sci.lease_id, 0.0),
                (START + 45, "expire", "other", other.lease_id, 0.0),
            ]
            # Every change the journal holds, at the journal's time, and nothing else.
            assert [p[:4] for p in points] == _journal_changes(c.core)
            assert state["series"]["base"] == {"backfill": {}, "other": {}, "sci": {}}
            assert state["series"]["start"] == START and state["series"]["now"] == START + 45
            return points

    points = run(first_run())

    async def after_restart() -> None:
        clock.advance(15)
        async with serve(tmp_path / "s", dashboard_port=0, clock=clock) as c:
            async with aiohttp.ClientSession() as http:
                _, state = await _get(http, c.running.dashboard_url + "api/state", c.admin_token)
            assert _points(state) == points
            assert state["series"]["now"] == START + 60

    run(after_restart())


def test_a_lease_granted_before_the_window_is_held_from_its_start(tmp_path: Path) -> None:
    clock = ManualClock(START)

    async def main() -> None:
        async with serve(tmp_path / "s", dashboard_port=0, clock=clock) as c:
            clock.advance(10)
            old = (await c.acquire("sci", 3, duration_s=600)).lease
            older = (await c.acquire("other", 1, duration_s=600)).lease
            clock.advance(90)
            await c.broker.Release(pb.ReleaseRequest(lease_id=old.lease_id), metadata=c.as_("sci"))
            await c.core.settled()
            # The window starts after both grants: they are the level at its start, and the
            # release (its size found from the lease's own grant) takes sci's 3 away.
            s = series.build(c.core, window_s=50)
            assert s.start == START + 50
            assert s.base["sci"] == {"gpu": 3.0} and s.base["other"] == {"gpu": 1.0}
            assert [(p.at, p.campaign, p.held) for p in s.points] == [(START + 100, "sci", {})]
            # Extended live: a lease from before the window ends later, its size found too.
            clock.advance(5)
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=older.lease_id), metadata=c.as_("other")
            )
            await c.core.settled()
            s.extend(c.core)
            assert (s.points[-1].at, s.points[-1].campaign, s.points[-1].held) == (
                START + 105,
                "other",
                {},
            )
            # The window moves on: what is older is the level at its start, as a series
            # built afresh says.
            clock.advance(95)
            s.extend(c.core)
            fresh = series.build(c.core, window_s=50)
            assert (s.start, s.base, list(s.points)) == (START + 150, fresh.base, [])
            assert (fresh.start, fresh.base["sci"], fresh.base["other"]) == (
                START + 150,
                {},
                {},
            )
            # Fewer points kept: the older ones become the level at the start.
            s = series.build(c.core, max_points=2)
            assert s.start == START + 10 and s.base == {
                "backfill": {},
                "other": {"gpu": 1.0},
                "sci": {"gpu": 3.0},
            }
            assert [(p.kind, p.campaign) for p in s.points] == [
                ("release", "sci"),
                ("release", "other"),
            ]

    run(main())


def _cookie(resp: aiohttp.ClientResponse) -> str:
    return resp.headers.get("Set-Cookie", "")


def test_a_login_link_signs_in_once_and_a_cookie_works_only_where_it_was_set(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path / "a", dashboard_port=0) as a,
            serve(tmp_path / "b", dashboard_port=0) as b,
        ):
            base = a.running.dashboard_url
            link = login_link(a.core, base)
            code = link.split("login=", 1)[1]
            name = cookie_name(a.running.dashboard_port or 0)
            # Cookies are kept by hand: a jar would mix the two brokers' (one host).
            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
                async with http.get(link, allow_redirects=False) as r:
                    assert r.status == 303 and r.headers["Location"] == "/"
                    set_cookie = _cookie(r)
                    sid = r.cookies[name].value
                assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
                async with http.get(base + "api/state", cookies={name: sid}) as r:
                    assert r.status == 200 and (await r.json())["caller"] == "admin"
                # Used: refused, and no cookie.
                async with http.get(link, allow_redirects=False) as r:
                    assert r.status == 403 and _cookie(r) == ""
                    assert "bursar dashboard" in await r.text()
                async with http.get(base + "?login=" + code[:-1] + "x") as r:
                    assert r.status == 403 and _cookie(r) == ""
                # The session is this broker's only: the other refuses it by either name.
                other = b.running.dashboard_url + "api/state"
                for cookie in (name, cookie_name(b.running.dashboard_port or 0)):
                    async with http.get(other, cookies={cookie: sid}) as r:
                        assert r.status == 401, cookie
                        why = await r.json()
                # Under its own name, the page is told why (a restart ends sessions too).
                assert why["reason"] == "UNKNOWN_SESSION"
                # Acting with the cookie from another origin: refused.
                async with http.post(
                    base + "api/pause",
                    cookies={name: sid},
                    headers={"Origin": "http://evil.example"},
                    json={"campaign": "sci", "paused": True},
                ) as r:
                    assert r.status == 403
                assert a.core.engine.campaigns["sci"].spec.envelopes["gpu"].burst == 24
                # A campaign token asks for a link: it signs in as that campaign.
                status, out = await _post(http, base + "api/login", a.tokens["sci"], {})
                assert status == 200 and out["as"] == "campaign:sci"
                async with http.get(out["url"], allow_redirects=False) as r:
                    sci_sid = r.cookies[name].value
                async with http.get(base + "api/state", cookies={name: sci_sid}) as r:
                    assert (await r.json())["caller"] == "campaign:sci"
                async with http.post(base + "api/login", json={}) as r:
                    assert r.status == 401
                # Signed out: the cookie stops working.
                async with http.post(base + "api/logout", cookies={name: sid}) as r:
                    assert r.status == 200
                async with http.get(base + "api/state", cookies={name: sid}) as r:
                    assert r.status == 401
            # Neither code nor session id was written anywhere in the state directory.
            secrets_ = [code.encode(), sid.encode(), sci_sid.encode()]
            for f in (tmp_path / "a").rglob("*"):
                if f.is_file():
                    data = f.read_bytes()
                    assert not any(s in data for s in secrets_), f

    run(main())


def test_bursar_serve_prints_a_login_link_and_bursar_dashboard_makes_fresh_ones(
    tmp_path: Path,
) -> None:
    cfg = tmp_path / "pool.toml"
    cfg.write_text(LIFECYCLE)
    state = tmp_path / "state"
    with Server(state, "--config", str(cfg), "--dashboard-port", "0") as server:
        printed = server.wait_for("dashboard: ").split("dashboard: ", 1)[1].strip()
        url = printed.split("?", 1)[0]
        assert printed.startswith(url + "?login=")
        made = subprocess.run(
            [sys.executable, "-m", "bursar.cli.main", "dashboard", "--url", url,
             "--state-dir", str(state)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        fresh = made.stdout.strip()
        assert fresh.startswith(url + "?login=") and fresh != printed

        async def open_links() -> None:
            async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http:
                for link in (printed, fresh):
                    async with http.get(link, allow_redirects=False) as r:
                        assert r.status == 303 and "HttpOnly" in _cookie(r)
                    async with http.get(link, allow_redirects=False) as r:
                        assert r.status == 403

        run(open_links())
        # Without the admin token: a clear error, exit 1.
        bad = subprocess.run(
            [sys.executable, "-m", "bursar.cli.main", "dashboard", "--url", url,
             "--state-dir", str(tmp_path / "nowhere")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert bad.returncode == 1 and "admin.token" in bad.stderr
        assert "Traceback" not in bad.stderr
    # Killed, not stopped: the journal's write-ahead log is read too.
    for f in state.rglob("*"):
        for link in (printed, fresh):
            assert not f.is_file() or link.split("login=")[1].encode() not in f.read_bytes()
