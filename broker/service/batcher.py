"""Commit batches: the service's journal entries wait here for their commit, and the
requests that arrive together share one.

The runtime applies each event and appends its journal entry uncommitted, then hands it
to the :class:`CommitBatcher` (its ``deferral``, see ``broker/runtime.py``). The batcher
holds every entry not committed yet and decides when the batch commits: it calls
``Runtime.commit`` itself, which commits the journal and only then hands the outcomes on
(the backend, the listeners). A call awaits :meth:`CommitBatcher.durable` once, before it
answers: nothing about an event is answered, published or handed to the backend before
its commit. How long a batch waits adapts to the load:

* Not gathering (a lone client, light load): a batch commits once the event loop has
  turned ``QUIET_TURNS`` times in a row without a call joining it, which for a lone
  request is within microseconds. A batch whose calls keep joining commits after
  ``MAX_BATCH_WAIT_S`` on the service's clock, or at ``MAX_BATCH_ENTRIES`` entries.
* Gathering: the last batch held more than one call, so requests are arriving faster
  than a commit and its answers go out. A client waiting for its answer sends nothing
  more, so committing at the first quiet spell answers each burst before the rest of the
  clients' next requests have arrived. The batch instead waits for as many calls as the
  last one held, then commits at the next quiet spell, and commits anyway ``window_s``
  (``MAX_BATCH_WAIT_S``) after it opened. A batch that ends up holding one call (the
  load has gone) stops the gathering, so a lone client pays at most one window, once.

Quiet turns are counted with public asyncio only: a check put on the loop with
``call_soon`` runs after everything that was ready when it was put there, so a check
that finds the batch as the previous one left it knows that the calls run in between
added nothing. (The batcher once read the loop's private ready queue to see whether it
was idle; this counts what matters, calls joining, and works on any event loop.)

The window is timed on the event loop's clock, not the service's: it decides only when
answers leave, never what is decided or journaled, and a test's manual clock must not
hold a commit back. One commit for many answers saves the commit and, more, the event
loop's and gRPC's wake-ups per answer (see ``benchmarks/bench_service.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from bursar.broker.clock import Clock
from bursar.broker.errors import JournalError
from bursar.broker.events import Event
from bursar.broker.outcome import Outcome
from bursar.broker.runtime import Runtime

__all__ = ["MAX_BATCH_ENTRIES", "MAX_BATCH_WAIT_S", "CommitBatcher"]

MAX_BATCH_WAIT_S = 0.002
"""Longest the first entry of a commit batch waits for the others: a gathering batch
commits at the latest this long after it opened (on the event loop's clock), and a batch
whose calls keep joining commits this often on the service's clock."""

QUIET_TURNS = 6
"""Turns of the event loop in a row in which no call joins a batch before it commits. A
request that has arrived takes a few turns (gRPC's read, the handler's first steps)
before it joins: under load the calls already on their way then join the batch instead
of each opening one of its own (at 64 clients, one turn gave about 1.2 entries per
commit, six about as many as the loop's private ready queue did). An idle turn costs a
few microseconds: a lone request pays about six, unmeasurable beside its 1.7 ms."""

MAX_BATCH_ENTRIES = 512
"""Entries after which a commit batch commits whatever else is ready."""


class CommitBatcher:
    """Every journal entry the runtime has appended and not committed, the batch they
    commit in, and the calls waiting for it. Install it as the runtime's ``deferral``."""

    def __init__(
        self,
        runtime: Runtime,
        clock: Clock,
        *,
        on_commit: Callable[[list[Outcome]], None] = lambda _outcomes: None,
        on_failure: Callable[[BaseException], None] = lambda _exc: None,
    ) -> None:
        self.runtime = runtime
        self._clock = clock
        self._on_commit = on_commit
        """Told once per commit, after the outcomes were handed on (the core's metrics and
        wake-ups: once per batch, not per event)."""
        self._on_failure = on_failure
        """Told of a failed commit: the entries it held were dropped (a failed append
        raises to its caller)."""
        self._held: list[tuple[Event, Outcome]] = []
        self._batch: asyncio.Future[None] | None = None
        """Resolved once the entries held so far are committed."""
        self._opened = 0.0
        """When the open batch opened, on the service's clock."""
        self._joined = 0
        """Calls waiting for the open batch (counted in ``durable``)."""
        self._expect = 0
        """Calls the open batch gathers for: those the last batch held, if it held more than
        one; 0 when batches do not gather."""
        self._window: asyncio.TimerHandle | None = None
        """Commits a gathering batch once ``window_s`` has passed."""
        self._seen = -1
        """The batch's entries and calls as the last check left them (see ``_check``)."""
        self._quiet = 0
        """Turns in a row the batch was left as the last check left it."""
        self.window_s = MAX_BATCH_WAIT_S
        """Longest a gathering batch waits, in seconds of the event loop's clock."""
        self.hurry = False
        """Commit at the next check, quiet or not (the service is stopping)."""
        self.commits = 0
        """Commits made (with ``committed``: entries per commit)."""
        self.committed = 0

    # ------------------------------------------------------------------ Deferral (runtime)

    def hold(self, event: Event, outcome: Outcome) -> None:
        self._held.append((event, outcome))
        if self._batch is None:
            self._open()

    def flush(self) -> None:
        self.commit()

    def drop(self, cause: BaseException) -> None:
        """The runtime rolled the journal back: the calls waiting for the held entries fail
        as well."""
        self._held = []
        batch = self._close()
        if batch is not None and not batch.done():
            batch.set_exception(cause)
            batch.add_done_callback(_retrieve)

    # ------------------------------------------------------------------ calls

    @property
    def held(self) -> int:
        """Entries waiting for their commit."""
        return len(self._held)

    @property
    def gathering(self) -> int:
        """Calls the next batch waits for before it commits (0: it commits once the event
        loop has turned ``QUIET_TURNS`` times without a call joining it)."""
        return self._expect

    async def durable(self) -> None:
        """Return once every journal entry appended so far is committed (at once if all
        are). Raises ``JournalError`` if the commit failed: those events never happened."""
        batch = self._batch
        if batch is None:
            return
        self._joined += 1
        if len(self._held) >= MAX_BATCH_ENTRIES:
            self.commit()
            return
        if self._expect and self._joined == self._expect:
            # Everyone the last batch held is here: commit once what is ready has joined.
            asyncio.get_running_loop().call_soon(self._check)
        await asyncio.shield(batch)

    async def settled(self) -> None:
        """Return with nothing held (``durable`` may return with entries that other calls
        appended while this one waited): for a caller that reads state next, in the same
        step, and must see committed state only (a Watch opening on it)."""
        while self._batch is not None:
            await self.durable()

    def commit(self) -> None:
        """Commit what is held now and let its calls go on. Raises ``JournalError`` if the
        commit failed (the runtime rolled back: none of those events happened)."""
        held, self._held = self._held, []
        batch = self._close()
        try:
            outcomes = self.runtime.commit(held)
        except JournalError as exc:
            if batch is not None and not batch.done():
                batch.set_exception(exc)
                batch.add_done_callback(_retrieve)
            self._on_failure(exc)
            raise
        if outcomes:
            self.commits += 1
            self.committed += len(outcomes)
            self._on_commit(outcomes)
        if batch is not None and not batch.done():
            batch.set_result(None)

    # ------------------------------------------------------------------ the batch

    def _open(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # Held off the event loop (a direct caller, not a request): nobody gathers.
            self.commit()
            return
        self._batch = loop.create_future()
        self._opened = self._clock.now()
        self._joined = 0
        self._seen = -1
        self._quiet = 0
        if self._expect:
            self._window = loop.call_later(self.window_s, self._window_over)
        else:
            loop.call_soon(self._check)

    def _check(self) -> None:
        if self._batch is None:
            return  # committed meanwhile
        now_seen = len(self._held) + self._joined
        self._quiet = self._quiet + 1 if now_seen == self._seen else 0
        if (
            self._quiet >= QUIET_TURNS  # nobody joined for that many turns
            or len(self._held) >= MAX_BATCH_ENTRIES
            or self._clock.now() - self._opened >= MAX_BATCH_WAIT_S
            or self.hurry
        ):
            # A failed commit is already on the batch's future, for the callers to raise.
            with contextlib.suppress(JournalError):
                self.commit()
        else:
            self._seen = now_seen
            asyncio.get_running_loop().call_soon(self._check)

    def _window_over(self) -> None:
        self._window = None
        if self._batch is not None:
            with contextlib.suppress(JournalError):
                self.commit()

    def _close(self) -> asyncio.Future[None] | None:
        """The open batch is done with (committing or dropped): the next one gathers for as
        many calls as this one held, if that was more than one."""
        batch, self._batch = self._batch, None
        if batch is not None:
            self._expect = self._joined if self._joined > 1 else 0
        if self._window is not None:
            self._window.cancel()
            self._window = None
        return batch


def _retrieve(fut: asyncio.Future[None]) -> None:
    # The error reaches the callers that wait; one nobody waited for is not "never retrieved".
    if not fut.cancelled():
        fut.exception()
