"""``bursar leases whatif`` and ``bursar campaigns update --what-if`` through click's runner,
against a broker running in another thread: what they print, --json, and that nothing
changes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from client_support import ServerThread, server_thread, until

from bursar.cli.main import main
from bursar.providers.client import AdminClient, BrokerClient, Lease


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state") as s:
        yield s


def bursar(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def admin_args(s: ServerThread) -> list[str]:
    return ["--target", s.address, "--admin-token-file", str(s.state_dir / "admin.token")]


def sci_args(s: ServerThread) -> list[str]:
    tokens = str(s.state_dir / "tokens.json")
    return ["--target", s.address, "--token-file", tokens, "--campaign", "sci"]


def _journal(s: ServerThread) -> tuple[int, str]:
    assert s.client is not None
    journal = s.client.core.runtime.journal
    return journal.last_seq, journal.sha256()


def test_leases_whatif_prints_the_answer_and_changes_nothing(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["backfill"]) as backfill:
        backfill.acquire({"gpu": 16}, 300, blocking=False)  # every warm GPU, preemptible
    before = _journal(server)
    ask = ["whatif", "--size", "gpu=8", "--duration", "600"]
    res = bursar("leases", *sci_args(server), *ask)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == "would be granted (nothing was changed)"
    assert any(ln.startswith("L2 ") and "sci" in ln and "starting" in ln for ln in lines)
    assert any(ln.startswith("grant ") and "8 gpu reclaim" in ln for ln in lines)
    assert not any("backfill" in ln for ln in lines)  # a campaign token: its own only
    # The admin acting for sci also sees the warning that would reclaim backfill's lease.
    res = bursar("leases", *admin_args(server), "--campaign", "sci", *ask)
    warning = next(ln for ln in res.stdout.splitlines() if ln.startswith("preempt_warning"))
    assert "backfill" in warning and "L1" in warning and "for L2" in warning

    res = bursar("leases", *sci_args(server), *ask, "--json")
    data = json.loads(res.stdout)
    assert data["outcome"] == "GRANT" and data["lease"]["id"] == "L2"
    assert data["lease"]["path"] == "RECLAIM" and data["decisions"][0]["seq"] == 0
    assert json.loads(data["decisions"][0]["json"])["kind"] == "grant"
    assert _journal(server) == before

    # Then the real request gets just that lease.
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        lease = sci.acquire({"gpu": 8}, 600, blocking=False)
    assert lease.id == "L2" and lease.path.value == "RECLAIM"


def test_leases_whatif_would_queue_or_be_refused(server: ServerThread) -> None:
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        sci.acquire({"gpu": 24}, 300, blocking=False)  # its burst, and the whole pool
    before = _journal(server)
    ask = ["leases", *sci_args(server), "whatif", "--size", "gpu=4", "--duration", "60"]
    queued = bursar(*ask).stdout.splitlines()
    assert queued[0].startswith("would queue: POOL_FULL, estimated wait ")
    assert any(ln.startswith("queue ") and "POOL_FULL" in ln for ln in queued)
    refused = bursar(*ask, "--no-wait").stdout.splitlines()
    assert refused[0].startswith("would be refused: POOL_FULL, retry after ")
    assert not any(ln.startswith("lease ") for ln in refused)  # no lease table
    assert _journal(server) == before


def test_leases_whatif_refuses_bad_input_as_acquire_does(server: ServerThread) -> None:
    base = ["leases", *sci_args(server), "whatif"]
    res = bursar(*base, "--size", "gpu=x", "--duration", "60")
    assert res.exit_code == 2 and "expected DIM=UNITS" in res.output
    res = bursar(*base, "--size", "gpu=8", "--duration", "7200")
    assert res.exit_code == 1 and "maximum lease" in res.output
    res = bursar(*base, "--size", "gpu=8")
    assert res.exit_code == 2 and "--duration" in res.output
    res = bursar("leases", "whatif", "--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "nothing is requested, held or journaled" in text and "--no-wait" in text


def test_campaigns_update_what_if_shows_the_grants_it_would_let_in(server: ServerThread) -> None:
    admin = admin_args(server)
    assert bursar("campaigns", *admin, "update", "sci", "--envelope", "gpu:burst=8").exit_code == 0
    got: dict[str, Any] = {}
    with BrokerClient(server.address, server.tokens["sci"]) as sci:
        sci.acquire({"gpu": 8}, 300, blocking=False)
        # Above the lowered burst: it waits until the envelope lets it in.
        waiter = threading.Thread(
            target=lambda: got.update(lease=sci.acquire({"gpu": 8}, 300, timeout=20))
        )
        waiter.start()
        assert server.client is not None
        until(lambda: len(server.client.core.engine.pending) == 1)
        before = _journal(server)
        change = ["campaigns", *admin, "update", "sci", "--envelope", "gpu:burst=24"]
        res = bursar(*change, "--what-if")
        assert res.exit_code == 0, res.output
        lines = res.stdout.splitlines()
        assert lines[0] == "would be applied (nothing was changed)"
        assert any(ln.startswith("campaign ") and "updated" in ln for ln in lines)
        grant = next(ln for ln in lines if ln.startswith("grant "))
        assert "sci" in grant and "L2" in grant
        data = json.loads(bursar(*change, "--what-if", "--json").stdout)
        assert [d["kind"] for d in data["decisions"]] == ["CAMPAIGN", "GRANT"]
        assert _journal(server) == before and not got
        with AdminClient(server.address, server.admin_token) as a:
            assert a.get_campaign("sci").spec.envelopes["gpu"].burst == 8

        assert bursar(*change).exit_code == 0  # now for real: the waiting request is granted
        waiter.join(10)
    lease: Lease = got["lease"]
    assert lease.id == "L2" and json.loads(data["decisions"][1]["json"])["lease_id"] == "L2"
