"""``bursar explain ID`` against a real `bursar serve` process: a request queued behind
its campaign's burst ceiling (the reason, the figure that binds, its place and estimated
start), a released lease (how and when it ended), a live one, and an unknown id."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from client_support import until
from server import Server
from service_support import LIFECYCLE

from bursar.cli.explain import REASONS
from bursar.cli.main import main
from bursar.providers.client import BrokerClient, Refused


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("broker")
    cfg = root / "pool.toml"
    # sci's burst ceiling at 16 GPUs, in a pool of 24 (16 warm, 8 cold).
    cfg.write_text(LIFECYCLE.replace("burst = 24", "burst = 16", 1))
    with Server(root / "state", "--config", str(cfg), timeout_s=30) as s:
        yield s


def bursar(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def as_(s: Server, who: str) -> list[str]:
    if who == "admin":
        return ["--target", s.address, "--admin-token-file", str(s.state_dir / "admin.token")]
    return ["--target", s.address, "--token", s.tokens()[who]]


def test_a_request_behind_its_burst_ceiling_and_a_released_lease(broker: Server) -> None:
    tokens = broker.tokens()
    with BrokerClient(broker.address, tokens["sci"]) as sci:
        held = [sci.acquire({"gpu": 8}, 600, blocking=False)]
        # 16 more GPUs would take sci to 24 > its burst of 16 (the pool has them): it queues.
        outcome: list[object] = []

        def ask() -> None:
            with BrokerClient(broker.address, tokens["sci"]) as mine:
                try:
                    outcome.append(mine.acquire({"gpu": 16}, 300, timeout=30))
                except Refused as exc:
                    outcome.append(exc)

        waiter = threading.Thread(target=ask)
        waiter.start()
        try:
            queued = until(lambda: sci.list_pending(), 10, "the request queued")[0]
            res = bursar("explain", queued.request_id, *as_(broker, "sci"))
            assert res.exit_code == 0, res.output
            lines = res.stdout.splitlines()
            assert lines[0] == (
                f"request {queued.request_id} (sci) for gpu=16, 5m00s, is waiting: "
                f"{REASONS['ABOVE_BURST']}."
            )
            assert lines[1] == "  burst ceiling gpu=16: holding 8, asking 16"
            assert "number 1 in the admission order" in lines[2]
            assert lines[3].startswith("Estimated start: ")

            # The admin sees the same, as JSON.
            res = bursar("explain", queued.request_id, *as_(broker, "admin"), "--json")
            out = json.loads(res.stdout)
            assert out["status"] == "waiting" and out["request"]["reason"] == "ABOVE_BURST"
            assert "burst ceiling gpu=16: holding 8, asking 16" in out["explanation"][1]

            # Released: the request is granted, and the released lease is explained.
            sci.release(held[0].id)
            waiter.join(20)
            granted = outcome[0]
            assert not isinstance(granted, Refused), granted
        finally:
            for lease in held[1:]:
                sci.release(lease.id)
            waiter.join(20)
        res = bursar("explain", held[0].id, *as_(broker, "sci"))
        assert res.exit_code == 0, res.output
        first, second = res.stdout.splitlines()[:2]
        assert first.startswith(
            f"lease {held[0].id} (sci) for gpu=8 was released by its holder at "
        )
        assert second.startswith("It had been granted ") and "on the warm path" in second

        # Live: the lease the queued request became.
        live_id = granted.id  # type: ignore[attr-defined]
        res = bursar("explain", live_id, *as_(broker, "sci"), "--json")
        out = json.loads(res.stdout)
        assert out["status"] == "live"
        assert out["explanation"][0].startswith(f"lease {live_id} (sci) for gpu=16 is active on ")
        sci.release(live_id)


def test_a_request_that_timed_out_was_never_granted(broker: Server) -> None:
    with BrokerClient(broker.address, broker.tokens()["sci"]) as sci:
        held = sci.acquire({"gpu": 8}, 60, blocking=False)
        try:
            with pytest.raises(Refused) as refused:  # 8 + 16 is above the burst of 16
                sci.acquire({"gpu": 16}, 60, timeout=0.2)
        finally:
            sci.release(held.id)
    request_id = refused.value.metadata["request_id"]
    res = bursar("explain", request_id, *as_(broker, "admin"))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"request {request_id} was never granted:"
    assert lines[1].startswith("  queued at ") and lines[1].endswith(REASONS["ABOVE_BURST"])


def test_an_unknown_id_is_a_clear_error(broker: Server) -> None:
    res = bursar("explain", "L9999", *as_(broker, "admin"))
    assert res.exit_code == 1 and res.stdout == ""
    assert res.stderr.startswith("error: no request or lease 'L9999': nothing waits")


def test_another_campaigns_lease_is_not_explained_to_a_campaign_token(broker: Server) -> None:
    with BrokerClient(broker.address, broker.tokens()["other"]) as other:
        lease = other.acquire({"gpu": 8}, 60, blocking=False)
        try:
            res = bursar("explain", lease.id, *as_(broker, "sci"))
            assert res.exit_code == 1 and "OTHER_CAMPAIGN" in res.stderr
        finally:
            other.release(lease.id)


def test_explain_is_listed(tmp_path: Path) -> None:
    res = bursar("--help")
    assert "explain" in res.stdout
