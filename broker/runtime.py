"""The imperative shell around the engine: journal first, then the pool backend.

``Runtime.submit(event)`` is the one way anything reaches the engine:

1. the engine validates and decides (a bad event raises ``RequestError``: nothing changed);
2. the event and its decisions are appended to the journal and committed;
3. only then does the actuator take the decisions to the backend (inline, or on worker
   threads for a slow backend: the request does not wait for it) and do listeners hear of
   them. What the backend reports back (a node ready or lost, a lease's allocation failed)
   comes in as events through ``catch_up``, like any other; a placement done is told to the
   placement listeners.

Nothing is visible to anyone before the journal holds it. A journal write that fails
raises ``JournalError`` and leaves the engine as the journal has it: the engine is rebuilt
from the committed entries (the failed event never happened), so the next request works if
the journal does. Only if that rebuild fails too does the broker refuse all further work
until a restart. The clock is whatever the caller passes as ``event.at``: virtual
time in the simulator and the demo, the wall clock in the service.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from bursar.broker import codec, safe_pickle, snapshot, validation
from bursar.broker.actuator import Actuator, InlineActuator, Placed
from bursar.broker.backends.base import NodeState, PoolBackend
from bursar.broker.backends.simulated import SimulatedPool
from bursar.broker.config import Config
from bursar.broker.decisions import Decision
from bursar.broker.engine import Engine
from bursar.broker.errors import JournalError
from bursar.broker.events import AllocationReady, CreateCampaign, Event, Tick
from bursar.broker.journal import JOURNAL_FILENAME, Journal, JournalStore
from bursar.broker.lease import LeaseState
from bursar.broker.outcome import Outcome
from bursar.broker.snapshot import EVERY, Snapshotter, apply_from, base, restore
from bursar.broker.supply import Supply, supply

log = logging.getLogger(__name__)

Listener = Callable[[Event, Outcome], None]
"""Told of every committed event and its outcome (``outcome.seq`` is its journal entry)."""


def pool_view(
    engine: Engine,
) -> tuple[dict[str, tuple[NodeState, float | None]], dict[str, tuple[str, ...]]]:
    """The pool as the engine sees it, for ``PoolBackend.adopt``: each node's state (the
    engine and the backends share one enum) with a booting node's ready time, and the nodes
    of every placed lease."""
    placements = {
        ls.id: tuple(engine.pool.nodes[i].name for i in engine.elastic_size(ls.id)[1])
        for ls in sorted(engine.holders_leases(), key=lambda x: int(x.id[1:]))
        if ls.state in (LeaseState.ACTIVE, LeaseState.PREEMPTING) and ls.pieces
    }
    nodes = {
        n.name: (n.power, n.ready_at if n.power is NodeState.BOOTING else None)
        for n in engine.pool.nodes
    }
    return nodes, placements


class Deferral(Protocol):
    """Where a runtime leaves its applied events until they are committed (the service's
    commit batcher, ``broker/service/batcher.py``): the runtime appends each entry
    uncommitted and hands it here; whoever holds them calls :meth:`Runtime.commit` with
    them when it chooses."""

    def hold(self, event: Event, outcome: Outcome) -> None:
        """An event applied and appended, its entry not committed yet."""

    def flush(self) -> None:
        """Commit what is held now (``Runtime.commit``): the backend is about to report,
        or the runtime closes."""

    def drop(self, cause: BaseException) -> None:
        """The journal rolled back: what is held never happened (``cause`` says why)."""


class HeldBack:
    """The plainest :class:`Deferral`: holds every entry until :meth:`commit` (a tool or a
    test that commits by hand)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.entries: list[tuple[Event, Outcome]] = []

    def hold(self, event: Event, outcome: Outcome) -> None:
        self.entries.append((event, outcome))

    def flush(self) -> None:
        self.commit()

    def drop(self, cause: BaseException) -> None:
        self.entries = []

    def commit(self) -> list[Outcome]:
        entries, self.entries = self.entries, []
        return self.runtime.commit(entries)


def _next_step(
    engine: Engine, to: float, reports_at: float | None, coalesce: bool
) -> tuple[float, bool, bool] | None:
    """The next step of catching ``engine`` up to ``to``, given the backend's next report
    (``reports_at``): (its time, whether it is the backend's reports rather than a Tick,
    whether it is the last one); None when caught up. ``coalesce``: one Tick to ``to``
    for all the timers, unless a report falls due first."""
    due = [t for t in (engine.next_timer(), reports_at) if t is not None and t <= to]
    if not due:
        return None
    t = min(due)
    if coalesce and (reports_at is None or reports_at > to):
        return to, False, True
    return t, reports_at is not None and reports_at == t, False


class Follower:
    """A standby's engine: the newest usable snapshot (in its own state directory), then
    every committed journal entry applied as it lands (:meth:`follow`), so that taking
    the lead needs no replay. Nothing reaches a backend or listener: the leader acts."""

    def __init__(self, journal: JournalStore, state_dir: Path) -> None:
        self.journal = journal
        self.engine, self.start = base(journal, state_dir)
        """The engine, and the snapshot's entry it started from (0: none)."""
        self.seq = self.start
        """The last entry applied."""

    def follow(self) -> int:
        """Apply the entries committed since the last call; returns how many."""
        last = apply_from(self.journal, self.engine, self.seq + 1)
        n = max(0, last - self.seq)
        self.seq = max(self.seq, last)
        return n

    @property
    def lag(self) -> int:
        """Committed entries not applied yet."""
        return max(0, self.journal.last_seq - self.seq)


class Runtime:
    def __init__(
        self,
        engine: Engine,
        journal: Journal,
        backend: PoolBackend,
        actuator: Actuator | None = None,
        snapshots: Snapshotter | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.engine = engine
        self.journal = journal
        self.state_dir = state_dir if state_dir is not None else Path(journal.path).parent
        """Where the snapshots are (an SQLite journal's own directory by default)."""
        self.backend = backend
        self.actuator = actuator if actuator is not None else InlineActuator(backend)
        if self.actuator.backend is not backend:
            raise ValueError("the actuator drives another backend than the broker's")
        self._listeners: list[Listener] = []
        self._broken: BaseException | None = None
        self.snapshots = snapshots
        """Writes the engine's state every so many entries (None: never)."""
        self.deferral: Deferral | None = None
        """Where each applied event's uncommitted entry goes until it is committed (the
        service: requests arriving together share one commit); None: each is committed as
        it is appended. Until its commit the engine is ahead of the journal, and nothing of
        those events reaches the backend, the snapshots or the listeners; :meth:`commit`
        hands them on in order."""
        self.coalesce_ticks = False
        """Catch up with one Tick to the time given, not one per timer instant (the service:
        after a downtime, one journal entry instead of one per power-down re-check; the
        engine still fires each timer at its own time). The simulator keeps one per
        instant, so that its journals stay as they were."""

    @classmethod
    def open(
        cls,
        state_dir: str | Path,
        config: Config,
        backend: PoolBackend | None = None,
        *,
        at: float = 0.0,
        durability: str = "normal",
        actuator: Callable[[PoolBackend], Actuator] = InlineActuator,
        snapshot_every: int = EVERY,
        journal: JournalStore | None = None,
        engine: Follower | None = None,
    ) -> Runtime:
        """Open the broker whose journal is in ``state_dir``: resume it if it exists (from
        its newest snapshot and the entries after it, see ``broker/snapshot.py``),
        otherwise start a new one and create the config's campaigns at time ``at``.

        ``actuator`` builds what drives the backend (default: inline, in the caller's
        thread); it is built once the backend has taken on the journal's state.
        ``snapshot_every``: journal entries between snapshots (0: none).

        ``journal``: an open journal store to use instead of ``state_dir``'s SQLite file
        (the PostgreSQL journal; ``state_dir`` then holds the snapshots); ``engine``: a
        standby's follower, whose engine is current already (no replay)."""
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        if journal is None:
            path = state / JOURNAL_FILENAME
            fresh = not path.exists()
            journal = Journal.open(path, config.pool, config.policy, durability=durability)
        else:
            fresh = journal.last_seq == 0
        journal.ensure_index()
        if engine is not None:
            engine.follow()
            fresh = engine.seq == 0
            engine, snap = engine.engine, engine.start
        elif fresh:
            # Built from the specs as the journal stores them, as a replay builds it: the
            # same engine, down to the order of a spec's keys.
            engine, snap = Engine(journal.pool, journal.policy), 0
        else:
            engine, snap = restore(journal, state)
        pool = backend if backend is not None else SimulatedPool(config.pool)
        # Also for a new journal: it has no leases, so a real backend cancels what it finds
        # left of earlier ones (Slurm jobs with its prefix).
        pool.adopt(*pool_view(engine), engine.now)
        snapshots = Snapshotter(state, journal, snapshot_every, last=snap)
        broker = cls(engine, journal, pool, actuator(pool), snapshots, state)
        if fresh:
            for spec in config.campaigns:
                # As the journal stores it (envelopes in sorted order), so that this engine
                # and one replayed from the journal or restored from a snapshot agree down to
                # the order of their dicts (a snapshot's fingerprint compares it).
                stored = codec.campaign_from_dict(codec.plain(spec))
                broker.submit(CreateCampaign(at=at, spec=stored))
        else:
            log.info(
                "resumed from %s: %d entries (%s), clock %.3f",
                journal.where,
                journal.last_seq,
                f"snapshot at entry {snap}, then replayed the rest" if snap else "all replayed",
                engine.now,
            )
        return broker

    @property
    def broken(self) -> bool:
        """True once an append failed and the engine could not be rebuilt: restart."""
        return self._broken is not None

    def listen(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def submit(self, event: Event) -> Outcome:
        """Catch up with the backend and the engine's timers, then apply ``event``."""
        self.catch_up(event.at)
        return self._apply(event)

    def catch_up(self, to: float) -> list[Decision]:
        """Apply, in time order, the actuator's reports (the backend's events) and the
        engine's timers due by ``to``."""
        out: list[Decision] = []
        while True:
            step = _next_step(
                self.engine, to, self.actuator.next_report_time(), self.coalesce_ticks
            )
            if step is None:
                return out
            t, reports, last = step
            if not reports:
                out += self._apply(Tick(at=t))
                if last:
                    return out
                continue
            # The backend must have acted on every decision before it reports what
            # happened next (its clock only moves forward): the entries waiting for
            # their commit are committed, and so actuated, first.
            if self.deferral is not None:
                self.deferral.flush()
            for r in self.actuator.due(t):
                if isinstance(r, Placed):
                    # Journaled like any report, so that the holder hears of the
                    # allocation in journal order (and a resumed Watch replays it).
                    r = AllocationReady(
                        at=r.at,
                        lease_id=r.lease_id,
                        allocation=dict(self.backend.allocation(r.lease_id) or {}),
                    )
                if r.at < self.engine.now:
                    # A worker thread's report, stamped before the engine moved on.
                    r = dataclasses.replace(r, at=self.engine.now)
                out += self._apply(r)

    def what_if(self, event: Event) -> tuple[Outcome, Engine]:
        """Decide ``event`` on a copy of the engine: its outcome, and the copy as it would
        be after it. The engine, the journal and everything listening to them are left as
        they were; bad input raises as it would for the real event (checked before the copy
        is paid for: whether an event is valid does not depend on the timers the copy
        catches up with first, and the copy's engine checks it again anyway).

        The copy first catches up with the timers due by ``event.at``, as :meth:`submit`
        would, so that the event meets the state the real one would meet."""
        validation.validate(self.engine, event)
        # The snapshot's own capture (its ``__getstate__`` leaves the per-pass caches out)
        # read back: about twice as fast as ``copy.deepcopy``, which walks the same state
        # object by object in Python (``benchmarks/bench_whatif.py``).
        engine = safe_pickle.loads(snapshot.capture(self.engine))
        self.catch_up_timers(engine, event.at)
        return engine.apply(event), engine

    def catch_up_timers(self, engine: Engine, to: float) -> None:
        """Catch ``engine`` (a copy of this runtime's, for a what-if) up with its timers
        due by ``to``, as :meth:`catch_up` would, but journaling nothing and anticipating
        no backend report (those are delivered as they fall due)."""
        while (step := _next_step(engine, to, None, self.coalesce_ticks)) is not None:
            t, _, last = step
            engine.apply(Tick(at=t))
            if last:
                return

    def supply(self) -> Supply:
        return supply(self.engine)

    @property
    def uncommitted(self) -> bool:
        """True while applied events' journal entries wait for their commit (``deferral``)."""
        return self.journal.uncommitted

    def commit(self, entries: Sequence[tuple[Event, Outcome]]) -> list[Outcome]:
        """Commit the journal's open entries, which are ``entries`` (what ``deferral`` was
        handed), then hand their outcomes on, in order, as an immediate commit would have;
        returns those outcomes.

        A failed commit raises ``JournalError`` and rebuilds the engine from the journal, as
        a failed append does: none of those events happened."""
        if not entries:
            return []
        try:
            self.journal.commit()
        except BaseException as exc:
            self._roll_back(exc)
            raise
        if self.snapshots is not None:
            # The engine is at the last entry (everything applied is in ``entries``).
            self.snapshots.after_commit(entries[-1][1].seq, self.engine)
        for event, outcome in entries:
            self._hand_on(event, outcome)
        return [outcome for _, outcome in entries]

    def close(self) -> None:
        if self._broken is None and self.deferral is not None:
            self.deferral.flush()
        self.actuator.close()
        if self.snapshots is not None and self._broken is None:
            self.snapshots.close(self.journal.last_seq, self.engine)
        self.journal.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _apply(self, event: Event) -> list[Decision]:
        if self._broken is not None:
            raise JournalError(
                f"the broker stopped after a journal write failed ({self._broken}); "
                "restart it to resume from the journal"
            )
        outcome = self.engine.apply(event)
        deferral = self.deferral
        try:
            seq = self.journal.append(event, outcome.decisions, commit=deferral is None)
        except BaseException as exc:
            self._roll_back(exc)
            raise
        outcome = outcome.committed(seq)
        if deferral is not None:
            deferral.hold(event, outcome)
            return outcome
        if self.snapshots is not None:
            self.snapshots.after_commit(seq, self.engine)
        self._hand_on(event, outcome)
        return outcome

    def _hand_on(self, event: Event, outcome: Outcome) -> None:
        self.actuator.actuate(outcome)
        for listener in self._listeners:
            listener(event, outcome)

    def _roll_back(self, cause: BaseException) -> None:
        """Undo an event the journal did not take: rebuild the engine from what it holds.
        Entries still waiting for their commit are dropped with it (the events of a batch
        stand or fall together)."""
        self.journal.rollback()
        try:
            self.engine = restore(self.journal, self.state_dir)[0]
        except BaseException as exc:
            log.error("journal append failed and the engine could not be rebuilt: %s", exc)
            self._broken = cause
        else:
            log.error("journal append failed; the event was not applied: %s", cause)
        if self.deferral is not None:
            self.deferral.drop(cause)
