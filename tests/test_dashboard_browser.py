"""The dashboard in Debian's headless Chromium, driven by Playwright: clicks, not only a
page load (skipped where /usr/bin/chromium or playwright is missing, unless
BURSAR_REQUIRE_SYSTEM_TESTS=1: then it fails).

The broker runs on its own event loop in a thread (Playwright's synchronous API owns the
test's); the test acts on it through the gRPC API, as a campaign would."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from service_support import config

from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.server import Running, Settings, running
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

CHROMIUM = Path("/usr/bin/chromium")


def _missing(why: str) -> None:
    if os.environ.get("BURSAR_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(f"{why}: run scripts/system-deps.sh (as root) and install the dev extra")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        _missing(f"{CHROMIUM} is not installed (scripts/system-deps.sh installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (the dev extra has it)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


@contextmanager
def broker_thread(state_dir: Path) -> Iterator[tuple[Running, dict[str, str], str]]:
    """A broker with its dashboard on a free port, in a thread of its own; yields it, the
    campaign tokens and the admin token."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        settings = Settings(
            state_dir=state_dir,
            config=config(),
            port=0,
            metrics_port=None,
            dashboard_port=0,
            limits=LimitSettings(rate=10_000, burst=10_000, max_streams=64),
            grace_s=1.0,
        )
        try:
            async with running(settings) as r:
                box["running"], box["loop"], box["stop"] = r, asyncio.get_running_loop(), stop
                started.set()
                await stop.wait()
        except BaseException as exc:
            box["error"] = exc
            started.set()
            raise

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert started.wait(30)
    if "error" in box:
        raise box["error"]
    r: Running = box["running"]
    tokens = json.loads((state_dir / "tokens.json").read_text())
    admin = r.core.admin_token_path.read_text().strip()
    try:
        yield r, tokens, admin
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)


def _acquire(stub: pbg.BrokerStub, token: str, gpus: float) -> pb.Lease:
    req = pb.AcquireRequest(size={"gpu": gpus}, duration_s=600)
    return stub.Acquire(req, metadata=(("authorization", f"Bearer {token}"),)).lease


def _open(browser: Any, url: str, token: str) -> Any:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(url)
    page.fill("#token", token)
    page.click("#signin button")
    page.wait_for_selector("#live.on")
    page.errors = errors  # type: ignore[attr-defined]
    return page


def test_an_admin_selects_a_campaign_opens_a_history_and_revokes(
    browser: Any, tmp_path: Path
) -> None:
    with (
        broker_thread(tmp_path / "s") as (r, tokens, admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        stub = pbg.BrokerStub(ch)
        sci = _acquire(stub, tokens["sci"], 2)
        other = _acquire(stub, tokens["other"], 1)
        page = _open(browser, r.dashboard_url, admin)
        page.wait_for_selector(f'#leases tr[data-lease-id="{other.lease_id}"]')
        # Select a campaign: the other campaign's lease leaves the table.
        page.select_option("#campaign", "sci")
        page.wait_for_selector(f'#leases tr[data-lease-id="{other.lease_id}"]', state="detached")
        assert page.locator("#leases tbody tr").count() == 1
        assert page.locator("#campaigns tr.selected").get_attribute("data-campaign") == "sci"
        assert page.locator("#pool-chart line.burst").count() == 1
        # A lease's history, from the journal, in ISO times.
        row = page.locator(f'#leases tr[data-lease-id="{sci.lease_id}"]')
        row.locator("button.history").click()
        page.wait_for_selector("#lease-dialog[open]")
        history = page.locator("#lease-history tbody").inner_text()
        assert "grant" in history and "T" in history and "Z" in history
        page.click("#lease-dialog form button")
        # Revoke, through the confirmation dialog.
        row.locator("button.revoke").click()
        page.wait_for_selector("#revoke-dialog[open]")
        page.fill("#revoke-reason", "browser test")
        page.click("#revoke-confirm")
        page.wait_for_selector(f'#leases tr[data-lease-id="{sci.lease_id}"]', state="detached")
        assert r.core.engine.ended[sci.lease_id].state.value == "revoked"
        page.wait_for_function(
            "document.querySelector('#journal tbody').innerText.includes('browser test')"
        )
        # Pause (after the browser's confirm) and resume a campaign.
        page.on("dialog", lambda d: d.accept())
        page.click('#campaigns tr[data-campaign="sci"] button.pause')
        page.wait_for_selector('#campaigns tr[data-campaign="sci"] button.pause:text("Resume")')
        assert r.core.engine.campaigns["sci"].spec.envelopes["gpu"].burst == 0
        page.click('#campaigns tr[data-campaign="sci"] button.pause')
        page.wait_for_selector('#campaigns tr[data-campaign="sci"] button.pause:text("Pause")')
        assert r.core.engine.campaigns["sci"].spec.envelopes["gpu"].burst == 24
        # The what-if panel: asks the broker, changes nothing.
        before = r.core.runtime.journal.last_seq
        page.select_option("#whatif-campaign", "sci")
        page.fill("#whatif-gpu", "4")
        page.click("#whatif button")
        page.wait_for_function("document.querySelector('#whatif-result').innerText.length > 0")
        assert "granted now" in page.inner_text("#whatif-result")
        assert r.core.runtime.journal.last_seq == before
        assert page.errors == []  # type: ignore[attr-defined]
        page.close()


def test_the_page_shows_a_new_grant_within_a_second(browser: Any, tmp_path: Path) -> None:
    with (
        broker_thread(tmp_path / "s") as (r, tokens, admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        stub = pbg.BrokerStub(ch)
        page = _open(browser, r.dashboard_url, admin)
        page.wait_for_selector("#campaigns tbody tr")
        waits = []
        for _ in range(3):
            t0 = time.monotonic()
            lease = _acquire(stub, tokens["sci"], 1)
            page.wait_for_selector(f'#leases tr[data-lease-id="{lease.lease_id}"]', timeout=5000)
            waits.append(time.monotonic() - t0)
        assert max(waits) < 1.0, waits
        page.close()


def test_a_campaign_token_cannot_see_another_campaign(browser: Any, tmp_path: Path) -> None:
    with (
        broker_thread(tmp_path / "s") as (r, tokens, _admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        stub = pbg.BrokerStub(ch)
        mine = _acquire(stub, tokens["sci"], 1)
        theirs = _acquire(stub, tokens["other"], 1)
        page = _open(browser, r.dashboard_url, tokens["sci"])
        page.wait_for_selector(f'#leases tr[data-lease-id="{mine.lease_id}"]')
        # Live too: the other campaign's next grant never reaches this page.
        later = _acquire(stub, tokens["other"], 1)
        newer = _acquire(stub, tokens["sci"], 1)
        page.wait_for_selector(f'#leases tr[data-lease-id="{newer.lease_id}"]')
        ids = page.eval_on_selector_all(
            "#leases tbody tr", "rows => rows.map(r => r.dataset.leaseId)"
        )
        assert sorted(ids) == sorted([mine.lease_id, newer.lease_id])
        options = page.eval_on_selector_all("#campaign option", "os => os.map(o => o.value)")
        assert options == ["", "sci"]
        assert "other" not in page.locator("#journal").inner_text()
        assert page.locator("button.revoke").count() == 0
        # The JSON endpoint, with the token the page holds: refused.
        for lease_id in (theirs.lease_id, later.lease_id):
            status = page.evaluate(
                """async (id) => (await fetch('/api/lease/' + id, {headers:
                    {Authorization: 'Bearer ' + sessionStorage.getItem('bursar.token')}})).status""",
                lease_id,
            )
            assert status == 403
        page.close()
