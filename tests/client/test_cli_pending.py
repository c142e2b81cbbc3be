"""A new user's question, from the CLI: why is my request waiting, and when will it run?
``bursar leases list --pending`` against a broker in another thread, and the CLI's one way
of writing times and durations."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from client_support import ServerThread, server_thread, until
from hypothesis import given
from hypothesis import strategies as st

from bursar.cli.console import human_duration, iso_time
from bursar.cli.main import main
from bursar.providers.client import BrokerClient, PendingRequest, ReasonCode, Refused


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    with server_thread(tmp_path / "state") as s:
        yield s


def bursar(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def test_leases_list_pending_says_why_and_for_how_long(server: ServerThread) -> None:
    env = {"BURSAR_TARGET": server.address, "BURSAR_TOKEN": server.tokens["other"]}
    with (
        BrokerClient(server.address, server.tokens["sci"]) as sci,
        BrokerClient(server.address, server.tokens["other"]) as other,
    ):
        held = sci.acquire({"gpu": 24}, 300)  # every GPU of the pool, for 5 minutes
        outcome: list[object] = []
        updates: list[PendingRequest] = []

        def wait() -> None:
            try:
                lease = other.acquire(
                    {"gpu": 8},
                    60,
                    timeout=30,
                    labels={"job": "b"},
                    on_queued=updates.append,  # the library's answer to the same question
                    queued_poll_s=0.05,
                )
                outcome.append(lease)
            except Refused as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        try:
            until(lambda: other.list_pending(), what="the request to queue")
            res = bursar("leases", "list", "--pending", env=env)
            assert res.exit_code == 0, res.output
            row = next(ln for ln in res.stdout.splitlines() if " other " in f" {ln} ")
            # Why: the pool is full. When: in about 5 minutes (the lease holding it ends).
            assert "pool_full" in row and "8 gpu" in row and "job=b" in row
            assert re.search(r"\b[45]m\d\ds\b", row), row
            assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", res.stdout)

            res = bursar("leases", "list", "--pending", "--json", env=env)
            (item,) = json.loads(res.stdout)
            assert item["reason"] == "POOL_FULL" and item["position"] == 1
            assert isinstance(item["estimated_wait_s"], float)
            assert 240 < item["estimated_wait_s"] <= 301
            assert item["reserved_at"] is None and item["campaign"] == "other"
            until(lambda: updates, what="the on_queued update")
        finally:
            sci.release(held.id)
            waiter.join(30)
        assert outcome and not isinstance(outcome[0], Refused)
        assert updates and updates[0].reason is ReasonCode.POOL_FULL
        assert updates[0].request_id == outcome[0].id  # type: ignore[attr-defined]
        assert 240 < updates[0].estimated_wait_s <= 301
        res = bursar("leases", "list", "--pending", env=env)
        assert "no requests waiting" in res.stdout


def test_iso_time_is_utc_to_the_millisecond() -> None:
    assert iso_time(1_750_000_000.25) == "2025-06-15T15:06:40.250Z"
    assert iso_time(float("inf")) == "never"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.5, "0.5s"), (3, "3s"), (42, "42s"), (116, "1m56s"), (3900, "1h05m"), (90000, "1d01h")],
)
def test_human_duration_reads_like_a_person_writes(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text


@given(st.floats(min_value=0, max_value=1e7), st.floats(min_value=0, max_value=1e7))
def test_human_duration_never_orders_two_durations_the_wrong_way(a: float, b: float) -> None:
    def back(text: str) -> float:
        units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
        return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)([dhms])", text))

    # The text is a truncation of the value, never more than it, in its own leading unit.
    if a <= b:
        assert back(human_duration(a)) <= back(human_duration(b)) + 0.05
