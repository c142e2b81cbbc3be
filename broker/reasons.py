"""Reason codes: why a request was queued or refused. Each has a sentence a person can act on."""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    # Identity hash: members are singletons, and Enum's own hash runs Python code on every
    # dict or set look-up (the engine keys its indexes and memos with them).
    __hash__ = object.__hash__

    ABOVE_BURST = "ABOVE_BURST"
    BUCKET_EMPTY = "BUCKET_EMPTY"
    GUARANTEE_RESERVED = "GUARANTEE_RESERVED"
    POOL_FULL = "POOL_FULL"
    HEAD_OF_LINE = "HEAD_OF_LINE"
    LEASE_PREEMPTING = "LEASE_PREEMPTING"
    DEADLINE_UNREACHABLE = "DEADLINE_UNREACHABLE"

    @property
    def explanation(self) -> str:
        return _TEXT[self]


_TEXT = {
    Reason.ABOVE_BURST: "the campaign would hold more than its burst ceiling; wait for its own "
    "leases to end or ask for less",
    Reason.BUCKET_EMPTY: "the campaign's token bucket cannot prepay the part above its sustained "
    "rate for the whole duration; ask for less or shorter, or wait for the bucket to refill",
    Reason.GUARANTEE_RESERVED: "the free capacity is reserved for other campaigns' unmet guarantees",
    Reason.POOL_FULL: "no path (warm, reclaim, cold) has enough capacity right now",
    Reason.HEAD_OF_LINE: "capacity is reserved for a request that has waited past the "
    "head-of-line patience, and this lease would still hold it when that reservation starts; "
    "ask for less or shorter, or wait (a lease whose renewal is refused so ends at its "
    "expiry)",
    Reason.LEASE_PREEMPTING: "the lease is being reclaimed and cannot be renewed",
    Reason.DEADLINE_UNREACHABLE: "no allocation up to the intent's max meets its deadline in any "
    "of its modes, and its value past the deadline is nothing; ask with a later deadline, less "
    "work or a larger max, or with a decay that leaves value past the deadline",
}
