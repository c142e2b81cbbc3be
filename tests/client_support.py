"""Helpers for the client tests: a broker on its own event loop in a thread (for the sync
facade and the CLI, whose calls block the test's thread), built on service_support."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from service_support import Client, serve


class ServerThread:
    """``service_support.serve`` running on a private loop in a daemon thread."""

    def __init__(self, state_dir: Path, **settings: Any) -> None:
        self.state_dir = state_dir
        self.settings = settings
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.client: Client | None = None
        self._thread = threading.Thread(target=self._main, name="bursar-test-server", daemon=True)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with serve(self.state_dir, **self.settings) as c:
            self.client = c
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(20):
            raise TimeoutError("the test server did not start")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)

    @property
    def address(self) -> str:
        assert self.client is not None
        return self.client.address

    @property
    def port(self) -> int:
        assert self.client is not None
        return self.client.running.port

    @property
    def tokens(self) -> dict[str, str]:
        assert self.client is not None
        return self.client.tokens

    @property
    def admin_token(self) -> str:
        assert self.client is not None
        return self.client.admin_token


@contextmanager
def server_thread(state_dir: Path, **settings: Any) -> Iterator[ServerThread]:
    s = ServerThread(state_dir, **settings).start()
    try:
        yield s
    finally:
        s.stop()


def until(
    check: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition", step: float = 0.05
) -> Any:
    """Poll ``check`` from a blocking test until it returns something true; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s} s")
        time.sleep(step)
