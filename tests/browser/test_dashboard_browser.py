"""The dashboard in Debian's headless Chromium, driven by Playwright: clicks, not only a
page load (skipped where /usr/bin/chromium or playwright is missing, unless
BURSAR_REQUIRE_SYSTEM_TESTS=1: then it fails).

The broker runs on its own event loop in a thread (Playwright's synchronous API owns the
test's); the test acts on it through the gRPC API, as a campaign would."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from conftest import CHROMIUM, missing_system_part, open_dashboard
from service_support import LIFECYCLE, START, config

from bursar.broker.clock import SYSTEM, Clock, ManualClock
from bursar.broker.dashboard.login import login_link
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.local import on_thread
from bursar.broker.service.server import Running, Settings, running
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg


@contextmanager
def broker_thread(
    state_dir: Path, clock: Clock = SYSTEM, text: str = LIFECYCLE
) -> Iterator[tuple[Running, dict[str, str], str]]:
    """A broker (on config ``text``) with its dashboard on a free port, in a thread of its
    own; yields it, the campaign tokens and the admin token."""
    settings = Settings(
        state_dir=state_dir,
        config=config(text),
        port=0,
        metrics_port=None,
        dashboard_port=0,
        limits=LimitSettings(rate=10_000, burst=10_000, max_streams=64),
        grace_s=1.0,
        clock=clock,
    )
    with on_thread(lambda: running(settings), name="bursar-dashboard-broker") as r:
        tokens = json.loads((state_dir / "tokens.json").read_text())
        admin = r.core.admin_token_path.read_text().strip()
        yield r, tokens, admin


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _acquire(stub: pbg.BrokerStub, token: str, gpus: float) -> pb.Lease:
    req = pb.AcquireRequest(size={"gpu": gpus}, duration_s=600)
    return stub.Acquire(req, metadata=_md(token)).lease


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
        page = open_dashboard(browser, r.dashboard_url, admin)
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


def test_the_supply_panel_shows_the_power_draw_against_the_cap(
    browser: Any, tmp_path: Path
) -> None:
    """With a power cap, the supply panel says the draw, the headroom and the power price,
    and a meter shows the draw against the cap; a grant moves both."""
    text = LIFECYCLE.replace(
        "[pool.groups.w]\ncount = 2", "[pool.groups.w]\nidle_w = 500\npeak_w = 2100\ncount = 2"
    ).replace("[policy]\n", "[policy]\npower_cap_w = 6000\n")
    with (
        broker_thread(tmp_path / "s", text=text) as (r, tokens, admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        page = open_dashboard(browser, r.dashboard_url, admin)
        draw = page.locator('#supply dt[data-field="power.draw_w"] + dd b')
        draw.wait_for()
        assert draw.inner_text() == "1000 W of 6000 W"  # two warm nodes idle
        meter = page.locator("#power-meter")
        assert meter.is_visible() and meter.get_attribute("max") == "6000"
        _acquire(pbg.BrokerStub(ch), tokens["sci"], 8)  # 1,600 W by default
        page.wait_for_function(
            "document.querySelector('#supply dt[data-field=\"power.draw_w\"] + dd b')"
            ".textContent === '2600 W of 6000 W'"
        )
        assert page.evaluate("document.querySelector('#power-meter').value") == 2600
        headroom = page.locator('#supply dt[data-field="power.headroom_w"] + dd b')
        assert headroom.inner_text() == "3400 W"
        assert not page.errors  # type: ignore[attr-defined]


def test_the_page_shows_a_new_grant_within_a_second(browser: Any, tmp_path: Path) -> None:
    with (
        broker_thread(tmp_path / "s") as (r, tokens, admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        stub = pbg.BrokerStub(ch)
        page = open_dashboard(browser, r.dashboard_url, admin)
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
        page = open_dashboard(browser, r.dashboard_url, tokens["sci"])
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


def _watch_failures(page: Any) -> list[str]:
    """Every response of 400 or more, every failed request and every uncaught error of the
    page, as it goes."""
    bad: list[str] = []
    page.on("pageerror", lambda exc: bad.append(f"error {exc}"))
    page.on("response", lambda r: r.status >= 400 and bad.append(f"{r.status} {r.url}"))
    page.on("requestfailed", lambda r: bad.append(f"failed {r.url} {r.failure}"))
    return bad


def _fits(page: Any) -> bool:
    """No page wider than its window, and the journal wraps inside its own card (rather
    than scrolling there)."""
    return page.evaluate(
        """() => {
            const root = document.documentElement, card = document.querySelector('#journal')
                .closest('section');
            return root.scrollWidth <= root.clientWidth && card.scrollWidth <= card.clientWidth;
        }"""
    )


def _steps(page: Any, campaign: str) -> list[list[float]]:
    sel = f'#pool-chart path[data-campaign="{campaign}"]'
    return json.loads(page.get_attribute(sel, "data-steps"))


def _decided_at(r: Running, lease_id: str) -> dict[str, float]:
    rows, _ = r.core.runtime.journal.find_decisions(ref=lease_id, limit=100)
    return {d["kind"]: d["at"] for _s, _i, d in rows}


def test_the_chart_draws_each_lease_from_its_grant_to_its_end_as_the_journal_says(
    browser: Any, tmp_path: Path
) -> None:
    clock = ManualClock(START)
    with (
        broker_thread(tmp_path / "s", clock) as (r, tokens, _admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        stub = pbg.BrokerStub(ch)
        clock.advance(10)
        first = _acquire(stub, tokens["sci"], 2)
        clock.advance(30)
        stub.Release(pb.ReleaseRequest(lease_id=first.lease_id), metadata=_md(tokens["sci"]))
        clock.advance(10)
        second = _acquire(stub, tokens["sci"], 5)
        # Opened after both grants and the release: the chart still shows them, at their
        # journal times (not from when the page first asked).
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        failures = _watch_failures(page)
        page.goto(login_link(r.core, r.dashboard_url))
        page.wait_for_selector("#live.on")
        at = _decided_at(r, first.lease_id)
        assert _steps(page, "sci") == [
            [START, 0],
            [at["grant"], 2],
            [at["release"], 0],
            [_decided_at(r, second.lease_id)["grant"], 5],
        ]
        assert (at["grant"], at["release"]) == (START + 10, START + 40)
        assert _steps(page, "other") == [[START, 0]]
        # Drawn as steps (a horizontal run, then a vertical jump), on labelled axes.
        d = page.get_attribute('#pool-chart path[data-campaign="sci"]', "d")
        assert d.count("V") == 3 and "L" not in d
        assert page.locator("#pool-chart text.ytick").count() >= 2
        assert page.locator("#pool-chart text.xtick").count() >= 1
        assert page.locator("#pool-chart text.label").all_text_contents() == [
            "time (UTC)",
            "GPUs held",
        ]
        # Live: the end of the second lease is drawn when the broker decides it.
        clock.advance(20)
        row = page.locator(f'#leases tr[data-lease-id="{second.lease_id}"]')
        row.locator("button.revoke").click()
        page.wait_for_selector("#revoke-dialog[open]")
        long_reason = "a-reason-with-no-spaces-" * 8  # 192 characters, the most is 200
        page.fill("#revoke-reason", long_reason)
        page.click("#revoke-confirm")
        page.wait_for_function(
            "JSON.parse(document.querySelector('#pool-chart path[data-campaign=\"sci\"]')"
            ".dataset.steps).length === 5"
        )
        assert _steps(page, "sci")[-1] == [_decided_at(r, second.lease_id)["revoke"], 0]
        assert _decided_at(r, second.lease_id)["revoke"] == START + 70
        # The long journal row wraps: no page wider than its window, wide or narrow.
        page.wait_for_function(
            "document.querySelector('#journal tbody').innerText.includes('a-reason-with')"
        )
        assert _fits(page)
        page.set_viewport_size({"width": 640, "height": 900})
        page.wait_for_timeout(200)
        assert _fits(page)
        # The supply card says what its figures mean.
        warm = page.locator('#supply dt[data-field="warm_free"]')
        assert warm.inner_text() == "warm free" and "idle" in warm.get_attribute("title")
        assert "ready now" in page.locator("#supply").inner_text()
        # Every resource the page loaded was found (the icon too), and nothing threw.
        assert page.request.get(r.dashboard_url + "favicon.ico").status == 200
        assert failures == []
        page.close()


def test_waiting_times_advance_with_the_page_clock(browser: Any, tmp_path: Path) -> None:
    clock = ManualClock(START)
    with (
        broker_thread(tmp_path / "s", clock) as (r, tokens, admin),
        grpc.insecure_channel(r.address) as ch,
    ):
        stub = pbg.BrokerStub(ch)
        _acquire(stub, tokens["sci"], 24)  # the whole pool
        waiting = stub.Acquire.future(
            pb.AcquireRequest(size={"gpu": 8}, duration_s=600, timeout_s=3600),
            metadata=_md(tokens["other"]),
        )
        try:
            page = open_dashboard(browser, r.dashboard_url, admin)
            cell = page.locator("#queue td.waited")
            cell.wait_for()
            clock.advance(5)  # the page learns the broker's time from its next state
            first = float(cell.inner_text())
            page.wait_for_timeout(2100)
            # The broker's clock stood still; the page counts on from its offset to it.
            assert clock.now() == START + 5
            assert float(cell.inner_text()) >= first + 1.5
            page.close()
        finally:
            waiting.cancel()


def test_the_login_link_signs_in_once_with_a_cookie_scripts_cannot_read(
    browser: Any, tmp_path: Path
) -> None:
    with broker_thread(tmp_path / "s") as (r, _tokens, _admin):
        link = login_link(r.core, r.dashboard_url)
        context = browser.new_context()
        page = context.new_page()
        failures = _watch_failures(page)
        page.goto(link)
        page.wait_for_selector("#live.on")
        assert page.url == r.dashboard_url  # redirected to the clean URL
        assert page.inner_text("#caller") == "admin"
        assert page.evaluate("document.cookie") == ""
        [cookie] = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert failures == []
        # Reload: still signed in (the cookie), without the code.
        page.reload()
        page.wait_for_selector("#live.on")
        # The same link again, in another browser: refused, nothing signed in.
        other = browser.new_context()
        again = other.new_page()
        assert again.goto(link).status == 403
        assert other.cookies() == []
        again.goto(r.dashboard_url)
        again.wait_for_selector("#signin-panel:not([hidden])")
        assert again.inner_text("#signin-error") == ""
        other.close()
        # Signing out ends the session on the broker: a reload asks again.
        page.click("#signout")
        page.wait_for_selector("#signin-panel:not([hidden])")
        page.wait_for_timeout(200)
        page.reload()
        page.wait_for_selector("#signin-panel:not([hidden])")
        page.wait_for_timeout(500)
        assert page.locator("#board").is_hidden()
        context.close()


def test_the_screenshot_script_photographs_the_dashboard(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        missing_system_part(f"{CHROMIUM} is not installed (scripts/system-deps.sh installs it)")
    out = tmp_path / "dashboard.png"
    script = Path(__file__).resolve().parent.parent.parent / "scripts" / "dashboard_screenshot.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
