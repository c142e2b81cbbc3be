"""A broker served on a background thread of this process, on a loopback port: for the
examples and benchmarks (Parsl, Dask, Ray), which need one and should not ask the reader
to start ``bursar serve`` first. Production use runs ``bursar serve``."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bursar.broker.config import Config, parse_config
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.server import Settings, running

__all__ = ["SMALL_POOL", "LocalBroker", "local_broker"]

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
    ready = threading.Event()
    box: dict[str, object] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with running(server) as r:
            box["address"] = r.address
            box["admin"] = r.core.admin_token_path.read_text().strip()
            box["stop"] = (asyncio.get_running_loop(), stop)
            ready.set()
            await stop.wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=main, name="bursar-local-broker", daemon=True)
    thread.start()
    if not ready.wait(30) or "error" in box:
        raise RuntimeError(f"the broker did not start: {box.get('error')!r}")
    tokens_file = state_dir / "tokens.json"
    tokens = json.loads(tokens_file.read_text()) if tokens_file.exists() else {}
    try:
        yield LocalBroker(str(box["address"]), tokens, str(box["admin"]), state_dir)
    finally:
        loop, stop = box["stop"]  # type: ignore[misc]
        loop.call_soon_threadsafe(stop.set)  # type: ignore[attr-defined]
        thread.join(30)
        if tmp is not None:
            tmp.cleanup()
