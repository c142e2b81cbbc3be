"""Renewal: a lease's extension, checked as a request is (``admission``'s checks, on the
extension), then charged, pushed out and answered.

A renewal goes through the same checks as a request, in the same order, on the
extension only: the campaign's burst (its other holdings plus this lease), then the
reservations (an extension that would push one later is refused, unless the campaign is
within its guarantee, the lease is preemptible, the policy lets renewals push, or the
lease is an admitted deadline lease before its deadline), then the bucket over the
extension. A lease that is draining for a reclaim is not renewed. Part of the engine's
fold (``Engine.apply`` calls ``renew`` for a ``Renew``): it reads and changes the
engine's state as the engine's own handlers do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bursar.broker import admission, dims, power_checks, reservation_cut, rule_inputs
from bursar.broker import elastic_fold as fold
from bursar.broker.decisions import Decision, Rejected, Renewed
from bursar.broker.events import Renew
from bursar.broker.lease import Lease, LeaseState, Segment
from bursar.broker.reasons import Reason
from bursar.broker.timers import TimerKind

if TYPE_CHECKING:
    from bursar.broker.engine import Engine


def renew(eng: Engine, e: Renew) -> Decision | None:
    ls = eng.leases.get(e.lease_id)
    if ls is None:
        return None  # revoked while the clock advanced to this event; see _on_release

    c = eng.campaigns[ls.campaign]
    if ls.state is LeaseState.PREEMPTING:
        wait = (ls.preempt_deadline or eng.now) - eng.now
        return _reject(
            eng, ls, Reason.LEASE_PREEMPTING, admission.retry_after(eng.policy.min_retry_s, wait)
        )
    new_end = max(ls.expires_at, eng.now + e.duration_s)
    ext = new_end - ls.expires_at
    others = dims.sub(c.held, ls.size)
    rate = admission.token_need(others, ls.size, c.sustained)
    inputs = rule_inputs.inputs(eng, c, ls.size)
    # The same checks as a request's (``_try``), on the extension: burst, then the
    # reservations (a renewal has no path to find), then the bucket over the extension.
    refused = admission.burst_refusal(others, ls.size, c.burst_bound)
    if refused is not None:
        return _reject(eng, ls, refused.reason, eng.policy.min_retry_s, inputs)
    pushes = (
        ext > 0
        and not ls.preemptible
        and not eng.policy.renewals_push_reservations
        and not dims.fits(c.held, c.guarantee)
    )
    promise = fold.deadline_promise(eng, ls.id) if pushes else None
    if promise is not None:
        # An admitted deadline lease before its deadline is renewed whatever it pushes:
        # admission control counted its capacity to its deadline (the promise it gave).
        inputs = {**inputs, "deadline_promise": promise}
    elif pushes:
        # The extension is an admission decision too: it may not push a reservation
        # later (the lease's capacity was counted as returning at its old expiry).
        # Leases of a campaign within its guarantee hold their own share and are exempt,
        # and a policy may let every renewal push (``renewals_push_reservations``).
        eng._cut.stale()
        profile = reservation_cut.build(eng)
        refused = None
        if profile is not None and not profile.admits(ls.size, ls.expires_at, new_end):
            refused = admission.reservations_refusal(r.at for r in profile.reservations.values())
        elif profile is not None:
            refused = power_checks.renewal(eng, ls, new_end, profile)
        if refused is not None:
            first = refused.details["reserved_from"]
            retry = admission.retry_after(eng.policy.min_retry_s, first - eng.now)
            return _reject(eng, ls, refused.reason, retry, {**inputs, **refused.details})
    refused = admission.bucket_refusal(
        admission.bucket_short(c.buckets, c.held, rate, ext, eng.now, eng.policy.enforcement)
    )
    if refused is not None:
        inputs = {**inputs, **refused.details}
        wait = eng.ledger.bucket_wait(c, rate, ext, eng.now)
        return _reject(eng, ls, refused.reason, wait, inputs)
    if eng.watts.leased:
        # Its watts are held already (a renewal adds none): only the joules of the extension.
        refused = eng.watts.renewal_refusal(ls.id, ext, eng.now, eng.policy.enforcement)
        if refused is not None:
            inputs = {**inputs, **refused.details}
            return _reject(eng, ls, refused.reason, eng.policy.min_retry_s, inputs)
    price = eng.ledger.price()
    credit_rate = eng.ledger.credit_rate(price, ls.size)
    tokens, credits = eng.ledger.charge(c, rate, credit_rate, ext, eng.now)
    if ext > 0:
        ls.segments.append(Segment(ls.expires_at, new_end, rate, credit_rate))
        eng.watts.renewed(ls.id, ls.expires_at, new_end, eng.now, eng.policy.enforcement)
    eng.ledger.firm_renewed(ls, new_end)
    eng._charge_usage(c, ls.size, ls.expires_at, new_end, +1)
    eng.queue.rekey(c.spec.name)
    eng._cut.stale()
    ls.expires_at = new_end
    eng.timers.push(new_end, TimerKind.EXPIRE, ls.id)
    if eng.elastic.by_lease and ls.id in eng.elastic.by_lease:
        more_tokens, more_credits = fold.renew_extents(eng, eng.elastic.by_lease[ls.id], new_end)
        tokens += more_tokens
        credits += more_credits
    return eng._emit(
        Renewed(eng.now, ls.id, ls.campaign, new_end, tokens, credits, {**inputs, "price": price})
    )


def _reject(
    eng: Engine, ls: Lease, reason: Reason, retry_after: float, *inputs: dict[str, Any]
) -> Decision:
    """Refuse the renewal of ``ls``: it keeps its old expiry."""
    return eng._emit(Rejected(eng.now, ls.id, ls.campaign, reason, retry_after, *inputs))
