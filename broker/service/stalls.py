"""What held the event loop: a diagnostic for latency stalls, off unless
``BURSAR_STALL_LOG=1`` is set in the server's environment.

Every call of the service runs on one event loop, so anything synchronous that takes long
(a garbage collection, a journal commit that runs a WAL checkpoint, a long decision-index
update, the metrics refresh) delays every call in flight at once. When on, this logs
(logger ``bursar.broker.service.stalls``, WARNING, each line starting ``stall-log:``):

* every garbage collection over ``SLOW_S``, with its generation and how many objects the
  collector tracks;
* every journal append, commit (of a batch of appends), decision-index update and metrics
  refresh over ``SLOW_S``;
* every time a 10 ms heartbeat on the loop woke over ``SPELL_S`` late, with the time spent
  meanwhile in collections, in slow journal calls, waiting for a CPU (the kernel's
  run-queue wait of the loop's thread, from ``/proc/thread-self/schedstat``), and in the
  service's own work, each with how many calls: deciding (the runtime's ``submit`` and
  ``catch_up``: the engine and the journal appends), the journal appends on their own,
  and committing; and the longest call, with what it applied (the event's type and how
  many decisions it made). A spell that this work fills is a backlog: many calls arrived
  together and each waited for those before it. A stall with none of them points at
  something else (the gRPC and asyncio glue).

  The heartbeat reports spells from ``SPELL_S``, half of what counts as a slow call, so
  that a slow call made of a shorter spell plus its own work still finds its cause.

Each line gives ``mono``, the ``time.monotonic()`` at which what it reports ended (the same
clock in every process of the machine), so that a client can match its slow calls to it.

The wrappers go around the instances, not the classes: nothing changes when it is off.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from bursar.broker.runtime import Runtime
from bursar.broker.service.metrics import Metrics

__all__ = ["ENV", "StallLog", "enabled", "run_queue_wait_s"]

log = logging.getLogger(__name__)

ENV = "BURSAR_STALL_LOG"
SLOW_S = 0.1
"""What counts as slow: a call waiting this long notices."""
SPELL_S = 0.05
"""A heartbeat this late is reported."""
HEARTBEAT_S = 0.01
WORK = ("decide", "append", "commit")
"""The service's work, timed by what the heartbeat reports (see the module's docstring)."""


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def run_queue_wait_s() -> float:
    """Seconds this thread has spent runnable but waiting for a CPU (0 where the kernel
    does not say)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _what(label: str, args: tuple[Any, ...], result: object) -> str:
    """A call of work, for the log: what it was called with (an event's type) and how many
    decisions it returned."""
    what = label
    if args and not isinstance(args[0], int | float):
        what += f" {type(args[0]).__name__}"
    if isinstance(result, Sequence):
        what += f", {len(result)} decisions"
    return what


class StallLog:
    """The probes (see the module's docstring); ``install`` them, ``run`` the heartbeat,
    ``uninstall`` on the way out."""

    def __init__(self) -> None:
        self.gc_s = 0.0
        """Seconds spent in collections since the heartbeat last looked."""
        self.slow_calls: list[str] = []
        """Slow journal or metrics calls since the heartbeat last looked."""
        self._gc_started = 0.0
        self._gc_max = [0.0, 0.0, 0.0]
        self._gc_runs = [0, 0, 0]
        self._late_max = 0.0
        self._undo: list[Callable[[], None]] = []
        self.work: dict[str, list[float]] = {k: [0, 0.0] for k in WORK}
        """Calls and seconds of each kind of work since the heartbeat last looked; a call
        inside another (a commit while catching up) counts in the outer one only, except
        that appends are counted on their own as well (they are part of deciding)."""
        self._depth = 0
        self.longest: tuple[float, str] = (0.0, "")
        """The longest call of work since the heartbeat last looked, and what it was."""

    def install(self, runtime: Runtime, metrics: Metrics) -> None:
        gc.callbacks.append(self._on_gc)
        self._undo.append(lambda: gc.callbacks.remove(self._on_gc))
        journal = runtime.journal
        for name in ("append", "commit", "update_index"):
            self._wrap(journal, name, f"journal.{name}", name if name in WORK else None)
        self._wrap(metrics, "refresh", "metrics.refresh")
        for name in ("submit", "catch_up"):
            self._wrap(runtime, name, f"runtime.{name}", "decide")

    def uninstall(self) -> None:
        """Remove the probes and log a summary: collections per generation with the
        slowest of each, and the heartbeat's worst lateness."""
        while self._undo:
            self._undo.pop()()
        log.warning(
            "stall-log: summary: gc runs %s, slowest %s ms by generation; heartbeat at most "
            "%.0f ms late",
            self._gc_runs,
            [round(x * 1000, 1) for x in self._gc_max],
            self._late_max * 1000,
        )

    def _wrap(self, obj: object, name: str, label: str, work: str | None = None) -> None:
        inner = getattr(obj, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            gc0 = self.gc_s
            self._depth += 1
            result = None
            try:
                result = inner(*args, **kwargs)
                return result
            finally:
                self._depth -= 1
                dt = time.perf_counter() - t0
                # Appends are part of deciding: counted on their own as well, to say how
                # much of a decision's time was its journal entry.
                if work is not None and (self._depth == 0 or work == "append"):
                    tally = self.work[work]
                    tally[0] += 1
                    tally[1] += dt
                    if dt > self.longest[0] and work != "append":
                        self.longest = (dt, _what(label, args, result))
                if dt > SLOW_S:
                    in_gc = self.gc_s - gc0
                    what = f"{label} {dt * 1000:.0f} ms (gc {in_gc * 1000:.0f} ms of it)"
                    self.slow_calls.append(what)
                    log.warning("stall-log: mono %.3f: %s", time.monotonic(), what)

        setattr(obj, name, timed)
        self._undo.append(lambda: delattr(obj, name))

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        dt = time.perf_counter() - self._gc_started
        self.gc_s += dt
        gen = info["generation"]
        self._gc_runs[gen] += 1
        self._gc_max[gen] = max(self._gc_max[gen], dt)
        if dt > SLOW_S:
            log.warning(
                "stall-log: mono %.3f: gc generation %d took %.0f ms (collected %d; %d objects "
                "tracked, %d frozen)",
                time.monotonic(),
                info["generation"],
                dt * 1000,
                info.get("collected", 0),
                len(gc.get_objects()),  # costly, but only after a slow collection
                gc.get_freeze_count(),
            )

    async def run(self) -> None:
        """The heartbeat: log each time the loop was held for over ``SPELL_S``."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(asyncio.CancelledError):
            wait0 = run_queue_wait_s()
            while True:
                gc0 = self.gc_s
                self.slow_calls.clear()
                for tally in self.work.values():
                    tally[0], tally[1] = 0, 0.0
                self.longest = (0.0, "")
                t0 = loop.time()
                await asyncio.sleep(HEARTBEAT_S)
                late = loop.time() - t0 - HEARTBEAT_S
                wait1 = run_queue_wait_s()
                self._late_max = max(self._late_max, late)
                if late > SPELL_S:
                    work = ", ".join(
                        f"{k} {int(n)} calls {s * 1000:.0f} ms" for k, (n, s) in self.work.items()
                    )
                    if self.longest[1]:
                        work += f"; longest {self.longest[0] * 1000:.0f} ms, {self.longest[1]}"
                    log.warning(
                        "stall-log: mono %.3f: event loop held %.0f ms (gc %.0f ms; waiting "
                        "for a CPU %.0f ms; work: %s; slow calls: %s)",
                        time.monotonic(),
                        late * 1000,
                        (self.gc_s - gc0) * 1000,
                        (wait1 - wait0) * 1000,
                        work,
                        "; ".join(self.slow_calls) or "none",
                    )
                wait0 = wait1
