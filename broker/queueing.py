"""Queueing: what becomes of a request the checks refused, and of one that leaves the
queue.

A blocking request queues with the reason it waits for and its expected wait (for the
reservations, the earliest start they leave it); a non-blocking one is rejected with a
retry-after. Only a request waiting for the pool counts as demand on the pool (it raises
the price); one waiting on its own campaign's burst or bucket does not, and one waiting
for its bucket is looked at again when the bucket will cover it (``schedule_wake``).
Part of the engine's fold.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from bursar.broker import admission, pool_side, rule_inputs
from bursar.broker.decisions import Decision, Queued, Rejected
from bursar.broker.reasons import Reason

if TYPE_CHECKING:
    from bursar.broker.engine import Engine
    from bursar.broker.pending import Pending


def refuse(eng: Engine, p: Pending, reason: Reason, details: dict[str, Any]) -> Decision:
    """``p`` may not be granted now, for ``reason``: a blocking request queues (with its
    expected wait), a non-blocking one is rejected (with its retry-after)."""
    inputs = {**rule_inputs.inputs(eng, eng.campaigns[p.campaign], p.size), **details}
    c = eng.campaigns[p.campaign]
    wait = eng.ledger.estimate_wait(c, p.size, p.duration_s, reason, eng.now)
    if reason is Reason.HEAD_OF_LINE and eng._cut.fresh and eng._cut.profile is not None:
        # Waiting for the reservations: the earliest start they leave it.
        at = eng._cut.profile.earliest(p.size, p.duration_s, c.unmet, eng.now)
        if not math.isinf(at):
            wait = at - eng.now
    if not p.blocking:
        retry = admission.retry_after(eng.policy.min_retry_s, wait)
        reject = eng._emit(Rejected(eng.now, p.id, p.campaign, reason, retry, inputs))
        eng.idempotency.answer(p.id, reject)
        if eng.elastic.waiting:
            eng.elastic.waiting.pop(p.id, None)
        return reject
    eng.queue.add(p)
    set_reason(eng, p, reason)
    if reason is Reason.BUCKET_EMPTY:
        schedule_wake(eng, p)
    return eng._emit(Queued(eng.now, p.id, p.campaign, reason, wait, inputs))


def set_reason(eng: Engine, p: Pending, reason: Reason) -> None:
    """Record why ``p`` waits. Only demand the pool cannot serve is congestion: a
    request waiting on its own campaign's burst or bucket does not raise the price."""
    eng.queue.set_reason(p, reason, eng.now)
    count = reason in admission.POOL_REASONS
    if not count and eng._cut.profile is not None and p.id in eng._cut.profile.reservations:
        # A holder now waits on its own campaign's limits: it holds no reservation.
        eng._cut.stale()
    if count != p.counted:
        p.counted = count
        eng.ledger.add_demand(eng.campaigns[p.campaign], p.size, +1 if count else -1)


def unqueue(eng: Engine, p: Pending) -> None:
    """Take ``p`` out of the queue (granted or cancelled); the next one heads it."""
    eng.queue.remove(p)
    if p.counted:
        p.counted = False
        eng.ledger.add_demand(eng.campaigns[p.campaign], p.size, -1)


def schedule_wake(eng: Engine, p: Pending) -> None:
    """``p`` waits for its campaign's bucket: look at its queue again when the bucket
    will cover it."""
    c = eng.campaigns[p.campaign]
    rate = admission.token_need(c.held, p.size, c.sustained)
    # The tokens must cover the span the lease would be charged for: its duration plus
    # the start delay of the path that would serve it now.
    limit, cold_avail = pool_side.capacity_for(eng, c)
    plan = eng.placement.plan(
        p, limit, cold_avail, c.spec.preemptible, eng.ledger.reclaimable_for(c)
    )
    delay = pool_side.start_delay(eng, plan) if plan is not None else 0.0
    at = eng.now + eng.ledger.bucket_wait(c, rate, p.duration_s + delay, eng.now)
    eng.queue.wake_by(p.campaign, at)
