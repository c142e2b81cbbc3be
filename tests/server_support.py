"""``bursar serve`` as a real process, for the tests that start one: the reliability
suite's process helper (``benchmarks/reliability/server.py``, on the path through
``conftest.py``) with a 3 s shutdown grace. A module of its own because the worker
processes that import the other support modules do not have that path."""

from __future__ import annotations

from pathlib import Path

from server import Server as SharedServer


class Server(SharedServer):
    """The reliability suite's ``bursar serve`` process helper, with a 3 s shutdown grace."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        super().__init__(state_dir, "--grace", "3", *args, timeout_s=20)
