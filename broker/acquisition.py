"""One Acquire call's protocol: submit (or answer a keyed retry), wait, withdraw.

The gRPC service and the simulator both serve Acquire; they differ only in how they wait
(an asyncio future, a virtual-time signal). Everything else is here, once:

1. :meth:`AcquireCall.start` answers a retry with a known idempotency key from the first
   call's record (nothing is submitted), else submits the request and returns its own
   answer: a Granted, a Rejected, or :class:`Waiting` for a queued request;
2. the caller waits for the request's Granted its own way;
3. when the wait ends without one (timeout, the caller gone), :meth:`AcquireCall.withdraw`
   cancels the request (or says the grant won the race), and :meth:`AcquireCall.refusal`
   says why the request was still waiting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bursar.broker import admission
from bursar.broker.decisions import Granted, Queued, Rejected
from bursar.broker.engine import Engine, request_fingerprint
from bursar.broker.errors import RequestError
from bursar.broker.events import CancelRequest, Event, RequestLease
from bursar.broker.outcome import Outcome
from bursar.broker.reasons import Reason

__all__ = ["AcquireCall", "Waiting"]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A request in the queue: the caller waits for its Granted."""

    request_id: str
    queued_at: float
    reason: Reason
    estimated_wait_s: float


class AcquireCall:
    """The protocol of one Acquire against ``submit`` (the shell's way in to the engine)."""

    def __init__(
        self,
        submit: Callable[[Event], Outcome],
        engine: Callable[[], Engine],
        request: RequestLease,
    ) -> None:
        self._submit = submit
        self._engine = engine
        self.request = request
        self.waiting: Waiting | None = None
        self.reserved_at: float | None = None
        """The waiting request's reservation when it was withdrawn, if it held one."""
        self.replayed = False
        """True when the answer came from an earlier call with the same key."""

    def start(self) -> Granted | Rejected | Waiting:
        engine = self._engine()
        req = self.request
        rec = engine.key_record(req.campaign, req.idempotency_key)
        if rec is not None and rec.fingerprint == request_fingerprint(req):
            self.replayed = True
            if isinstance(rec.answer, Granted | Rejected):
                return rec.answer
            p = engine.pending[rec.request_id]
            self.waiting = Waiting(rec.request_id, p.queued_at, p.reason or Reason.POOL_FULL, 0.0)
            return self.waiting
        # A key reused for a different request is refused by the engine's validation.
        own = self._submit(req).own
        if isinstance(own, Granted | Rejected):
            return own
        assert isinstance(own, Queued), own
        self.waiting = Waiting(own.request_id, own.at, own.reason, own.estimated_wait_s)
        return self.waiting

    def withdraw(self, at: float) -> bool:
        """Cancel the waiting request. False if it was granted first (the shell has heard
        the Granted through its listener, and holds it if the lease is still live)."""
        assert self.waiting is not None
        rid = self.waiting.request_id
        engine = self._engine()
        if rid not in engine.pending:
            return False
        # A reservation is the best estimate of when it would have been served.
        self.reserved_at = engine.reservation(rid)
        try:
            self._submit(CancelRequest(at=at, request_id=rid))
        except RequestError:
            return False  # granted while the clock caught up to ``at``
        return rid not in self._engine().leases

    def live(self, grant: Granted | None) -> Granted | None:
        """``grant`` if its lease is still live (a grant that raced with the withdrawal)."""
        return grant if grant is not None and grant.lease_id in self._engine().leases else None

    def refusal(self, at: float, min_retry_s: float) -> tuple[Reason, float, float]:
        """(why it still waited, retry after, seconds waited) for a withdrawn request."""
        assert self.waiting is not None
        w = self.waiting
        waited = at - w.queued_at
        p = self._engine().pending.get(w.request_id)
        reason = p.reason if p is not None and p.reason else w.reason
        if self.reserved_at is not None and math.isfinite(self.reserved_at):
            return reason, admission.retry_after(min_retry_s, self.reserved_at - at), waited
        return reason, admission.retry_after(min_retry_s, w.estimated_wait_s - waited), waited
