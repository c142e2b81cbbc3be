"""``bursar explain ID``: why a request waits, or how a lease is doing or ended, in plain
words, composed from what the broker already answers: the queue (ListPending: the reason
and the reservation), the supply signals (what the campaign holds, its headroom to the
burst ceiling, its bucket, the pool's free and reserved capacity), the lease itself
(GetLease, live or ended) and the journal's decisions about it (ListDecisions).

The words are made by pure functions of those answers (:func:`why_waiting`,
:func:`how_lease`, :func:`never_granted`); the command only fetches and prints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import click

from bursar.cli.client import (
    CONTEXT,
    broker_client,
    campaign_option,
    connection_options,
    fail,
    options,
    print_json,
    run_call,
)
from bursar.cli.console import human_duration
from bursar.cli.verbs import at
from bursar.providers.client import (
    DecisionKind,
    DecisionRecord,
    Lease,
    LeaseState,
    NotFound,
    PendingRequest,
    Supply,
)

__all__ = ["REASONS", "explain_command", "how_lease", "never_granted", "why_waiting"]

REASONS: Mapping[str, str] = {
    "ABOVE_BURST": "its campaign would hold more than its burst ceiling; it waits for the "
    "campaign's own leases to end (or ask for less)",
    "BUCKET_EMPTY": "its campaign's token bucket cannot prepay the part above the sustained "
    "rate for the whole duration; it waits for the bucket to refill (or ask for less or "
    "shorter)",
    "GUARANTEE_RESERVED": "the free capacity is kept for other campaigns' unmet guarantees",
    "POOL_FULL": "no path (warm, reclaim or cold) has enough capacity now",
    "HEAD_OF_LINE": "an older request has waited past the head-of-line patience and has "
    "first claim on the capacity that frees up",
    "LEASE_PREEMPTING": "the lease is being reclaimed and cannot be renewed",
    "DEADLINE_UNREACHABLE": "its deadline cannot be met by any allocation up to its max",
}
"""Each reason a request waits (or is refused), as a person would say it."""


def _size(size: Mapping[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in sorted(size.items())) or "nothing"


def _reason(code: Any) -> str:
    return REASONS.get(code.value, code.value.lower().replace("_", " "))


def _binding(p: PendingRequest, supply: Supply) -> list[str]:
    """The figures behind the reason: the envelope or pool numbers that bind."""
    reason = p.reason.value
    mine = supply.campaigns.get(p.campaign)
    out = []
    for dim, asked in sorted(p.size.items()):
        if asked <= 0:
            continue
        if reason == "ABOVE_BURST" and mine is not None and dim in mine.headroom_to_burst:
            held = mine.held.get(dim, 0.0)
            burst = held + mine.headroom_to_burst[dim]
            if held + asked > burst:
                out.append(f"burst ceiling {dim}={burst:g}: holding {held:g}, asking {asked:g}")
        elif reason == "BUCKET_EMPTY" and mine is not None:
            level = mine.bucket.get(dim)
            if level is not None and math.isfinite(level):
                out.append(
                    f"token bucket {dim}: {level:g} unit-s left, holding "
                    f"{mine.held.get(dim, 0.0):g}, asking {asked:g} for "
                    f"{human_duration(p.duration_s)}"
                )
        elif reason in ("GUARANTEE_RESERVED", "POOL_FULL") and dim in supply.dims:
            d = supply.dims[dim]
            out.append(
                f"pool {dim}: {d.warm_free:g} free on powered nodes of {d.capacity:g}, "
                f"{d.reserve:g} of them kept for unmet guarantees; {d.reclaimable:g} "
                f"reclaimable, {d.cold:g} on cold nodes; asking {asked:g}"
            )
    return out


def why_waiting(p: PendingRequest, supply: Supply, now: float) -> list[str]:
    """Why the request ``p`` waits, the figures that bind, and when it may start."""
    lines = [
        f"request {p.request_id} ({p.campaign}) for {_size(p.size)}, "
        f"{human_duration(p.duration_s)}, is waiting: {_reason(p.reason)}."
    ]
    lines += [f"  {b}" for b in _binding(p, supply)]
    lines.append(
        f"It has waited {human_duration(p.waited_s)} and is number {p.position} in the "
        "admission order."
    )
    if p.reserved_at is not None:
        lines.append(
            f"It holds a reservation: the capacity is due {at(p.reserved_at, now)} (an "
            "estimate, from the leases' expiries)."
        )
    elif math.isfinite(p.estimated_wait_s):
        lines.append(
            f"Estimated start: {at(now + p.estimated_wait_s, now)}; an estimate, not a "
            "promise (it holds no reservation: only requests past the head-of-line "
            "patience do)."
        )
    return lines


def _ended(lease: Lease) -> str:
    when = at(lease.ended_at or 0.0)
    cause = lease.end_cause
    if lease.state is LeaseState.RELEASED:
        return f"released by its holder at {when}"
    if lease.state is LeaseState.EXPIRED:
        return f"expired at {when}: it ran to its end without being renewed"
    if cause == "reclaimed":
        return (
            f"preempted at {when}: reclaimed for another campaign after its grace period "
            "(a preemptible lease)"
        )
    return f"revoked at {when}: {cause or 'by the broker'}"


def _history(decisions: Sequence[DecisionRecord]) -> list[str]:
    renewed = sum(d.kind is DecisionKind.RENEW for d in decisions)
    refused = [d for d in decisions if d.kind is DecisionKind.REJECT]
    out = []
    if renewed:
        out.append(f"It was renewed {renewed} time{'s' * (renewed != 1)}.")
    if refused:
        last = refused[-1]
        out.append(
            f"{len(refused)} renewal{'s were' if len(refused) != 1 else ' was'} refused, "
            f"the last at {at(last.at)}: {_reason(last.reason)}."
        )
    return out


def how_lease(lease: Lease, now: float, decisions: Sequence[DecisionRecord] = ()) -> list[str]:
    """How the lease is doing (live) or how and when it ended."""
    head = f"lease {lease.id} ({lease.campaign}) for {_size(lease.size)}"
    granted = f"granted {at(lease.granted_at, now)} on the {lease.path.value.lower()} path"
    if lease.ended:
        held = human_duration((lease.ended_at or lease.granted_at) - lease.granted_at)
        lines = [
            f"{head} was {_ended(lease)}.",
            f"It had been granted {at(lease.granted_at)} on the "
            f"{lease.path.value.lower()} path, and held for {held}.",
        ]
    elif lease.state is LeaseState.PREEMPTING:
        lines = [
            f"{head} is being reclaimed for another campaign: drain now; it is revoked "
            f"{at(lease.preempt_deadline or now, now)}.",
            f"It was {granted}.",
        ]
    else:
        nodes = ",".join(lease.nodes) or "no node yet"
        lines = [
            f"{head} is {lease.state.value.lower()} on {nodes}; it expires "
            f"{at(lease.expires_at, now)} unless renewed.",
            f"It was {granted}.",
        ]
        if lease.state is LeaseState.STARTING:
            lines.append(f"It becomes usable {at(lease.starts_at, now)}.")
    return lines + _history(decisions)


def never_granted(request_id: str, decisions: Sequence[DecisionRecord]) -> list[str]:
    """A request the journal knows that never became a lease: how it went."""
    lines = [f"request {request_id} was never granted:"]
    for d in decisions:
        kind = d.kind.value.lower()
        why = f": {_reason(d.reason)}" if d.reason.value != "UNSPECIFIED" else ""
        word = {"queue": "queued", "reject": "refused", "cancelled": "withdrawn"}.get(kind, kind)
        lines.append(f"  {word} at {at(d.at)}{why}")
    return lines


@click.command("explain", context_settings=CONTEXT)
@click.argument("request_id", metavar="ID")
@campaign_option
@connection_options
def explain_command(request_id: str) -> None:
    """Why request ID waits, or how lease ID is doing or how it ended, in plain words.

    For a waiting request: its reason, the figure that binds (e.g. "burst ceiling
    gpu=24: holding 16, asking 16"), its place in the queue and its reservation or
    estimated start. For a lease: its state and expiry, or how it ended (released,
    expired, revoked, preempted) and when, with its renewals. A campaign token sees its
    own campaign's requests and leases; the admin token any.

    \b
    Examples:
      bursar explain L42 --token-file state/tokens.json --campaign storm
      bursar explain L42 --admin-token-file state/admin.token --json
    """
    o = options()

    async def go() -> dict[str, Any] | None:
        async with broker_client(o) as client:
            now = (await client.status()).now
            waiting = await client.list_pending(request_id=request_id)
            if waiting:
                p = waiting[0]
                supply = await client.supply()
                return {
                    "id": request_id,
                    "status": "waiting",
                    "explanation": why_waiting(p, supply, now),
                    "request": p.to_json(),
                }
            try:
                lease = await client.get_lease(request_id)
            except NotFound:
                lease = None
            decisions = await client.list_decisions(lease_id=request_id)
            if lease is None and not decisions:
                return None
            if lease is None:
                return {
                    "id": request_id,
                    "status": "never granted",
                    "explanation": never_granted(request_id, decisions),
                }
            return {
                "id": request_id,
                "status": "ended" if lease.ended else "live",
                "explanation": how_lease(lease, now, decisions),
                "lease": lease.to_json(),
            }

    out = run_call(go)
    if out is None:
        fail(
            NotFound(
                f"no request or lease {request_id!r}: nothing waits under that id and the "
                "broker never granted it",
                reason="NOT_FOUND",
            )
        )
    if o.json:
        print_json(out)
    else:
        click.echo("\n".join(out["explanation"]))
