"""``bursar campaigns``, ``bursar leases`` and ``bursar supply`` through click's runner,
against a broker running in another thread: tables, --json, and errors with hints."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from client_support import ServerThread, server_thread
from common import self_signed_cert

from bursar.cli.main import main
from bursar.providers.client import BrokerClient


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state") as s:
        yield s


def bursar(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def admin_args(s: ServerThread) -> list[str]:
    return ["--target", s.address, "--admin-token-file", str(s.state_dir / "admin.token")]


def test_campaigns_list_show_as_tables_and_json(server: ServerThread) -> None:
    res = bursar("campaigns", *admin_args(server), "list")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("Envelopes") and any(ln.startswith("Now") for ln in lines)
    assert any(ln.startswith("backfill") and "opportunistic" in ln for ln in lines)
    assert any("preemptible" in ln for ln in lines)
    assert any(ln.startswith("sci ") and "100k" in ln for ln in lines)
    assert max(len(ln) for ln in lines) <= 80

    res = bursar("campaigns", "list", *admin_args(server), "--json")  # options on the command
    assert res.exit_code == 0
    data = json.loads(res.stdout)
    assert [c["name"] for c in data] == ["backfill", "other", "sci"]
    sci = data[2]
    assert sci["envelopes"]["gpu"] == {
        "guarantee": 0.0,
        "sustained": 8.0,
        "burst": 24.0,
        "bucket": 100000.0,
    }
    assert data[0]["bucket"]["gpu"] is None  # unlimited
    assert sci["lease_class"] == "BATCH" and sci["leases"] == 0

    res = bursar("campaigns", *admin_args(server), "show", "sci", "--json")
    assert json.loads(res.stdout)["name"] == "sci"


def test_campaigns_create_then_update_only_what_is_given(
    server: ServerThread, tmp_path: Path
) -> None:
    res = bursar(
        "campaigns",
        *admin_args(server),
        "create",
        "agents",
        "--class",
        "interactive",
        "--envelope",
        "gpu:guarantee=0,sustained=4,burst=8,bucket=5000",
        "--envelope",
        "inference:sustained=10,burst=20",
    )
    assert res.exit_code == 0, res.output
    assert "created campaign agents" in res.stdout
    token = next(ln for ln in res.stdout.splitlines() if ln.startswith("token: ")).split()[1]
    with BrokerClient(server.address, token) as agents:
        assert agents.status().caller == "campaign:agents"

    res = bursar(
        "campaigns",
        *admin_args(server),
        "update",
        "agents",
        "--envelope",
        "gpu:burst=16",
        "--remove-dim",
        "inference",
        "--json",
    )
    assert res.exit_code == 0, res.output
    updated = json.loads(res.stdout)
    assert updated["envelopes"] == {
        "gpu": {"guarantee": 0.0, "sustained": 4.0, "burst": 16.0, "bucket": 5000.0}
    }
    assert updated["lease_class"] == "INTERACTIVE"

    saved = tmp_path / "robots.token"
    res = bursar(
        "campaigns",
        *admin_args(server),
        "create",
        "robots",
        "--envelope",
        "gpu:sustained=1,burst=8",
        "--save-token",
        str(saved),
        "--json",
    )
    out = json.loads(res.stdout)
    assert out["token"] is None and out["token_file"] == str(saved)
    assert saved.read_text().startswith("bsr_") and saved.stat().st_mode & 0o777 == 0o600

    res = bursar("campaigns", *admin_args(server), "create", "x", "--envelope", "gpu:brust=1")
    assert res.exit_code == 2 and "keys are guarantee" in res.stderr


def test_leases_list_as_table_and_json_with_a_campaign_token_file(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        lease = sci.acquire({"gpu": 8}, 60, labels={"job": "a"})
        token_args = [
            "--target",
            server.address,
            "--token-file",
            str(server.state_dir / "tokens.json"),
            "--campaign",
            "sci",
        ]
        res = bursar("leases", "list", *token_args)
        assert res.exit_code == 0, res.output
        row = next(ln for ln in res.stdout.splitlines() if ln.startswith(lease.id))
        assert "sci" in row and "active" in row and "8 gpu" in row and "job=a" in row
        assert "in 6" in row or "in 5" in row  # expires in about 60 s

        res = bursar("leases", *token_args, "list", "--json")
        (item,) = json.loads(res.stdout)
        assert item["id"] == lease.id and item["size"] == {"gpu": 8.0}
        assert item["state"] == "ACTIVE" and item["labels"] == {"job": "a"}

        # The admin sees every campaign's, or one campaign's.
        res = bursar("leases", *admin_args(server), "list", "--campaign", "other", "--json")
        assert json.loads(res.stdout) == []
        res = bursar("leases", *admin_args(server), "list", "--json")
        assert [x["id"] for x in json.loads(res.stdout)] == [lease.id]


def test_leases_watch_prints_events_until_the_leases_end(server: ServerThread) -> None:
    env = {"BURSAR_TARGET": server.address, "BURSAR_TOKEN": server.tokens["sci"]}
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        lease = sci.acquire({"gpu": 8}, 60)
        timer = threading.Timer(0.3, sci.release, args=(lease.id,))
        timer.start()
        res = bursar("leases", "watch", lease.id, "--json", env=env)
        timer.join()
        assert res.exit_code == 0, res.output
        events = [json.loads(ln) for ln in res.stdout.splitlines()]
        assert [e["kind"] for e in events] == ["ACTIVATED", "RELEASED"]
        assert events[0]["snapshot"] and events[0]["lease"]["id"] == lease.id

        other = sci.acquire({"gpu": 8}, 60)
        res = bursar("leases", "watch", "--count", "1", env=env)
        assert res.exit_code == 0, res.output
        (line,) = res.stdout.splitlines()
        assert "activated" in line and other.id in line and "[snapshot]" in line


def test_supply_as_tables_json_and_a_short_watch(server: ServerThread) -> None:
    env = {"BURSAR_TARGET": server.address, "BURSAR_TOKEN": server.tokens["sci"]}
    res = bursar("supply", "--units", "8", env=env)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith("price ") and "Pool" in out and "Campaigns" in out
    gpu = next(ln for ln in out.splitlines() if ln.startswith("gpu "))
    assert gpu.split()[:3] == ["gpu", "24", "16"]
    assert "stranded" in out
    assert "time to 8 gpu: warm 0 s, reclaim 0.6 s, cold 0.6 s" in out

    res = bursar("supply", "--json", env=env)
    data = json.loads(res.stdout)
    assert data["dims"]["gpu"]["capacity"] == 24 and list(data["campaigns"]) == ["sci"]
    assert data["dims"]["gpu"]["stranded"] == 0 and "partial_free" in data["dims"]["gpu"]

    watch = ["--watch", "--count", "2", "--interval", "0.05", "--heartbeat", "0.1"]
    res = bursar("supply", *watch, "--json", env=env)
    assert res.exit_code == 0, res.output
    snapshots = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert [s["dims"]["gpu"]["capacity"] for s in snapshots] == [24, 24]
    assert snapshots[1]["at"] > snapshots[0]["at"]
    res = bursar("supply", *watch, env=env)
    assert res.exit_code == 0 and res.stdout.count("Pool") == 2


def test_errors_print_the_server_message_and_a_hint_and_exit_1(server: ServerThread) -> None:
    sci = ["--target", server.address, "--token", server.tokens["sci"]]
    res = bursar("campaigns", *sci, "list")
    assert res.exit_code == 1
    assert "needs the admin token" in res.stderr and "ADMIN_ONLY" in res.stderr
    assert "hint:" in res.stderr and "--admin-token-file" in res.stderr

    res = bursar("campaigns", *admin_args(server), "show", "nope", "--json")
    assert res.exit_code == 1 and res.stdout == ""
    err = json.loads(res.stderr)["error"]
    assert err["code"] == "NOT_FOUND" and "unknown campaign 'nope'" in err["message"]
    assert err["hint"]

    res = bursar("leases", "--target", server.address, "--token", "bsr_wrong", "list")
    assert res.exit_code == 1 and "not valid" in res.stderr and "BURSAR_TOKEN" in res.stderr

    res = bursar("supply", "--target", "127.0.0.1:1", "--token", "t", "--retry-timeout", "0.2")
    assert res.exit_code == 1
    assert "is the broker running at 127.0.0.1:1?" in " ".join(res.stderr.split())

    res = bursar("leases", "--target", server.address, "list")  # no token at all
    assert res.exit_code == 2 and "no token" in res.stderr


def test_help_explains_every_command() -> None:
    for args in (
        ["campaigns"],
        ["campaigns", "create"],
        ["campaigns", "update"],
        ["leases"],
        ["leases", "watch"],
        ["supply"],
    ):
        res = bursar(*args, "--help")
        assert res.exit_code == 0
        assert "--target" in res.stdout and "BURSAR_TARGET" in res.stdout
    assert "--envelope" in bursar("campaigns", "create", "--help").stdout


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_ca_option(tmp_path: Path) -> None:
    key, cert = self_signed_cert(tmp_path) or (None, None)
    assert key is not None and cert is not None
    with server_thread(tmp_path / "state", tls_cert=cert, tls_key=key) as s:
        args = ["--target", s.address, "--token", s.tokens["sci"], "--json"]
        res = bursar("supply", *args, "--tls-ca", str(cert))
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["dims"]["gpu"]["capacity"] == 24
        res = bursar("supply", *args, "--retry-timeout", "0.2")  # plaintext: refused
        assert res.exit_code == 1 and json.loads(res.stderr)["error"]["code"] == "UNAVAILABLE"


def test_leases_revoke_ends_a_lease_with_the_operators_reason(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        lease = sci.acquire({"gpu": 8}, 60)
        res = bursar(
            "leases", *admin_args(server), "revoke", lease.id, "--reason", "drain", "--json"
        )
        assert res.exit_code == 0, res.output
        ended = json.loads(res.stdout)
        assert ended["id"] == lease.id and ended["state"] == "REVOKED"
        assert sci.get_lease(lease.id).end_cause == "revoked by an administrator: drain"

        again = bursar("leases", *admin_args(server), "revoke", lease.id, "--reason", "drain")
        assert again.exit_code == 1 and "already ended" in again.output
        # A campaign token cannot revoke.
        env = {"BURSAR_TARGET": server.address, "BURSAR_TOKEN": server.tokens["sci"]}
        other = sci.acquire({"gpu": 8}, 60)
        denied = bursar("leases", "revoke", other.id, "--reason", "mine", env=env)
        assert denied.exit_code == 1 and "admin token" in denied.output
        assert sci.get_lease(other.id).state.value == "ACTIVE"
