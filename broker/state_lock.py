"""One broker per state directory: the exclusive lock on ``STATE/serve.lock``.

``bursar serve`` holds it while it serves, and the commands that write a stopped broker's
journal (``bursar journal``'s repairs, ``bursar policy apply --state-dir``) take it first,
so that none of them writes under a running broker. A ``flock``: the kernel drops it when
the holder dies, even on SIGKILL, so no stale lock outlives a crash.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["LOCK_FILE", "try_lock"]

LOCK_FILE = "serve.lock"


def try_lock(state_dir: Path) -> int | None:
    """Take the state directory's lock: its file descriptor (close it to let go), or None
    when another process holds it."""
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
