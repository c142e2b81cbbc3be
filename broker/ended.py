"""The ended leases the engine remembers: a bounded FIFO, kept in frozen chunks.

The engine keeps the newest ``limit`` ended leases to answer "already ended" and to open a
Watch on a lease that ended a while ago. At 100,000 of them, pickling the objects one by
one for a snapshot held the engine's thread for about half a second. Here every full chunk
of ``CHUNK`` leases is pickled once, when it fills, and kept as bytes: a snapshot copies
bytes, and a restart decodes a chunk only when one of its leases is asked for. The oldest
chunk is dropped whole once the rest still hold ``limit``: between ``limit`` and
``limit + CHUNK`` are kept.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from typing import Any

from bursar.broker import safe_pickle
from bursar.broker.lease import EndedLease

CHUNK = 1_000
_DECODED_KEPT = 4
"""Frozen chunks kept decoded (the ones asked for last)."""


class EndedLeases(Mapping[str, EndedLease]):
    """The newest ended leases by id, oldest first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._frozen: dict[int, tuple[bytes, bytes]] = {}
        """Full chunks, oldest first: chunk number -> (pickled ids, pickled leases)."""
        self._open: list[EndedLease] = []
        self._open_no = 0
        self._where: dict[str, int] = {}
        """Lease id -> chunk number * CHUNK + position in the chunk."""
        self._decoded: dict[int, list[EndedLease]] = {}

    # ------------------------------------------------------------------ writing

    def add(self, e: EndedLease) -> None:
        self._where[e.id] = self._open_no * CHUNK + len(self._open)
        self._open.append(e)
        if len(self._open) == CHUNK:
            ids = [x.id for x in self._open]
            self._frozen[self._open_no] = (
                pickle.dumps(ids, pickle.HIGHEST_PROTOCOL),
                pickle.dumps(self._open, pickle.HIGHEST_PROTOCOL),
            )
            self._open_no += 1
            self._open = []
        self._trim()

    def resize(self, limit: int) -> None:
        """Keep the newest ``limit`` from now on (dropping the oldest chunks at once)."""
        self.limit = limit
        self._trim()

    def _trim(self) -> None:
        while self._frozen and len(self._where) - CHUNK >= self.limit:
            no = next(iter(self._frozen))
            ids_bytes, _ = self._frozen.pop(no)
            self._decoded.pop(no, None)
            for lid in safe_pickle.loads(ids_bytes):
                del self._where[lid]

    # ------------------------------------------------------------------ reading

    def __getitem__(self, lease_id: str) -> EndedLease:
        at = self._where[lease_id]
        no, i = divmod(at, CHUNK)
        if no == self._open_no:
            return self._open[i]
        return self._chunk(no)[i]

    def _chunk(self, no: int) -> list[EndedLease]:
        got = self._decoded.get(no)
        if got is None:
            got = safe_pickle.loads(self._frozen[no][1])
            if len(self._decoded) >= _DECODED_KEPT:
                del self._decoded[next(iter(self._decoded))]
            self._decoded[no] = got
        return got

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def values_in_order(self) -> Iterator[EndedLease]:
        for no in self._frozen:
            yield from self._chunk(no)
        yield from self._open

    # ------------------------------------------------------------------ snapshots

    def __getstate__(self) -> dict[str, Any]:
        # The id index is rebuilt from the frozen chunks' ids on load (cheap) rather than
        # pickled; decoded chunks are a cache.
        return {
            "limit": self.limit,
            "_frozen": self._frozen,
            "_open": self._open,
            "_open_no": self._open_no,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.limit = state["limit"]
        self._frozen = state["_frozen"]
        self._open = state["_open"]
        self._open_no = state["_open_no"]
        self._decoded = {}
        self._where = {}
        for no, (ids_bytes, _) in self._frozen.items():
            base = no * CHUNK
            for i, lid in enumerate(safe_pickle.loads(ids_bytes)):
                self._where[lid] = base + i
        base = self._open_no * CHUNK
        for i, e in enumerate(self._open):
            self._where[e.id] = base + i

    def __fingerprint_state__(self) -> list[Any]:
        """What two copies must agree on: the leases, in order (the bytes of a chunk can
        differ where pickle shared one string object and not another)."""
        return [self.limit, self._open_no, list(self.values_in_order())]
