"""An asyncio event loop on a daemon thread, for synchronous APIs built on async code.

The sync client (``BrokerClient``) and the lease blocks of the synchronous plugin APIs
(Parsl's provider, Ray's node provider) each keep one: async code runs there, and
:meth:`LoopThread.call` runs a coroutine on it from any other thread and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An event loop running forever on a daemon thread named ``name``; ``owner`` names
    what uses it in the errors a misuse gets."""

    def __init__(self, name: str, owner: str = "this loop") -> None:
        self.owner = owner
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (at most ``timeout`` seconds)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                f"{self.owner} was called from its own event-loop thread (from a callback?); "
                "that would deadlock: do the work in another thread"
            )
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError(f"{self.owner} is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()  # KeyboardInterrupt, a timeout: do not leave the call running
            raise

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` on the loop (from any thread); nothing if it is closed."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)

    def wait_set(self, events: list[asyncio.Event], timeout: float | None) -> None:
        """Wait, from another thread, until every one of the loop's ``events`` is set, or
        ``timeout``."""

        async def all_set() -> None:
            waits = [asyncio.ensure_future(e.wait()) for e in events]
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for w in pending:
                w.cancel()

        if events:
            self.call(all_set())

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and close it. Idempotent; from the
        loop's own thread (a callback) it does nothing, since it cannot wait for itself."""
        if self.loop.is_closed():
            return

        async def finish() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        if threading.current_thread() is self._thread:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(finish(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()
