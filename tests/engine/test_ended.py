"""The ended leases the engine remembers: the newest are always there, the count is
bounded, and a snapshot's copy answers as the original does."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from bursar.broker import safe_pickle
from bursar.broker.decisions import LeasePath
from bursar.broker.ended import CHUNK, EndedLeases
from bursar.broker.envelope import LeaseClass
from bursar.broker.lease import EndedLease, LeaseState


def _ended(i: int) -> EndedLease:
    return EndedLease(
        f"L{i}",
        f"c{i % 7}",
        (LeaseState.RELEASED, LeaseState.EXPIRED, LeaseState.REVOKED)[i % 3],
        1000.0 + i * 0.37,
        "released" if i % 3 == 0 else f"node n{i % 5} lost",
        (float(i % 8), 0.0, 0.0),
        LeasePath.WARM,
        990.0 + i,
        991.0 + i,
        LeaseClass.BATCH,
        i % 2 == 0,
        {"job": str(i)} if i % 11 == 0 else {},
    )


@settings(max_examples=20, deadline=None)
@given(limit=st.integers(1, 3 * CHUNK), n=st.integers(0, 6 * CHUNK), probe=st.integers(0, 10**6))
def test_the_newest_are_kept_in_order_and_a_copy_answers_alike(
    limit: int, n: int, probe: int
) -> None:
    ended = EndedLeases(limit)
    for i in range(n):
        ended.add(_ended(i))
    kept = list(ended)
    assert len(ended) == len(kept) < limit + CHUNK
    assert kept == [f"L{i}" for i in range(n - len(kept), n)]  # a suffix, oldest first
    assert len(kept) >= min(n, limit)
    copy = safe_pickle.loads(pickle.dumps(ended))
    assert list(copy) == kept
    assert [copy[k] for k in kept] == [ended[k] for k in kept] == [_ended(int(k[1:])) for k in kept]
    missing = f"L{probe}" if probe >= n or f"L{probe}" not in ended else "L-1"
    assert missing not in copy and copy.get(missing) is None
    # The copy goes on as the original would.
    for i in range(n, n + CHUNK + 3):
        ended.add(_ended(i))
        copy.add(_ended(i))
    assert list(copy) == list(ended)
