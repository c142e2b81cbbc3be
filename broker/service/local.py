"""A broker served on a background thread of this process, on a loopback port: for the
examples and benchmarks (Parsl, Dask, Ray), which need one and should not ask the reader
to start ``bursar serve`` first, and for tests (``bursar.testing``). Production use runs
``bursar serve``.

``on_thread`` is the general form: any async context manager entered on a private event
loop in a daemon thread, its value handed to the calling thread, and left when the
calling thread's ``with`` ends."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bursar.broker.config import Config, parse_config
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.server import Settings, running

__all__ = ["SMALL_POOL", "LocalBroker", "local_broker", "on_thread"]

T = TypeVar("T")

SMALL_POOL = """
[pool]
boot_latency_s = 1
[pool.groups.node]
count = 2
warm = 2
gpu = 0
cpu = 4
mem_gb = 16
[policy]
grace_s = 2
min_retry_s = 0.5
[policy.warm_headroom]
cpu = 0

[campaigns.sci]
class = "batch"
[campaigns.sci.cpu]
sustained = 8
burst = 8
[campaigns.sci.mem_gb]
sustained = 32
burst = 32
"""
"""Two warm 4-core nodes and one campaign, ``sci``, that may use all of them."""


@dataclass(frozen=True)
class LocalBroker:
    address: str
    tokens: dict[str, str]
    admin_token: str
    state_dir: Path


@contextmanager
def local_broker(
    config_text: str = SMALL_POOL,
    state_dir: Path | None = None,
    *,
    config: Config | None = None,
    **settings: Any,
) -> Iterator[LocalBroker]:
    """Serve a broker with ``config_text`` (TOML), or an already parsed ``config``, on
    127.0.0.1, any free port. ``settings`` override the server's :class:`Settings` (e.g.
    ``backend=SlurmPool(...)``, ``grace_s``, ``limits``, ``clock=ManualClock(...)``)."""
    tmp = None
    if state_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="bursar-state-")
        state_dir = Path(tmp.name)
    fields: dict[str, Any] = {
        "limits": LimitSettings(rate=10_000, burst=10_000, max_streams=64),
        "grace_s": 1.0,
        **settings,
    }
    server = Settings(
        state_dir=state_dir,
        config=config or parse_config(config_text, "toml", source="<local_broker>"),
        port=0,
        metrics_port=None,
        **fields,
    )
    try:
        with on_thread(lambda: running(server), name="bursar-local-broker") as r:
            tokens_file = state_dir / "tokens.json"
            tokens = json.loads(tokens_file.read_text()) if tokens_file.exists() else {}
            admin = r.core.admin_token_path.read_text().strip()
            yield LocalBroker(r.address, tokens, admin, state_dir)
    finally:
        if tmp is not None:
            tmp.cleanup()


@contextmanager
def on_thread(
    make: Callable[[], AbstractAsyncContextManager[T]],
    *,
    name: str = "bursar-on-thread",
    timeout_s: float = 30.0,
) -> Iterator[T]:
    """Enter ``make()`` (an async context manager: a broker, a test server) on a private
    event loop in a daemon thread and yield what it gives; leave it, on that loop, when
    the caller's ``with`` ends. A failure to enter is raised here, in the caller's thread;
    so is one on the way out. For callers whose calls block their own thread (a sync
    client, the CLI, Parsl or Dask): they cannot share an event loop with the broker."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        box["stop"] = (asyncio.get_running_loop(), stop)
        async with make() as value:
            box["value"] = value
            ready.set()
            await stop.wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    if not ready.wait(timeout_s):
        raise TimeoutError(f"{name}: not started within {timeout_s:g} s")
    if "error" in box:
        raise RuntimeError(f"{name}: did not start: {box['error']!r}") from box["error"]
    try:
        yield box["value"]
    finally:
        loop, stop = box["stop"]
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout_s)
    if "error" in box:
        raise RuntimeError(f"{name}: failed on the way out: {box['error']!r}") from box["error"]
