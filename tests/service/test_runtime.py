"""The imperative shell: journal first, backend second, resume from the journal."""

from __future__ import annotations

from pathlib import Path

import pytest

from bursar.broker.config import default_config
from bursar.broker.decisions import Activated, Granted, LeasePath
from bursar.broker.errors import JournalError, RequestError
from bursar.broker.events import NodeReady, Release, RequestLease, Tick
from bursar.broker.journal import Journal
from bursar.broker.runtime import Runtime


def test_fresh_broker_creates_the_config_campaigns(tmp_path: Path) -> None:
    config = default_config()
    with Runtime.open(tmp_path, config) as b:
        assert sorted(b.engine.campaigns) == sorted(c.name for c in config.campaigns)
        assert len(b.journal) == len(config.campaigns)


def test_cold_path_lease_activates_when_the_simulated_pool_reports_its_nodes(
    tmp_path: Path,
) -> None:
    with Runtime.open(tmp_path, default_config()) as b:
        (grant,) = [
            d
            # After backfill fills the 144 warm GPUs it may (the warm pool less the
            # interactive reserve and the headroom), 64 more boot.
            for d in [
                *b.submit(RequestLease(0.5, "backfill", {"gpu": 144}, 600)),
                *b.submit(RequestLease(1.0, "backfill", {"gpu": 64}, 600)),
            ]
            if isinstance(d, Granted) and d.path is LeasePath.COLD
        ]
        assert grant.path is LeasePath.COLD and grant.starts_at == 61.0
        out = b.catch_up(61.0)
        assert next(d for d in out if isinstance(d, Activated)).lease_id == grant.lease_id
        events = [e for _, e, _ in b.journal.entries()]
        assert sum(isinstance(e, NodeReady) for e in events) == 8
        assert set(b.backend.placements()[grant.lease_id]) == set(grant.nodes)


def test_bad_input_changes_neither_engine_nor_journal(tmp_path: Path) -> None:
    with Runtime.open(tmp_path, default_config()) as b:
        before = (b.engine.state_digest(), b.journal.sha256())
        with pytest.raises(RequestError):
            b.submit(RequestLease(5.0, "victim", {"gpu": -1}, 60))
        assert (b.engine.state_digest(), b.journal.sha256()) == before


def test_restart_resumes_with_every_lease_intact(tmp_path: Path) -> None:
    config = default_config()
    with Runtime.open(tmp_path, config) as b:
        b.submit(RequestLease(1.0, "victim", {"gpu": 8}, 600))
        b.submit(RequestLease(2.0, "adaptive-sci", {"gpu": 128}, 600))
        b.submit(Release(3.0, "L1"))
        b.submit(RequestLease(4.0, "backfill", {"gpu": 64}, 600))  # boots cold nodes
        digest, leases = b.engine.state_digest(), sorted(b.engine.leases)
        nodes, placed = dict(b.backend.node_states()), dict(b.backend.placements())
        next_ready = b.backend.next_event_time()
        assert next_ready is not None
    with Runtime.open(tmp_path, config) as again:
        assert again.engine.state_digest() == digest
        # The backend adopts the pool the journal describes, boots still under way.
        assert dict(again.backend.node_states()) == nodes
        assert dict(again.backend.placements()) == placed
        assert again.backend.next_event_time() == next_ready
        assert sorted(again.engine.leases) == leases == ["L2", "L3"]
        # It carries on where it stopped: the boots finish, the leases expire on time.
        again.submit(Tick(700.0))
        assert not again.engine.leases


def test_listeners_hear_only_what_is_already_journaled(tmp_path: Path) -> None:
    with Runtime.open(tmp_path, default_config()) as b:
        seen: list[int] = []
        b.listen(lambda event, decisions: seen.append(len(b.journal)))
        n = len(b.journal)
        b.submit(RequestLease(1.0, "victim", {"gpu": 8}, 60))
        assert seen == [n + 1]


def test_a_failed_journal_write_stops_the_broker(tmp_path: Path) -> None:
    b = Runtime.open(tmp_path, default_config())
    b.journal.close()  # any write now fails
    with pytest.raises(Exception):  # noqa: B017 - sqlite's own error, whatever it is
        b.submit(RequestLease(1.0, "victim", {"gpu": 8}, 60))
    with pytest.raises(JournalError, match="restart it"):
        b.submit(RequestLease(2.0, "victim", {"gpu": 8}, 60))
    # What reached the journal before the failure is intact and replayable.
    with Journal.open(tmp_path / "journal.sqlite") as j:
        assert len(j) == len(default_config().campaigns)
