"""What an operator sees of a leader and its standby on one PostgreSQL journal: ``bursar
status`` (the role, the leader, its epoch, each broker's lag), the metrics (role, epoch,
leadership changes, the standbys' lag) and the dashboard (a standby's names the leader).

Real ``bursar serve`` processes on a private PostgreSQL server (``tests/pg_support.py``),
as in ``test_failover.py``; a single broker on SQLite for the single case."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from conftest import open_dashboard
from pg_support import PgServer, postgres_server
from prometheus_client.parser import text_string_to_metric_families
from service_support import serve
from test_failover import Broker, _pair, _token, logged

from bursar.cli.main import main
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc
from bursar.providers.client import BrokerClient, BrokerStatus
from bursar.testing import poll_until


@pytest.fixture(scope="module")
def pg() -> Iterator[PgServer]:
    with postgres_server() as server:
        yield server


def _status(broker: Broker, token: str) -> pb.Status:
    """GetStatus on ``broker`` alone (no other address to follow)."""
    with grpc.insecure_channel(broker.address) as channel:
        return broker_pb2_grpc.BrokerStub(channel).GetStatus(
            pb.GetStatusRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=5
        )


def _metrics(broker: Broker) -> dict[str, float]:
    """The broker's samples: ``name{label="v"}`` -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics") as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _http(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _peer(st: pb.Status | BrokerStatus, address: str) -> Any:
    (peer,) = [p for p in st.brokers if p.address == address]
    return peer


def test_operators_see_the_leader_the_standby_its_lag_and_a_takeover(
    pg: PgServer, tmp_path: Path
) -> None:
    url = pg.new_database()
    a, b = _pair(tmp_path, url, ops=True)
    admin_file = tmp_path / "admin.token"
    admin = admin_file.read_text().strip()
    with logged(a, b):
        # The leader: its role, epoch, and the standby caught up (it reports every poll).
        st = poll_until(
            lambda: (s := _status(a, admin)) and len(s.brokers) == 2 and s, 20, "the brokers' state"
        )
        assert (st.role, st.journal_store, st.leader, st.epoch) == (
            "leader",
            "postgresql",
            a.address,
            1,
        )
        assert {p.address: p.role for p in st.brokers} == {
            a.address: "leader",
            b.address: "standby",
        }
        # The standby answers the admin with its own view: the same leader, its engine.
        sb = poll_until(
            lambda: (s := _status(b, admin)) and _peer(s, b.address).lag_entries == 0 and s,
            20,
            "the brokers' state",
        )
        assert (sb.role, sb.leader, sb.epoch, sb.caller) == ("standby", a.address, 1, "admin")
        assert sb.campaigns == st.campaigns and sb.journal_entries == st.journal_entries
        # A campaign's call on the standby is refused as every call is: follow the leader.
        with pytest.raises(grpc.RpcError) as refused:
            _status(b, _token(a))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"the leader is at {a.address}" in str(refused.value.details())

        # The standby stalls; the leader commits: its lag grows, in entries and seconds.
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)
        try:
            with BrokerClient(a.address, _token(a)) as team:
                team.acquire({"gpu": 1}, 60, blocking=False)
            time.sleep(1.0)
            lagging = poll_until(
                lambda: _peer(s := _status(a, admin), b.address).lag_entries and s,
                20,
                "the brokers' state",
            )
            behind = _peer(lagging, b.address)
            assert behind.lag_entries >= 1 and behind.lag_s >= 0.5, behind
            seen = _metrics(a)
            assert seen[f'bursar_standby_lag_entries{{address="{b.address}"}}'] >= 1
            assert seen[f'bursar_standby_lag_seconds{{address="{b.address}"}}'] >= 0.5
        finally:
            b.proc.send_signal(signal.SIGCONT)
        caught_up = poll_until(
            lambda: _peer(s := _status(a, admin), b.address).lag_entries == 0 and s,
            20,
            "the brokers' state",
        )
        assert _peer(caught_up, b.address).lag_s == 0

        # bursar status, for a person: the standby names the leader; both brokers listed.
        shown = CliRunner().invoke(
            main, ["status", "--target", b.address, "--admin-token-file", str(admin_file)]
        )
        assert shown.exit_code == 0, shown.output
        assert f"role             standby (the leader is {a.address}, epoch 1)" in shown.output
        assert a.address in shown.output and "leader" in shown.output

        # The standby's own metrics: its role, the epoch, its lag.
        seen = _metrics(b)
        assert seen['bursar_role{role="standby"}'] == 1 and seen["bursar_leader_epoch"] == 1
        assert seen[f'bursar_standby_lag_entries{{address="{b.address}"}}'] == 0
        assert seen["bursar_leadership_changes_total"] == 0
        # The leader's metrics: its role, epoch, the one takeover (its own first lead).
        seen = _metrics(a)
        assert seen['bursar_role{role="leader"}'] == 1
        assert seen["bursar_leader_epoch"] == 1
        assert seen["bursar_leadership_changes_total"] == 1
        assert seen[f'bursar_standby_lag_entries{{address="{b.address}"}}'] == 0

        # The standby's dashboard names the leader and links to its dashboard; its API
        # answers 503 with the leader rather than stale state.
        code, page = _http(f"http://127.0.0.1:{b.dashboard_port}/")
        assert code == 503 and "standby" in page and a.address in page
        assert f'href="http://127.0.0.1:{a.dashboard_port}/"' in page
        code, body = _http(f"http://127.0.0.1:{b.dashboard_port}/api/state", admin)
        assert code == 503 and json.loads(body)["leader"] == a.address
        code, _ = _http(f"http://127.0.0.1:{a.dashboard_port}/api/state", admin)
        assert code == 200

        # The leader dies: the standby leads under epoch 2 and says so everywhere.
        a.kill()
        b.wait("SERVING", 30)
        st = poll_until(
            lambda: (s := _status(b, admin)) and _peer(s, a.address).role == "former" and s,
            20,
            "the brokers' state",
        )
        assert (st.role, st.leader, st.epoch) == ("leader", b.address, 2)
        seen = _metrics(b)
        assert seen['bursar_role{role="leader"}'] == 1 and seen["bursar_leader_epoch"] == 2
        assert seen["bursar_leadership_changes_total"] == 1
        code, state = _http(f"http://127.0.0.1:{b.dashboard_port}/api/state", admin)
        assert code == 200 and json.loads(state)


def test_a_single_broker_on_sqlite_says_so(tmp_path: Path) -> None:
    import asyncio

    async def scenario() -> None:
        async with serve(tmp_path) as c:
            st = await c.broker.GetStatus(pb.GetStatusRequest(), metadata=c.as_("admin"))
            assert (st.role, st.journal_store, st.leader, st.epoch) == ("single", "sqlite", "", 0)
            assert not st.brokers
            admin = tmp_path / "admin.token"
            admin.write_text(c.admin_token)
            shown = await asyncio.to_thread(
                CliRunner().invoke,
                main,
                ["status", "--target", c.address, "--admin-token-file", str(admin)],
            )
            assert shown.exit_code == 0, shown.output
            assert "role             leader (single, sqlite)" in shown.output
            as_json = await asyncio.to_thread(
                CliRunner().invoke,
                main,
                ["status", "--target", c.address, "--admin-token-file", str(admin), "--json"],
            )
            got = json.loads(as_json.output)["status"]
            assert (got["role"], got["journal_store"], got["brokers"]) == ("single", "sqlite", [])
            metrics = c.core.metrics
            assert metrics.role.labels("single")._value.get() == 1

    asyncio.run(scenario())


DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"


def _exec_start(unit: Path) -> list[str]:
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


@pytest.mark.parametrize("unit", ["bursar.service", "bursar-standby.service"])
def test_each_units_command_line_is_one_bursar_serve_takes(unit: str) -> None:
    from bursar.cli.serve import serve_command

    argv = _exec_start(DEPLOY / unit)
    assert argv[0] == "/opt/bursar/bin/bursar" and argv[1] == "serve"
    params = {o: p for p in serve_command.params for o in p.opts}
    given: dict[str, str | None] = {}
    args = iter(argv[2:])
    for arg in args:
        assert arg in params, f"{unit}: bursar serve has no option {arg}"
        given[arg] = None if getattr(params[arg], "is_flag", False) else next(args, None)
        assert getattr(params[arg], "is_flag", False) or given[arg] is not None, arg
    if unit == "bursar-standby.service":
        # systemd fills in the environment file's values and the credentials directory.
        assert given["--journal"] == "${BURSAR_JOURNAL}"
        assert given["--advertise"] == "${BURSAR_ADVERTISE}"
        assert given["--admin-token-file"] == "%d/admin.token"
        # The default takeover, spelled out so that a site sees what it tunes.
        from bursar.broker.service.server import Takeover

        poll, grace, check = (float(x) for x in (given["--takeover"] or "").split(","))
        assert Takeover(poll, grace, check) == Takeover()


def test_systemd_analyze_accepts_the_standby_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    script = Path(sys.executable).with_name("bursar")
    if analyze is None or not script.exists():
        pytest.skip("systemd-analyze, or a bursar script to stand in for /opt/bursar, missing")
    unit = tmp_path / "bursar-standby.service"
    text = (DEPLOY / unit.name).read_text()
    unit.write_text(text.replace("/opt/bursar/bin/bursar", str(script)))
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert unit.name not in res.stderr, res.stderr


def test_a_page_open_on_the_leader_follows_the_lead_when_it_dies(
    pg: PgServer, browser: Any, tmp_path: Path
) -> None:
    """In Chromium: the standby's page names the leader and links its dashboard; a page
    signed in on the leader, when the leader is killed, finds the broker that took the lead
    (its ``/api/role``) and opens that one's dashboard."""
    url = pg.new_database()
    a, b = _pair(tmp_path, url, ops=True)
    admin = (tmp_path / "admin.token").read_text().strip()
    a_page = f"http://127.0.0.1:{a.dashboard_port}/"
    b_page = f"http://127.0.0.1:{b.dashboard_port}/"
    with logged(a, b):
        standby = browser.new_page()
        standby.goto(b_page)
        banner = standby.locator(".banner").inner_text()
        assert "standby" in banner and a.address in banner, banner
        assert standby.locator(".banner a").get_attribute("href") == a_page
        standby.close()
        # Where the lead is, for any origin and without a token: the one route that says so.
        with urllib.request.urlopen(f"{b_page}api/role", timeout=5) as r:
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert json.loads(r.read()) == {
                "role": "standby",
                "leader": a.address,
                "dashboard": a_page,
            }

        # The leader's state lists both brokers and their dashboards once b has reported.
        poll_until(lambda: len(_status(a, admin).brokers) == 2, 20, "the brokers' state")
        page = open_dashboard(browser, a_page, admin)
        page.wait_for_function(
            "() => brokers.filter((b) => b.dashboard).length === 2", timeout=15_000
        )

        a.kill()
        b.wait("SERVING", 30)
        page.wait_for_url(b_page, timeout=30_000)
        # The new leader's page: a token pasted on a's origin stays there; sign in again.
        page.fill("#token", admin)
        page.click("#signin button")
        page.wait_for_selector("#live.on")
        assert page.locator("#failover").is_hidden()
        assert page.errors == [], page.errors
        with urllib.request.urlopen(f"{b_page}api/role", timeout=5) as r:
            assert json.loads(r.read())["role"] == "leader"
