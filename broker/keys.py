"""Idempotency keys: what each keyed Acquire asked for and how it was answered.

A retry that carries the same key within ``KEY_WINDOW_S`` gets the first call's answer
instead of a second lease. ``Keys`` holds the records by (campaign, key), oldest first,
and, while a request is still unanswered (queued), by request id too.
"""

from __future__ import annotations

from dataclasses import dataclass

from bursar.broker.codec import dumps, plain
from bursar.broker.decisions import Decision
from bursar.broker.events import RequestLease

KEY_WINDOW_S = 86_400.0
"""How long an Acquire's idempotency key is remembered (seconds): a retry within this
window returns the first call's answer instead of a second lease."""


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
    """What makes two Acquires the same request: size, shape, duration, class and labels
    (not the wait, which a retry after a lost reply shortens)."""
    what = {
        "size": {d: float(x) for d, x in sorted(e.size.items()) if x},
        "duration_s": float(e.duration_s),
        "lease_class": e.lease_class.value if e.lease_class is not None else None,
        "labels": dict(sorted(e.labels.items())),
    }
    if e.shape is not None:
        what["shape"] = e.shape
    return dumps(plain(what))


class Keys:
    """The keys seen in the last ``KEY_WINDOW_S``."""

    __slots__ = ("_unanswered", "records")

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], KeyRecord] = {}
        """By (campaign, key), oldest first."""
        self._unanswered: dict[str, KeyRecord] = {}

    def get(self, campaign: str, key: str) -> KeyRecord | None:
        return self.records.get((campaign, key)) if key else None

    def record(self, e: RequestLease, request_id: str, now: float) -> None:
        """Remember the key of a request just numbered ``request_id`` (none: nothing)."""
        if e.idempotency_key:
            rec = KeyRecord(e.campaign, e.idempotency_key, request_fingerprint(e), request_id, now)
            self.records[(rec.campaign, rec.key)] = rec
            self._unanswered[request_id] = rec

    def answer(self, request_id: str, decision: Decision) -> None:
        """The request got its Granted or Rejected: a retry now gets that."""
        rec = self._unanswered.pop(request_id, None)
        if rec is not None:
            rec.answer = decision

    def withdraw(self, request_id: str) -> None:
        """A withdrawn request answered nothing: its key is free for the caller's next try."""
        rec = self._unanswered.pop(request_id, None)
        if rec is not None:
            self.records.pop((rec.campaign, rec.key), None)

    def forget(self, now: float) -> None:
        """Drop keys older than the window (the oldest come first)."""
        horizon = now - KEY_WINDOW_S
        while self.records:
            k, rec = next(iter(self.records.items()))
            if rec.at > horizon:
                return
            del self.records[k]
            if self._unanswered.get(rec.request_id) is rec:
                del self._unanswered[rec.request_id]
