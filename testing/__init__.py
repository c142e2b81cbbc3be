"""Support for testing code that uses Bursar, and for Bursar's own tests.

- :func:`local_broker`: a real broker (real gRPC on a loopback port, a real journal in a
  temporary directory) served on a thread of the test's process; :func:`on_thread`
  serves any async context manager that way (a broker with its test client, say).
- :class:`ManualClock`: a clock that moves only when the test says (``advance``, ``set``);
  :class:`AutojumpClock`: one that jumps to the next sleeper's deadline once the event loop
  is idle (as trio's ``MockClock(autojump_threshold=0)``). Hand either to the broker
  (``local_broker(clock=...)``) or to any code that takes a ``Clock``.
- :func:`poll_until` and :func:`apoll_until`: wait for a condition that something else
  brings about (another thread, another process), failing with the last value seen.

Only the wall clock paces :func:`poll_until`: it is for what the test does not drive.
Time the code under test reads comes from the clock handed to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from bursar.broker.clock import AutojumpClock, ManualClock
from bursar.broker.service.local import SMALL_POOL, LocalBroker, local_broker, on_thread

__all__ = [
    "SMALL_POOL",
    "AutojumpClock",
    "LocalBroker",
    "ManualClock",
    "apoll_until",
    "local_broker",
    "on_thread",
    "poll_until",
]

T = TypeVar("T")


class _Poll:
    """One poll's deadline and the last value seen, for the failure message."""

    def __init__(self, timeout_s: float, what: str) -> None:
        if not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s!r}")
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.what = what

    def expired(self, last: Any) -> bool:
        if time.monotonic() <= self.deadline:
            return False
        raise AssertionError(
            f"{self.what}: not reached within {self.timeout_s:g} s; last seen: {_short(last)}"
        )


def _short(x: Any, most: int = 500) -> str:
    text = repr(x)
    return text if len(text) <= most else text[:most] + f"... ({len(text)} characters)"


def poll_until(
    check: Callable[[], T],
    timeout_s: float = 10.0,
    what: str = "the condition",
    *,
    ok: Callable[[T], object] = bool,
    interval_s: float = 0.02,
) -> T:
    """Call ``check`` every ``interval_s`` until ``ok`` holds for what it returns (by
    default: until it returns something true), and return that; after ``timeout_s`` (real
    seconds), fail with ``what`` and the last value ``check`` returned. Give ``ok`` when
    the value is worth seeing in a failure (``check`` reads a state, ``ok`` says which
    one is awaited). Exceptions from ``check`` propagate at once."""
    poll = _Poll(timeout_s, what)
    while True:
        got = check()
        if ok(got) or poll.expired(got):
            return got
        time.sleep(interval_s)


async def apoll_until(
    check: Callable[[], T | Awaitable[T]],
    timeout_s: float = 10.0,
    what: str = "the condition",
    *,
    ok: Callable[[T], object] = bool,
    interval_s: float = 0.01,
) -> T:
    """:func:`poll_until` for a test on an event loop: ``check`` may be a coroutine
    function, and the loop runs between tries (``asyncio.sleep``)."""
    poll = _Poll(timeout_s, what)
    while True:
        got = check()
        if asyncio.iscoroutine(got) or isinstance(got, asyncio.Future):
            got = await got
        if ok(got) or poll.expired(got):  # type: ignore[arg-type]
            return got  # type: ignore[return-value]
        await asyncio.sleep(interval_s)
