"""The imperative shell around the engine: journal first, then the pool backend.

``Broker.submit(event)`` is the one way anything reaches the engine:

1. the engine validates and decides (a bad event raises ``RequestError``: nothing changed);
2. the event and its decisions are appended to the journal and committed;
3. only then does the backend act on the decisions and do listeners hear of them.

Nothing is visible to anyone before the journal holds it. A journal write that fails
raises ``JournalError`` and leaves the engine as the journal has it: the engine is rebuilt
from the committed entries (the failed event never happened), so the next request works if
the journal does. Only if that rebuild fails too does the broker refuse all further work
until a restart. The clock is whatever the caller passes as ``event.at``: virtual
time in the simulator and the demo, the wall clock in the service.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from bursar.broker.backends.base import NodeState, PoolBackend, apply_decision
from bursar.broker.backends.simulated import SimulatedPool
from bursar.broker.config import Config
from bursar.broker.decisions import Decision
from bursar.broker.engine import Engine
from bursar.broker.errors import JournalError
from bursar.broker.events import CreateCampaign, Event, Tick
from bursar.broker.journal import JOURNAL_FILENAME, Journal, replay
from bursar.broker.outcome import Outcome
from bursar.broker.lease import LeaseState
from bursar.broker.pool import Power
from bursar.broker.supply import Supply, supply

log = logging.getLogger(__name__)

Listener = Callable[[Event, Outcome], None]
"""Told of every committed event and its outcome (``outcome.seq`` is its journal entry)."""


def pool_view(
    engine: Engine,
) -> tuple[dict[str, tuple[NodeState, float | None]], dict[str, tuple[str, ...]]]:
    """The pool as the engine sees it, in the backend's terms (for ``PoolBackend.adopt``)."""
    placements = {
        ls.id: tuple(engine.pool.nodes[i].name for i in sorted(ls.pieces))
        for ls in sorted(engine.leases.values(), key=lambda x: int(x.id[1:]))
        if ls.state in (LeaseState.ACTIVE, LeaseState.PREEMPTING) and ls.pieces
    }
    used = {n for ns in placements.values() for n in ns}
    states = {
        Power.COLD: NodeState.COLD,
        Power.BOOTING: NodeState.BOOTING,
        Power.DOWN: NodeState.DOWN,
    }
    nodes = {
        n.name: (
            states.get(n.power, NodeState.LEASED if n.name in used else NodeState.WARM),
            n.ready_at if n.power is Power.BOOTING else None,
        )
        for n in engine.pool.nodes
    }
    return nodes, placements


class Broker:
    def __init__(self, engine: Engine, journal: Journal, backend: PoolBackend) -> None:
        self.engine = engine
        self.journal = journal
        self.backend = backend
        self._listeners: list[Listener] = []
        self._broken: BaseException | None = None

    @classmethod
    def open(
        cls,
        state_dir: str | Path,
        config: Config,
        backend: PoolBackend | None = None,
        *,
        at: float = 0.0,
        durability: str = "normal",
    ) -> Broker:
        """Open the broker whose journal is in ``state_dir``: replay it if it exists,
        otherwise start a new one and create the config's campaigns at time ``at``."""
        state = Path(state_dir)
        state.mkdir(parents=True, exist_ok=True)
        path = state / JOURNAL_FILENAME
        fresh = not path.exists()
        journal = Journal.open(path, config.pool, config.policy, durability=durability)
        journal.ensure_index()
        engine = Engine(config.pool, config.policy) if fresh else replay(journal)
        broker = cls(engine, journal, backend or SimulatedPool(config.pool))
        # A real backend may read the engine's placements (never change them): Slurm needs
        # each lease's per-node pieces to size its allocation.
        bind = getattr(broker.backend, "bind_engine", None)
        if bind is not None:
            bind(engine)
        if fresh:
            for spec in config.campaigns:
                broker.submit(CreateCampaign(at=at, spec=spec))
        else:
            broker.backend.adopt(*pool_view(engine), engine.now)
            log.info("resumed from %s: %d entries, clock %.3f", path, len(journal), engine.now)
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
        """Apply, in time order, the backend's events and the engine's timers due by ``to``."""
        out: list[Decision] = []
        while True:
            t_engine = self.engine.next_timer()
            t_backend = self.backend.next_event_time()
            due = [t for t in (t_engine, t_backend) if t is not None and t <= to]
            if not due:
                return out
            t = min(due)
            if t_backend is not None and t_backend == t:
                for e in self.backend.due_events(t):
                    out += self._apply(e)
            else:
                out += self._apply(Tick(at=t))

    def supply(self) -> Supply:
        return supply(self.engine)

    def close(self) -> None:
        self.journal.close()

    def __enter__(self) -> Broker:
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
        try:
            seq = self.journal.append(event, outcome)
        except BaseException as exc:
            self._roll_back(exc)
            raise
        outcome = outcome.committed(seq)
        for d in outcome:
            apply_decision(self.backend, d)
        for listener in self._listeners:
            listener(event, outcome)
        return outcome

    def _roll_back(self, cause: BaseException) -> None:
        """Undo an event the journal did not take: rebuild the engine from what it holds."""
        try:
            self.engine = replay(self.journal)
        except BaseException as exc:
            log.error("journal append failed and the engine could not be rebuilt: %s", exc)
            self._broken = cause
        else:
            log.error("journal append failed; the event was not applied: %s", cause)
