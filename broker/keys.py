"""Idempotency keys: what each keyed Acquire asked for and how it was answered.

A retry that carries the same key within the window (``KEY_WINDOW_S`` unless the policy's
``idempotency_window_s`` says otherwise) gets the first call's answer instead of a second
lease, as long as fewer than the policy's ``idempotency_keys_kept`` keyed Acquires came
after it. ``Keys`` holds the records by (campaign, key), oldest first, and, while a
request is still unanswered (queued), by request id too.
"""

from __future__ import annotations

import math
import pickle
import zlib
from dataclasses import dataclass
from typing import Any

from bursar.broker import safe_pickle
from bursar.broker.codec import dumps, plain
from bursar.broker.decisions import Decision
from bursar.broker.events import RequestLease
from bursar.broker.policy import IDEMPOTENCY_KEYS_KEPT, IDEMPOTENCY_WINDOW_S

KEY_WINDOW_S = IDEMPOTENCY_WINDOW_S
"""How long an Acquire's idempotency key is remembered by default (seconds): a retry
within this window returns the first call's answer instead of a second lease."""
KEYS_KEPT = IDEMPOTENCY_KEYS_KEPT
"""At most how many keys are remembered by default (the newest, or up to ``CHUNK`` more)."""


@dataclass(slots=True)
class KeyRecord:
    """What one idempotency key answered: the request it named and how it was answered."""

    campaign: str
    key: str
    fingerprint: str
    request_id: str
    at: float
    answer: Decision | None = None
    """The Granted or Rejected the request got (None while it waits in the queue)."""


def request_fingerprint(e: RequestLease) -> str:
    """What makes two Acquires the same request: size, shape, intent, duration, class and
    labels (not the wait, which a retry after a lost reply shortens)."""
    what = {
        "size": {d: float(x) for d, x in sorted(e.size.items()) if x},
        "duration_s": float(e.duration_s),
        "lease_class": e.lease_class.value if e.lease_class is not None else None,
        "labels": dict(sorted(e.labels.items())),
    }
    if e.shape is not None:
        what["shape"] = e.shape
    if e.intent is not None:
        what["intent"] = e.intent
    return dumps(plain(what))


CHUNK = 100
"""Records per frozen chunk (see ``Keys``). A chunk freezes inside the request that fills
it: 1,000 records held that request (and every call behind it on the service's event loop)
for about 30 ms, 100 for about 1 ms. The total work is no greater, and the records
compress as well."""
_DECODED_KEPT = 40
"""Frozen chunks kept decoded (the ones asked for last): the newest few thousand records."""


class Keys:
    """The keys seen in the last ``window_s`` (the newest ``kept`` of them at most).

    A busy broker sees a key with every Acquire the client library sends: a day of them
    is hundreds of thousands of records. They are kept in chunks of ``CHUNK``, oldest
    first; a full chunk is frozen, pickled and compressed once (about a tenth of the
    memory, and a snapshot copies its bytes instead of pickling every decision again).
    What changes in a record after its chunk froze (the answer of a request that was
    queued, a withdrawal) is kept beside it. A chunk is dropped once its newest record
    is past the window; until then a lookup still ignores the records past it, so the
    window is exact. The oldest chunk is also dropped once the rest still hold ``kept``
    records: between ``kept`` and ``kept + CHUNK`` are held, whatever the traffic, so the
    memory is bounded by the count as well as by the window.
    """

    __slots__ = (
        "_decoded",
        "_frozen",
        "_horizon",
        "_late",
        "_open",
        "_open_no",
        "_unanswered",
        "_where",
        "kept",
        "window_s",
    )

    def __init__(self, window_s: float = KEY_WINDOW_S, kept: int = KEYS_KEPT) -> None:
        self.window_s = window_s
        self.kept = kept
        self._open: list[KeyRecord | None] = []
        """The newest records, oldest first (None: withdrawn)."""
        self._open_no = 0
        self._frozen: dict[int, tuple[bytes, bytes, float]] = {}
        """Chunk number -> (pickled names, compressed pickled records, newest record's time)."""
        self._where: dict[str, int] = {}
        """``campaign NUL key`` -> chunk number * CHUNK + position."""
        self._unanswered: dict[str, KeyRecord] = {}
        """Request id -> its record, while the request waits (the live object)."""
        self._late: dict[int, KeyRecord | None] = {}
        """Position -> its record as changed after its chunk froze (None: withdrawn)."""
        self._horizon = -math.inf
        self._decoded: dict[int, list[KeyRecord | None]] = {}

    # ------------------------------------------------------------------ reading

    def get(self, campaign: str, key: str) -> KeyRecord | None:
        if not key:
            return None
        pos = self._where.get(_name(campaign, key))
        rec = None if pos is None else self._at(pos)
        return rec if rec is not None and rec.at > self._horizon else None

    @property
    def records(self) -> dict[tuple[str, str], KeyRecord]:
        """Every record in the window by (campaign, key), oldest first (a full read)."""
        out = {}
        for pos in sorted(self._where.values()):
            rec = self._at(pos)
            if rec is not None and rec.at > self._horizon:
                out[(rec.campaign, rec.key)] = rec
        return out

    def _at(self, pos: int) -> KeyRecord | None:
        if pos in self._late:
            return self._late[pos]
        no, i = divmod(pos, CHUNK)
        if no == self._open_no:
            return self._open[i]
        return self._chunk(no)[i]

    def _chunk(self, no: int) -> list[KeyRecord | None]:
        got = self._decoded.get(no)
        if got is None:
            got = safe_pickle.loads(zlib.decompress(self._frozen[no][1]))
            if len(self._decoded) >= _DECODED_KEPT:
                del self._decoded[next(iter(self._decoded))]
            self._decoded[no] = got
        return got

    # ------------------------------------------------------------------ writing

    def record(self, e: RequestLease, request_id: str, now: float) -> None:
        """Remember the key of a request just numbered ``request_id`` (none: nothing)."""
        if not e.idempotency_key:
            return
        rec = KeyRecord(e.campaign, e.idempotency_key, request_fingerprint(e), request_id, now)
        name = _name(rec.campaign, rec.key)
        self._where.pop(name, None)  # a record of it past the window, if any
        self._where[name] = self._open_no * CHUNK + len(self._open)
        self._open.append(rec)
        self._unanswered[request_id] = rec
        if len(self._open) == CHUNK:
            names = [None if r is None else _name(r.campaign, r.key) for r in self._open]
            self._frozen[self._open_no] = (
                pickle.dumps(names, pickle.HIGHEST_PROTOCOL),
                zlib.compress(pickle.dumps(self._open, pickle.HIGHEST_PROTOCOL), 1),
                now,
            )
            self._open_no += 1
            self._open = []

    def _changed(self, rec: KeyRecord, to: KeyRecord | None) -> None:
        """``rec`` (answered or withdrawn) as it now stands, wherever its chunk is."""
        name = _name(rec.campaign, rec.key)
        pos = self._where.get(name)
        cur = None if pos is None else self._at(pos)
        if pos is None or cur is None or cur.request_id != rec.request_id:
            return  # forgotten, and the key maybe taken by a newer request
        no, i = divmod(pos, CHUNK)
        if to is None:
            del self._where[name]
        if no == self._open_no:
            self._open[i] = to
        else:
            self._late[pos] = to

    def answer(self, request_id: str, decision: Decision) -> None:
        """The request got its Granted or Rejected: a retry now gets that."""
        rec = self._unanswered.pop(request_id, None)
        if rec is not None:
            rec.answer = decision
            self._changed(rec, rec)

    def withdraw(self, request_id: str) -> None:
        """A withdrawn request answered nothing: its key is free for the caller's next try."""
        rec = self._unanswered.pop(request_id, None)
        if rec is not None:
            self._changed(rec, None)

    def retune(self, window_s: float, kept: int) -> None:
        """A new window and bound, from the next ``forget`` on."""
        self.window_s = window_s
        self.kept = kept

    def __len__(self) -> int:
        """Records held (in the window or not yet dropped with their chunk)."""
        return len(self._frozen) * CHUNK + len(self._open)

    def forget(self, now: float) -> None:
        """Forget keys older than the window: lookups at once, chunks once wholly past it;
        and the oldest chunks while the rest still hold ``kept`` records."""
        self._horizon = now - self.window_s
        while self._frozen:
            no = next(iter(self._frozen))
            names_bytes, _, newest = self._frozen[no]
            if newest > self._horizon and len(self) - CHUNK < self.kept:
                return
            recs = self._chunk(no)
            del self._frozen[no]
            self._decoded.pop(no, None)
            base = no * CHUNK
            for i, name in enumerate(safe_pickle.loads(names_bytes)):
                if name is not None and self._where.get(name) == base + i:
                    del self._where[name]
                self._late.pop(base + i, None)
                rec = recs[i]
                if rec is not None:
                    live = self._unanswered.get(rec.request_id)
                    if live is not None and live.key == rec.key and live.at == rec.at:
                        del self._unanswered[rec.request_id]

    # ------------------------------------------------------------------ snapshots

    def __getstate__(self) -> tuple[None, dict[str, Any]]:
        # The name index is rebuilt from the chunks' names on load; decoded chunks are a cache.
        return None, {
            "_open": self._open,
            "_open_no": self._open_no,
            "_frozen": self._frozen,
            "_unanswered": self._unanswered,
            "_late": self._late,
            "_horizon": self._horizon,
            "window_s": self.window_s,
            "kept": self.kept,
        }

    def __setstate__(self, state: tuple[None, dict[str, Any]]) -> None:
        # A snapshot from before the window and bound were settings holds neither.
        self.window_s, self.kept = KEY_WINDOW_S, KEYS_KEPT
        for k, v in state[1].items():
            setattr(self, k, v)
        self._decoded = {}
        self._where = {}
        for no, (names_bytes, _, _) in self._frozen.items():
            base = no * CHUNK
            for i, name in enumerate(safe_pickle.loads(names_bytes)):
                if name is not None and not (
                    base + i in self._late and self._late[base + i] is None
                ):
                    self._where.pop(name, None)
                    self._where[name] = base + i
        base = self._open_no * CHUNK
        for i, r in enumerate(self._open):
            if r is not None:
                name = _name(r.campaign, r.key)
                self._where.pop(name, None)
                self._where[name] = base + i

    def __fingerprint_state__(self) -> list[Any]:
        """What two copies must agree on: the records (decoded: pickle's bytes can differ
        where it shared one string object and not another), the changes, the horizon."""
        return [
            self._open_no,
            self._horizon,
            [self._chunk(no) for no in self._frozen],
            self._open,
            self._unanswered,
            self._late,
            sorted(self._where.items()),
        ]


def _name(campaign: str, key: str) -> str:
    return f"{campaign}\0{key}"
