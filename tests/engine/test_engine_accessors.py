"""What the engine exposes to the supply signals and the journal: accessors, the state digest, decisions' rule inputs. Exact values
throughout: the engine is pure arithmetic."""

from __future__ import annotations

import math

import pytest
from engine_support import gpu, one, reclaim_setup, req

from bursar.broker.decisions import (
    Activated,
    Expired,
    Granted,
    PoweredOn,
    PreemptWarned,
    Released,
    Renewed,
    Revoked,
)
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.events import (
    Tick,
)


def test_supply_accessors():
    eng = reclaim_setup()
    assert gpu(eng.reserve) == 8
    assert gpu(eng.reclaimable) == 48
    on_free, boot_free, cold, on_cap = eng.pool.totals()
    assert (gpu(on_free), gpu(boot_free), gpu(cold), gpu(on_cap)) == (16, 0, 0, 64)
    assert eng.bucket_level("victim", "gpu") == 6000
    assert eng.bucket_level("bf", "gpu") == math.inf
    assert eng.bucket_level("victim", "inference") is None
    assert eng.pressure() == 0.0 and eng.price() == 1.0  # backfill is not scarcity
    assert eng.next_timer() == 1000
    eng.apply(req(10, "sci", 24, 100))
    assert eng.next_timer() == 40
    assert gpu(eng.reclaimable) == 0
    assert eng.pressure() == 24 / 64
    assert list(eng.queued()) == []
    with pytest.raises(RequestError) as e:
        eng.lease("L99")
    assert e.value.code is ErrorCode.NOT_FOUND


def test_state_digest_tracks_state_and_is_reproducible():
    a, b = reclaim_setup(), reclaim_setup()
    assert a.state_digest() == b.state_digest()
    a.apply(Tick(at=1))
    assert a.state_digest() != b.state_digest()
    b.apply(Tick(at=1))
    assert a.state_dict() == b.state_dict()
    assert a.events_applied == b.events_applied == 5


def test_decisions_expose_their_rule_inputs():
    eng = reclaim_setup()
    g = one(eng.apply(req(10, "sci", 24, 100)), Granted)
    assert g.inputs["class_rank"] == 1
    assert g.inputs["usage_s"] == 0.0
    assert g.inputs["tokens"] == {"gpu": 100_000}
    assert g.inputs["pool"]["reserve"] == {"gpu": 8.0}
    assert g.inputs["pool"]["reclaimable"] == {"gpu": 48.0}
    assert g.inputs["price"] == g.price
    assert g.inputs["waited_s"] == 0


@pytest.mark.parametrize(
    "cls", [Activated, Expired, PoweredOn, PreemptWarned, Released, Renewed, Revoked]
)
def test_decision_kinds_are_journal_kinds(cls):
    from bursar.broker.decisions import DECISION_TYPES

    assert DECISION_TYPES[cls.kind] is cls
