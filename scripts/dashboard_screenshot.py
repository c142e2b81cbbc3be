"""Regenerate docs/dashboard.png: the dashboard photographed during the demo's service part.

Runs part two of ``bursar demo`` (agents against the real broker service) with the broker
serving its dashboard, signs in as the admin through a one-time login link in Debian's
headless Chromium (Playwright, never ``playwright install``), and keeps the view with the
most leases and queued requests on screen (the busiest moment of the session).

    python scripts/dashboard_screenshot.py [--out docs/dashboard.png] [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from rich.console import Console

from bursar.broker.dashboard.login import login_link
from bursar.broker.service.server import Running
from bursar.sim.demo_service import session

CHROMIUM = "/usr/bin/chromium"
EVERY_S = 0.3
"""How often the page is looked at during the session."""


async def photograph(out: Path, state_dir: Path) -> int:
    from playwright.async_api import async_playwright

    best: tuple[int, bytes] = (-1, b"")

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:

            async def watch(server: Running) -> None:
                nonlocal best
                page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                # Signed in as an operator is: the one-time login link `bursar serve` prints.
                await page.goto(login_link(server.core, server.dashboard_url))
                await page.wait_for_selector("#live.on")
                while True:
                    rows = await page.locator("#leases tbody tr, #queue tbody tr").count()
                    if rows >= best[0]:
                        best = (rows, await page.screenshot(full_page=True))
                    await asyncio.sleep(EVERY_S)

            await session(state_dir, Console(quiet=True), watch=watch)
        finally:
            await browser.close()
    if best[0] < 0:
        raise SystemExit("the dashboard was never shown: no screenshot")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(best[1])
    return best[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = args.state_dir or Path(tmp) / "state"
        rows = asyncio.run(photograph(args.out, state))
    print(f"wrote {args.out} ({rows} lease and queue rows on screen)")


if __name__ == "__main__":
    main()
