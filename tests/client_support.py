"""Helpers for the client tests: a broker on its own event loop in a thread (for the sync
facade and the CLI, whose calls block the test's thread), built on service_support."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from service_support import Client, serve

from bursar.testing import on_thread
from bursar.testing import poll_until as until

__all__ = ["ServerThread", "server_thread", "until"]


class ServerThread:
    """``service_support.serve`` on a private loop in a daemon thread (``bursar.testing``'s
    ``on_thread``), for tests whose calls block their own thread."""

    def __init__(self, state_dir: Path, **settings: Any) -> None:
        self.state_dir = state_dir
        self.settings = settings
        self.client: Client | None = None
        self._stack = ExitStack()

    def start(self) -> ServerThread:
        def make() -> AbstractAsyncContextManager[Client]:
            return serve(self.state_dir, **self.settings)

        self.client = self._stack.enter_context(on_thread(make, name="bursar-test-server"))
        return self

    def stop(self) -> None:
        self._stack.close()

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
