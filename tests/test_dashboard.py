"""The dashboard's JSON and event-stream endpoints, over real HTTP on the service's loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from common import self_signed_cert
from hypothesis import given
from hypothesis import strategies as st
from service_support import run, serve

from bursar.broker.colours import campaign_colour
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
                assert all(set(s["held"]) <= {"sci"} for s in sci["history"])
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
                assert table["units"] >= 2 and table["mode"]
                assert {"slack_s", "risk", "marginal_utility"} <= set(table)
                # Another campaign's token sees neither.
                _, mine = await _get(http, url, c.tokens["other"])
                assert mine["queue"] == [] and all("elastic" not in x for x in mine["leases"])
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)

    run(main())
